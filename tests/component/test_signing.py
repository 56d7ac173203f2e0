"""Signing and verifying model versions (registry/signing.py), with keys and certificates made here.

No network: EC P-256 keys and a small CA are generated with ``cryptography``; the keyless path's
identity policy is checked on a certificate shaped like Fulcio's.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pipelines.promote.environments import environment
from pipelines.storage import open_store
from registry.errors import UsageError
from registry.k8s_annotations import PREFIX, annotation_key, model_annotations
from registry.settings import Settings
from registry.signing import (
    SIGNATURE_FILE,
    SignatureError,
    SigningKey,
    Trust,
    TrustedIdentity,
    _IdentityPolicy,
    claimed_identity,
    compare,
    key_fingerprint,
    parse_trust,
    sign,
    signed_files,
    verify,
)

ROOT = Path(__file__).resolve().parents[2]
FILES = {"model.py": "a" * 64, "data/weights.bin": "b" * 64, "config.pbtxt": "c" * 64}


def _key(folder: Path, name: str) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    (folder / f"{name}.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (folder / f"{name}.pub").write_bytes(_public_pem(key))
    return key


def _public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    _key(folder, "trusted")
    _key(folder, "other")
    return folder


@pytest.fixture(scope="module")
def bundle(keys: Path) -> bytes:
    return sign(FILES, SigningKey(keys / "trusted.pem"), "some_model")


def _trust(keys: Path, *names: str, mode: str = "required") -> Trust:
    return Trust(mode, tuple(keys / f"{n}.pub" for n in names))


def test_a_signature_over_the_manifest_verifies_with_the_trusted_key(keys: Path, bundle: bytes) -> None:
    signed = verify(bundle, FILES, _trust(keys, "other", "trusted"), "m v1")
    fingerprint = key_fingerprint((keys / "trusted.pub").read_bytes())[:16]
    assert signed.identity == f"key {fingerprint} (trusted.pub)"
    assert signed.method == "key"
    assert signed.files == FILES


def test_the_bundle_is_an_openssf_model_signing_dsse_in_toto_statement(bundle: bytes) -> None:
    import base64

    envelope = json.loads(bundle)["dsseEnvelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    assert {r["name"]: r["digest"] for r in statement["predicate"]["resources"]} == FILES


def test_the_model_name_inside_the_signature_binds_nothing(keys: Path) -> None:
    """Signed as another model's name, the same files verify: only the digests bind."""
    other_name = sign(FILES, SigningKey(keys / "trusted.pem"), "a_name_the_signer_chose")
    assert verify(other_name, FILES, _trust(keys, "trusted"), "m v1").files == FILES


def test_an_unsigned_version_is_refused_naming_it(keys: Path) -> None:
    with pytest.raises(SignatureError, match=r"^m v2 is not signed") as info:
        verify(None, FILES, _trust(keys, "trusted"), "m v2")
    assert info.value.message == "m v2 is not signed"
    assert "mlreg sign" in str(info.value.fix)


def test_an_untrusted_key_is_refused_naming_it(keys: Path, bundle: bytes) -> None:
    fingerprint = key_fingerprint((keys / "trusted.pub").read_bytes())[:16]
    with pytest.raises(SignatureError, match=rf"^m v1 is signed by key {fingerprint}, which is not trusted"):
        verify(bundle, FILES, _trust(keys, "other"), "m v1")


def test_a_changed_file_is_refused_naming_it(keys: Path, bundle: bytes) -> None:
    changed = {**FILES, "data/weights.bin": "d" * 64}
    with pytest.raises(SignatureError, match="data/weights.bin changed since signing") as info:
        verify(bundle, changed, _trust(keys, "trusted"), "m v1")
    assert info.value.context["files"] == ["data/weights.bin"]


def test_an_unsigned_extra_file_and_a_missing_one_are_refused() -> None:
    found = {**FILES, "extra.py": "e" * 64}
    del found["model.py"]
    assert compare(FILES, found) == ["extra.py is not signed", "model.py is signed but missing"]


def test_a_forged_payload_does_not_verify(keys: Path, bundle: bytes) -> None:
    import base64

    doc = json.loads(bundle)
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "f" * 64
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(SignatureError, match="which is not trusted"):
        verify(json.dumps(doc).encode(), FILES, _trust(keys, "trusted"), "m v1")


