"""Signed model versions: who produced a version's bytes, in the OpenSSF Model Signing format.

mlreg's manifest proves a version's bytes are the bytes it registered; a signature proves *who*
registered them.  The signature is a detached Sigstore bundle (a DSSE envelope around an in-toto
statement whose resources are the version's files and their sha256) made by the ``model-signing``
package, over exactly mlreg's manifest: the version folder's files plus an entry ``config.pbtxt``
for the registered config (:data:`registry.manifest.CONFIG_ENTRY`).  It is stored beside the
manifest: ``signature.sigstore.json`` in the version's MLflow run, ``.mlreg-signature.json`` in the
store's version folder.

Signing and verifying reuse the manifest's digests: nothing is hashed again here.  Verification
binds four things: the envelope verifies against a trusted key, certificate authority or keyless
identity; every file digest in the signed statement equals the manifest's; no file of the manifest
is unsigned; nothing signed is missing.  Whoever compares the manifest with the stored bytes (the
store's ``verify_version``) closes the chain.  The model name inside the statement is chosen by the
signer and binds nothing: it is never read.

Three ways to sign: a PEM private key (EC P-256/384/521: tests, air-gapped users), a private key
with its certificate and chain, and Sigstore keyless (the OIDC identity of a GitHub Actions
workflow; it needs Fulcio and Rekor, so it runs only there).  ``model_signing`` (and sigstore) are
imported only when a signature is made or checked: ~1 s.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from registry.errors import RegistryError, UsageError
from registry.manifest import CONFIG_ENTRY

SIGNATURE_FILE = ".mlreg-signature.json"  # in the store: <model>/<version>/, beside the manifest
SIGNATURE_ARTIFACT = "signature.sigstore.json"  # in MLflow: the version's run, beside manifest.json
SIGNED_BY_TAG = "signed_by"  # the version tag naming the signer ("" / absent: unsigned)
KEYLESS = "sigstore"  # --sign-key sigstore: keyless signing with the ambient OIDC identity
MODES = ("required", "warn")
TRUST_KEYS = frozenset({"signatures", "trusted_keys", "trusted_identities"})
_OIDC_ISSUER_V2 = "1.3.6.1.4.1.57264.1.8"
_OIDC_ISSUER_V1 = "1.3.6.1.4.1.57264.1.1"


class SignatureError(RegistryError):
    """A signature cannot be made, or does not verify; names the version, the file or the identity."""


@dataclass(frozen=True)
class SigningKey:
    """How to sign: a private key (with its certificate and chain), or keyless Sigstore."""

    key: Path | None = None
    certificate: Path | None = None
    chain: tuple[Path, ...] = ()
    keyless: bool = False

    @classmethod
    def of(
        cls, key: str | None, certificate: str | None = None, chain: str | None = None
    ) -> SigningKey | None:
        """From ``--sign-key`` / ``MLREG_SIGNING_KEY`` (a PEM path, or ``sigstore``) and
        ``MLREG_SIGNING_CERT`` / ``MLREG_SIGNING_CHAIN``; None when nothing asks for signing."""
        if not key:
            return None
        if key == KEYLESS:
            return cls(keyless=True)
        paths = [Path(key), *(Path(p) for p in (certificate, chain) if p)]
        for path in paths:
            if not path.is_file():
                raise UsageError(
                    f"signing: '{path}' is not a file",
                    fix="pass a PEM private key (openssl ecparam -name prime256v1 -genkey -noout -out "
                    "key.pem), or 'sigstore' for keyless signing in GitHub Actions",
                )
        return cls(Path(key), Path(certificate) if certificate else None, (Path(chain),) if chain else ())

    @property
    def method(self) -> str:
        return "sigstore" if self.keyless else "certificate" if self.certificate else "key"


@dataclass(frozen=True)
class TrustedIdentity:
    """A keyless signer: the OIDC issuer (exact) and the certificate's subject (a full-match regex)."""

    issuer: str
    subject: str

    def matches(self, issuer: str, subjects: list[str]) -> bool:
        return issuer == self.issuer and any(re.fullmatch(self.subject, s) for s in subjects)


@dataclass(frozen=True)
class Trust:
    """An environment's signature policy: ``required`` refuses, ``warn`` reports and goes on."""

    mode: str
    keys: tuple[Path, ...] = ()  # PEM public keys, or CA certificates for certificate signatures
    identities: tuple[TrustedIdentity, ...] = ()

    @property
    def required(self) -> bool:
        return self.mode == "required"