def _ca(folder: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlreg test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    (folder / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _leaf(folder: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> None:
    key = _key(folder, "leaf")
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "release-bot")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "leaf.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def test_a_certificate_signature_verifies_against_its_ca(tmp_path: Path) -> None:
    ca_key, ca = _ca(tmp_path)
    _leaf(tmp_path, ca_key, ca)
    signer = SigningKey.of(str(tmp_path / "leaf.pem"), str(tmp_path / "leaf.crt"), str(tmp_path / "ca.crt"))
    assert signer is not None
    assert signer.method == "certificate"
    made = sign(FILES, signer, "m")
    assert claimed_identity(made) == "certificate CN=release-bot"
    signed = verify(made, FILES, Trust("required", (tmp_path / "ca.crt",)), "m v1")
    assert signed.method == "certificate"
    assert signed.identity == "CA ca.crt: certificate CN=release-bot"


def test_a_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    ca_key, ca = _ca(tmp_path)
    _leaf(tmp_path, ca_key, ca)
    made = sign(FILES, SigningKey(tmp_path / "leaf.pem", tmp_path / "leaf.crt", (tmp_path / "ca.crt",)), "m")
    other = tmp_path / "other"
    other.mkdir()
    _ca(other)
    with pytest.raises(SignatureError, match=r"signed by certificate CN=release-bot, which is not"):
        verify(made, FILES, Trust("required", (other / "ca.crt",)), "m v1")


def _fulcio_like(subject: str, issuer: str) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_der = b"\x0c" + bytes([len(issuer)]) + issuer.encode()  # DER UTF8String (Fulcio's V2)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sigstore-intermediate")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(minutes=10))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(subject)]), critical=True)
        .add_extension(
            x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8"), issuer_der),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )


GITHUB = "https://token.actions.githubusercontent.com"
WORKFLOW = "https://github.com/acme/models/.github/workflows/promote.yml@refs/heads/main"


def test_the_keyless_identity_policy_matches_issuer_and_subject_regex() -> None:
    from sigstore.errors import VerificationError

    policy = _IdentityPolicy(
        (TrustedIdentity(GITHUB, r"https://github\.com/acme/models/\.github/workflows/.*"),)
    )
    policy.verify(_fulcio_like(WORKFLOW, GITHUB))
    with pytest.raises(VerificationError, match="is not a trusted identity"):
        policy.verify(_fulcio_like("https://github.com/evil/models/.github/workflows/x.yml@main", GITHUB))
    with pytest.raises(VerificationError, match="is not a trusted identity"):
        policy.verify(_fulcio_like(WORKFLOW, "https://accounts.example.com"))


def test_a_subject_regex_must_match_the_whole_identity() -> None:
    identity = TrustedIdentity(GITHUB, r"https://github\.com/acme/.*")
    assert identity.matches(GITHUB, [WORKFLOW])
    assert not identity.matches(GITHUB, [f"https://evil.example/?{WORKFLOW}"])


def test_parse_trust_reads_modes_keys_and_identities(tmp_path: Path, keys: Path) -> None:
    (tmp_path / "keys").mkdir()
    shutil.copy(keys / "trusted.pub", tmp_path / "keys" / "release.pub")  # a real public key: checked
    raw = {
        "signatures": "required",
        "trusted_keys": ["keys/release.pub"],
        "trusted_identities": [{"issuer": GITHUB, "subject": "https://github.com/acme/.*"}],
    }
    trust = parse_trust("mlreg.toml [environments.prod]", raw, tmp_path)
    assert trust == Trust(
        "required",
        (tmp_path / "keys" / "release.pub",),
        (TrustedIdentity(GITHUB, "https://github.com/acme/.*"),),
    )
    assert parse_trust("x", {}, tmp_path) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"signatures": "sometimes", "trusted_keys": []}, 'signatures must be "required" or "warn"'),
        ({"signatures": "required"}, "trusts nobody"),
        ({"signatures": "warn", "trusted_keys": ["missing.pub"]}, "trusted key 'missing.pub' is not a file"),
        ({"signatures": "warn", "trusted_keys": "a.pub"}, "trusted_keys must be a list"),
        ({"signatures": "warn", "trusted_identities": [{"issuer": GITHUB}]}, "needs issuer and subject"),
        (
            {"signatures": "warn", "trusted_identities": [{"issuer": GITHUB, "subject": "("}]},
            "is not a regex",
        ),
        ({"trusted_keys": ["a.pub"]}, "need signatures"),
    ],
)
def test_parse_trust_refuses_what_it_cannot_use(tmp_path: Path, raw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_trust("mlreg.toml [environments.prod]", raw, tmp_path)


def test_an_environment_reads_its_signature_policy_from_mlreg_toml(tmp_path: Path, keys: Path) -> None:
    shutil.copy(keys / "trusted.pub", tmp_path / "release.pub")
    (tmp_path / "mlreg.toml").write_text(
        '[environments.prod]\nstore = "s3://b/p"\ntargets = ["t:8001"]\n'
        'signatures = "warn"\ntrusted_keys = ["release.pub"]\n'
    )
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    assert environment(settings, "prod").signatures == Trust("warn", (tmp_path / "release.pub",))
    assert environment(settings, "local").signatures is None  # absent: today's behaviour


def test_signing_key_options(tmp_path: Path, keys: Path) -> None:
    assert SigningKey.of(None) is None
    assert SigningKey.of("sigstore") == SigningKey(keyless=True)
    assert SigningKey.of(str(keys / "trusted.pem")) == SigningKey(keys / "trusted.pem")
    with pytest.raises(UsageError, match="is not a file"):
        SigningKey.of(str(tmp_path / "nope.pem"))


def test_signing_with_a_key_that_is_not_ec_says_so(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "rsa.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(SignatureError, match="cannot sign m with key .*rsa.pem"):
        sign(FILES, SigningKey(tmp_path / "rsa.pem"), "m")


def test_signed_files_add_the_registered_config() -> None:
    manifest = {"model.py": {"sha256": "a" * 64, "size": 3}}
    assert signed_files(manifest, "c" * 64) == {"model.py": "a" * 64, "config.pbtxt": "c" * 64}
    assert signed_files(manifest, None) == {"model.py": "a" * 64}


def test_the_store_does_not_take_the_signature_for_an_unregistered_file(tmp_path: Path) -> None:
    version = tmp_path / "src" / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text("x = 1\n")
    store = open_store(tmp_path / "repo")
    store.versions.put_version("m", "1", version)
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b"{}")
    store.objects.write("m/1/extra.py", b"y = 2\n")
    problems = [p.file for p in store.versions.check_version("m", "1").problems]
    assert problems == ["extra.py"]


def test_annotations_name_the_served_version_and_its_signature() -> None:
    tags = {"artifact_digest": "d" * 64, "signed_by": "key abcd"}
    found = model_annotations("image_model", "3", tags, "run1", "staging")
    assert found == {
        f"{PREFIX}image_model.version": "3",
        f"{PREFIX}image_model.environment": "staging",
        f"{PREFIX}image_model.digest": "sha256:" + "d" * 64,
        f"{PREFIX}image_model.signature": "runs:/run1/signature.sigstore.json",
        f"{PREFIX}image_model.signed-by": "key abcd",
    }
    unsigned = model_annotations("m", "1", {}, "run2", "staging")
    assert unsigned[f"{PREFIX}m.signature"] == "unsigned"
    long_name = "x" * 70
    assert len(annotation_key(long_name, "signed-by").removeprefix(PREFIX)) <= 63
    assert annotation_key(long_name, "version") != annotation_key(long_name + "y", "version")


def test_the_annotation_patch_applies_to_the_triton_deployment_without_touching_pods(tmp_path: Path) -> None:
    """kubectl client-side, no cluster: the patch changes metadata.annotations only."""
    assert shutil.which("kubectl"), "kubectl is missing: .ci/system-deps.sh installs it (make system-deps)"
    import yaml

    docs = list(yaml.safe_load_all((ROOT / "infra/k8s/base/triton.yaml").read_text()))
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    patch = {
        "metadata": {"annotations": model_annotations("image_model", "3", {"signed_by": "key ab"}, "r", "s")}
    }
    (tmp_path / "patch.json").write_text(json.dumps(patch))
    done = subprocess.run(
        [
            "kubectl",
            "patch",
            "--local",
            "--dry-run=client",
            "-f",
            str(tmp_path / "deployment.yaml"),
            "--type",
            "merge",
            "--patch-file",
            str(tmp_path / "patch.json"),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    patched = json.loads(done.stdout)
    assert patched["metadata"]["annotations"][f"{PREFIX}image_model.version"] == "3"
    assert patched["metadata"]["annotations"][f"{PREFIX}image_model.signed-by"] == "key ab"
    assert patched["spec"]["template"] == deployment["spec"]["template"]  # no pod restart


def test_importing_the_signing_module_does_not_import_model_signing() -> None:
    code = "import sys, registry.signing, registry.register; print('model_signing' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"