@dataclass(frozen=True)
class Signed:
    """A signature that verified: who signed, how, and the file digests it signed."""

    identity: str
    method: str
    files: dict[str, str] = field(default_factory=dict)


def signed_files(files: dict[str, dict[str, Any]], config_sha256: str | None) -> dict[str, str]:
    """What is signed: rel path -> sha256 of every file of a manifest, plus ``config.pbtxt``."""
    out = {rel: str(meta["sha256"]) for rel, meta in files.items()}
    if config_sha256:
        out[CONFIG_ENTRY] = config_sha256
    return out


# -- signing -----------------------------------------------------------------------------------------


def sign(files: dict[str, str], key: SigningKey, name: str) -> bytes:
    """A Sigstore bundle (JSON bytes) over ``files`` (rel path -> sha256), made without reading a
    file: the statement is built from the digests.  ``name`` is informative only."""
    from model_signing._signing import signing  # lazy: model-signing + sigstore: ~1 s, only when signing

    payload = signing.Payload(_statement_manifest(files, name))
    try:
        signature = _signer(key).sign(payload)
    except (ValueError, TypeError, OSError) as exc:
        raise SignatureError(
            f"cannot sign {name} with {key.method} '{key.key or KEYLESS}': {exc}",
            fix="pass an EC private key in PEM (P-256, P-384 or P-521) and, for a certificate, the "
            "certificate of that key",
        ) from exc
    return signature.bundle.to_json().encode()


def _statement_manifest(files: dict[str, str], name: str) -> Any:
    from model_signing import manifest  # lazy: model-signing + sigstore, ~1 s
    from model_signing._hashing import hashing  # lazy: model-signing + sigstore, ~1 s

    serialization = manifest._FileSerialization("sha256", allow_symlinks=False)
    items = [
        manifest.FileManifestItem(
            path=PurePosixPath(rel), digest=hashing.Digest("sha256", bytes.fromhex(sha))
        )
        for rel, sha in sorted(files.items())
    ]
    return manifest.Manifest(name, items, serialization)


def _signer(key: SigningKey) -> Any:
    if key.keyless:
        from model_signing._signing import sign_sigstore  # lazy: model-signing + sigstore, ~1 s

        return sign_sigstore.Signer(use_ambient_credentials=True)
    assert key.key is not None
    _require_ec(key.key)
    if key.certificate is not None:
        from model_signing._signing import sign_certificate  # lazy: model-signing + sigstore, ~1 s

        return sign_certificate.Signer(key.key, key.certificate, list(key.chain))
    from model_signing._signing import sign_ec_key  # lazy: model-signing + sigstore, ~1 s

    return sign_ec_key.Signer(key.key)


def _require_ec(path: Path) -> None:
    """model-signing signs with elliptic-curve keys only (Sigstore's key types)."""
    from cryptography.hazmat.primitives import serialization  # lazy: cryptography, ~0.1 s
    from cryptography.hazmat.primitives.asymmetric import ec  # lazy: cryptography, ~0.1 s

    key = serialization.load_pem_private_key(path.read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{type(key).__name__.removeprefix('_')}: not an elliptic-curve key")


# -- who claims to have signed (unverified: for display) -------------------------------------------


def key_fingerprint(pem_public_key: bytes) -> str:
    """The hint model-signing records for a key: sha256 of the public key's PEM (SubjectPublicKeyInfo)."""
    return hashlib.sha256(pem_public_key).hexdigest()


def claimed_identity(bundle: bytes) -> str:
    """Who the bundle says signed it (not verified): ``key <sha256 prefix>``, a certificate's
    subject, or a keyless identity and its issuer."""
    try:
        material = json.loads(bundle)["verificationMaterial"]
    except (ValueError, KeyError, TypeError):
        return "unreadable signature"
    if "publicKey" in material:
        return f"key {str(material['publicKey'].get('hint') or '?')[:16]}"
    raw = (material.get("x509CertificateChain") or {}).get("certificates") or [material.get("certificate")]
    try:
        cert = _certificate(base64.b64decode(raw[0]["rawBytes"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return "unreadable certificate"
    return _cert_identity(cert, keyless="certificate" in material)


def _certificate(der: bytes) -> Any:
    from cryptography import x509  # lazy: cryptography, ~0.1 s

    return x509.load_der_x509_certificate(der)


def _cert_identity(cert: Any, keyless: bool) -> str:
    if not keyless:
        return f"certificate {cert.subject.rfc4514_string()}"
    subjects = _subjects(cert)
    return f"{', '.join(subjects) or '?'} (issuer {_issuer(cert) or '?'})"


def _subjects(cert: Any) -> list[str]:
    from cryptography import x509  # lazy: cryptography, ~0.1 s

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = [
        *san.get_values_for_type(x509.RFC822Name),
        *san.get_values_for_type(x509.UniformResourceIdentifier),
    ]
    found += [o.value.decode(errors="replace") for o in san.get_values_for_type(x509.OtherName)]
    return [str(s) for s in found]


def _issuer(cert: Any) -> str:
    from cryptography import x509  # lazy: cryptography, ~0.1 s

    for oid in (_OIDC_ISSUER_V2, _OIDC_ISSUER_V1):
        try:
            value = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
        except x509.ExtensionNotFound:
            continue
        text = value.decode(errors="replace")
        return text[2:] if oid == _OIDC_ISSUER_V2 and len(text) > 2 else text  # V2: DER UTF8String
    return ""


# -- verifying -----------------------------------------------------------------------------------------


def verify(bundle: bytes | None, files: dict[str, str], trust: Trust, what: str) -> Signed:
    """The signer of ``bundle`` when it is trusted and its statement signs exactly ``files``
    (rel path -> sha256: the manifest's); else SignatureError naming ``what`` (e.g. "simple v2"),
    the identity or the files.  Nothing is hashed: ``files`` come from the manifest."""
    if bundle is None:
        raise SignatureError(
            f"{what} is not signed",
            fix="sign it ('mlreg sign MODEL VERSION --sign-key KEY') or register it with --sign-key",
            identity="",
        )
    signed, method, identity = _verified_statement(bundle, trust, what)
    problems = compare(signed, files)
    if problems:
        raise SignatureError(
            f"{what}: the signature by {identity} does not match the version's files: " + "; ".join(problems),
            fix="the bytes changed after signing, or the signature belongs to other files: register "
            "and sign the version again",
            identity=identity,
            files=sorted({p.split(" ", 1)[0] for p in problems}),
        )
    return Signed(identity, method, signed)


def compare(signed: dict[str, str], files: dict[str, str]) -> list[str]:
    """One line per file where the signed statement and the manifest differ."""
    lines = [
        f"{rel} changed since signing (signed sha256 {signed[rel][:12]}, now {sha[:12]})"
        for rel, sha in sorted(files.items())
        if rel in signed and signed[rel] != sha
    ]
    lines += [f"{rel} is not signed" for rel in sorted(files.keys() - signed.keys())]
    lines += [f"{rel} is signed but missing" for rel in sorted(signed.keys() - files.keys())]
    return lines


_VERIFIED: dict[tuple[str, tuple[Any, ...]], tuple[dict[str, str], str, str]] = {}
_VERIFIED_MAX = 1024


def _verified_statement(bundle: bytes, trust: Trust, what: str) -> tuple[dict[str, str], str, str]:
    """(signed files, method, identity) from the first trusted verifier the bundle verifies with.

    Remembered for this process by the bundle's sha256 and the trusted key files (path, size,
    mtime, inode): a version checked again (the undo log, ``mlreg status``, a fleet's waves) costs
    a digest and a dict lookup, not a DSSE verification.  Only successes are remembered."""
    memo = (hashlib.sha256(bundle).hexdigest(), trust_stamp(trust))
    if memo in _VERIFIED:
        return _VERIFIED[memo]
    found = _verify_envelope(bundle, trust, what)
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    _VERIFIED[memo] = found
    return found


def trust_stamp(trust: Trust) -> tuple[Any, ...]:
    """What a remembered verification depends on: the trusted key files as they are now, and the
    identities."""
    stamps = []
    for path in trust.keys:
        st = path.stat()
        stamps.append((str(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    return (tuple(stamps), trust.identities)


def _verify_envelope(bundle: bytes, trust: Trust, what: str) -> tuple[dict[str, str], str, str]:
    claimed = claimed_identity(bundle)
    try:
        material = json.loads(bundle)["verificationMaterial"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(
            f"{what}: the signature is unreadable ({exc})", fix="sign the version again"
        ) from exc
    if "publicKey" in material:
        method, candidates = "key", _key_verifiers(trust, str(material["publicKey"].get("hint") or ""))
    elif "x509CertificateChain" in material:
        method, candidates = "certificate", _certificate_verifiers(trust)
    else:
        method, candidates = "sigstore", _keyless_verifiers(trust)
    reasons = []
    for identity, verifier, read in candidates:
        try:
            manifest = verifier.verify(read(bundle))
        except Exception as exc:  # model-signing and sigstore raise many kinds: one refusal
            reasons.append(f"{identity}: {exc or type(exc).__name__}")
            continue
        signed = {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}
        if any(rd.digest.algorithm != "sha256" for rd in manifest.resource_descriptors()):
            reasons.append(f"{identity}: digests are not sha256")
            continue
        return signed, method, identity if method == "key" else f"{identity}: {claimed}"
    detail = f" ({'; '.join(reasons)})" if reasons else ""
    raise SignatureError(
        f"{what} is signed by {claimed}, which is not trusted{detail}",
        fix="add the signer's public key to trusted_keys (or its identity to trusted_identities) of "
        "the environment, or sign with a trusted key",
        identity=claimed,
    )


class _Text:
    """What model-signing's ``Signature.read`` reads: an object with ``read_text``."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.data.decode(encoding)


def _read_pb(bundle: bytes) -> Any:
    from model_signing._signing import sign_sigstore_pb  # lazy: model-signing + sigstore, ~1 s

    return sign_sigstore_pb.Signature.read(_Text(bundle))  # type: ignore[arg-type]


def _key_verifiers(trust: Trust, hint: str) -> list[tuple[str, Any, Any]]:
    """A verifier per trusted public key whose fingerprint is the bundle's hint."""
    from model_signing._signing import sign_ec_key  # lazy: model-signing + sigstore, ~1 s

    found = []
    for path in trust.keys:
        fingerprint = key_fingerprint(trusted_pem(path))
        if hint and fingerprint != hint:
            continue
        found.append((f"key {fingerprint[:16]} ({path.name})", sign_ec_key.Verifier(path), _read_pb))
    return found


def _load_public(pem: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization  # lazy: cryptography, ~0.1 s

    return serialization.load_pem_public_key(pem)


def _public_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization  # lazy: cryptography, ~0.1 s

    return bytes(
        key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _certificate_verifiers(trust: Trust) -> list[tuple[str, Any, Any]]:
    """A verifier per trusted CA certificate (a PEM file holding certificates)."""
    from model_signing._signing import sign_certificate  # lazy: model-signing + sigstore, ~1 s

    return [
        (f"CA {path.name}", sign_certificate.Verifier([path]), _read_pb)
        for path in trust.keys
        if b"BEGIN CERTIFICATE" in path.read_bytes()
    ]


def _keyless_verifiers(trust: Trust) -> list[tuple[str, Any, Any]]:
    """One Sigstore verifier (public-good trust root) whose policy is any trusted identity."""
    if not trust.identities:
        return []
    from model_signing._signing import sign_sigstore  # lazy: model-signing + sigstore, ~1 s
    from sigstore import models as sigstore_models  # lazy: model-signing + sigstore, ~1 s
    from sigstore import verify as sigstore_verify  # lazy: model-signing + sigstore, ~1 s

    class Keyless(sign_sigstore.Verifier):  # type: ignore[misc]
        def __init__(self) -> None:
            config = sigstore_models.ClientTrustConfig.production()
            self._verifier = sigstore_verify.Verifier(trusted_root=config.trusted_root)
            self._policy = _IdentityPolicy(trust.identities)  # type: ignore[assignment]

    def read(bundle: bytes) -> Any:
        return sign_sigstore.Signature.read(_Text(bundle))  # type: ignore[arg-type]

    names = ", ".join(f"{i.subject} ({i.issuer})" for i in trust.identities)
    return [(f"identity {names}", Keyless(), read)]


class _IdentityPolicy:
    """sigstore's verification policy: the certificate's issuer and subject match a trusted identity."""

    def __init__(self, identities: tuple[TrustedIdentity, ...]) -> None:
        self.identities = identities

    def verify(self, cert: Any) -> None:
        from sigstore.errors import VerificationError  # lazy: model-signing + sigstore, ~1 s

        issuer, subjects = _issuer(cert), _subjects(cert)
        if not any(i.matches(issuer, subjects) for i in self.identities):
            raise VerificationError(f"{', '.join(subjects)} (issuer {issuer}) is not a trusted identity")


# -- an environment's policy (mlreg.toml) ----------------------------------------------------------


def parse_trust(where: str, raw: dict[str, Any], base: Path) -> Trust | None:
    """``signatures = "required" | "warn"`` with ``trusted_keys = [PATH, ...]`` (relative to the
    mlreg.toml's folder) and ``trusted_identities = [{issuer, subject}]``; None when absent."""
    mode = raw.get("signatures")
    if mode is None:
        if raw.get("trusted_keys") or raw.get("trusted_identities"):
            raise UsageError(
                f'{where}: trusted_keys/trusted_identities need signatures = "required" or "warn"',
                fix='add signatures = "required"',
            )
        return None
    if mode not in MODES:
        raise UsageError(
            f'{where}: signatures must be "required" or "warn", not {mode!r}',
            fix='write signatures = "required" (refuse) or "warn" (report and go on)',
        )
    keys = tuple(_key_path(where, base, k) for k in _list(where, "trusted_keys", raw.get("trusted_keys", [])))
    identities = tuple(
        _identity(where, i) for i in _list(where, "trusted_identities", raw.get("trusted_identities", []))
    )
    if not keys and not identities:
        raise UsageError(
            f"{where}: signatures = {mode!r} trusts nobody",
            fix='add trusted_keys = ["keys/release.pub"] or trusted_identities = '
            '[{ issuer = "https://token.actions.githubusercontent.com", subject = "..." }]',
        )
    return Trust(str(mode), keys, identities)


def _list(where: str, key: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise UsageError(f"{where}: {key} must be a list, not {value!r}", fix=f"write {key} = [...]")
    return value


def _key_path(where: str, base: Path, value: object) -> Path:
    path = base / str(value)
    if not isinstance(value, str) or not path.is_file():
        raise UsageError(
            f"{where}: trusted key {value!r} is not a file ({path})",
            fix="list PEM public keys (or CA certificates), relative to mlreg.toml",
        )
    trusted_pem(path, where)
    return path


def trusted_pem(path: Path, where: str = "") -> bytes:
    """The PEM public key of a trusted key file (a CA certificate's key for a certificate file),
    else one UsageError naming the file: a private key (a signer's secret: only its public half
    is trusted), or anything that is not a PEM public key or certificate."""
    place = f"{where}: " if where else ""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"{place}trusted key {path} cannot be read: {exc.strerror or exc}",
            fix="list readable PEM public keys (or CA certificates)",
        ) from exc
    if b"PRIVATE KEY-----" in pem:
        raise UsageError(
            f"{place}trusted key {path} is a private key: trust takes the public key, and a private "
            "key must not be handed around",
            fix=f"trust its public half instead (openssl ec -in {path.name} -pubout -out "
            f"{path.stem}.pub) and keep {path.name} with the signer only",
        )
    return _public_of(pem, path, place)


def _public_of(pem: bytes, path: Path, place: str) -> bytes:
    from cryptography import x509  # lazy: cryptography, ~0.1 s

    try:
        if b"BEGIN CERTIFICATE" in pem:
            return _public_pem(x509.load_pem_x509_certificate(pem).public_key())
        return _public_pem(_load_public(pem))
    except (ValueError, TypeError) as exc:  # cryptography's answer to bytes that are no such PEM
        raise UsageError(
            f"{place}trusted key {path} is not a PEM public key or certificate ({exc})",
            fix="list PEM public keys ('-----BEGIN PUBLIC KEY-----', e.g. from 'openssl ec -in "
            "key.pem -pubout') or CA certificates ('-----BEGIN CERTIFICATE-----')",
        ) from None


def _identity(where: str, value: object) -> TrustedIdentity:
    if not isinstance(value, dict) or not {"issuer", "subject"} <= value.keys():
        raise UsageError(
            f"{where}: a trusted identity needs issuer and subject, not {value!r}",
            fix='write { issuer = "https://token.actions.githubusercontent.com", '
            'subject = "https://github.com/ORG/REPO/.github/workflows/promote.yml@.*" }',
        )
    try:
        re.compile(str(value["subject"]))
    except re.error as exc:
        raise UsageError(
            f"{where}: subject {value['subject']!r} is not a regex: {exc}", fix="fix the regex"
        ) from exc
    return TrustedIdentity(str(value["issuer"]), str(value["subject"]))
