"""Signed model versions on the real stack: a real tritonserver, the embedded MLflow registry, the
local store, keys made here (EC P-256, no network).

An environment with ``signatures = "required"`` loads a version only when its OpenSSF signature
verifies against a trusted key and signs exactly the manifest's files.  Each refusal leaves the
store, the alias and what Triton serves as they were, and names the version, the file or the
identity.  The tests run in file order on one module-scoped stack with a small python model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mlreg.cli.main import app
from mlreg.ops.context import environment
from mlreg.ops.status import status
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.errors import PromotionError
from registry.k8s_annotations import PREFIX
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from registry.signing import SIGNATURE_FILE, SigningKey, key_fingerprint
from tests.cli import CliRunner
from tests.conftest import failing_python_model
from tests.integration.stacks import (
    SCALING_CONFIG,
    SCALING_MODEL_PY,
    local_stack,
    ready_versions,
    refusal_state,
)

pytestmark = pytest.mark.integration

MODEL = "signed_echo"
CONFIG, MODEL_PY = SCALING_CONFIG, SCALING_MODEL_PY  # a python model answering INPUT0 x SCALE
ABORTED = "signed_abort"


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    url: str
    keys: Path  # trusted.pem/.pub, untrusted.pem/.pub
    work: Path

    def register(self, name: str, scale: str, key: str | None = None, code: str | None = None) -> str:
        folder = self.work / f"{name}-{scale}" / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG.format(name=name))
        (folder / "1" / "model.py").write_text(code or MODEL_PY.format(scale=scale))
        signer = SigningKey(self.keys / f"{key}.pem") if key else None
        return register(self.registry, find_candidate(folder), signer=signer).version

    def promote(self, env: str, model: str, version: str, **options: Any) -> PromotionResult:
        promotion = Promotion(
            self.settings,
            environment(self.settings, env),
            self.registry,
            Options(skip_quality=True, **options),
        )
        return promotion.run(model, version)

    def serving(self, model: str) -> list[str]:
        return ready_versions(self.url, model)

    def stored(self, model: str, version: str) -> Path:
        return self.settings.local_repository / model / version

    def put_tampered(self, model: str, version: str, change: Any) -> None:
        """Store ``version`` after ``change(folder)``, with the store's manifest and the digest
        registered in MLflow computed again to match: only the signature can tell."""
        folder = self.work / f"tampered-{model}-{version}"
        self.registry.models.fetch_version(model, version, folder)
        change(folder / version)
        store = open_store(self.settings.local_repository)
        store.versions.put_version(model, version, folder / version, config=folder / "config.pbtxt")
        manifest = store.versions.read_manifest(model, version)
        assert manifest is not None
        self.registry.models.set_version_tag(model, version, "artifact_digest", manifest.digest)

    def snapshot(self, model: str) -> dict[str, object]:
        """What a refused promotion must leave alone (stacks.refusal_state): the store's objects,
        every alias of every model, Triton's whole index (a version never loaded is not even listed
        UNAVAILABLE) and pins; and the versions of ``model`` it serves."""
        state = refusal_state(self.settings.local_repository, [self.url], self.registry)
        return {"serving": self.serving(model), **state}


def _keypair(folder: Path, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (folder / f"{name}.pem").write_bytes(private)
    (folder / f"{name}.pub").write_bytes(public)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("signing")
    keys = root / "keys"
    keys.mkdir()
    _keypair(keys, "trusted")
    _keypair(keys, "untrusted")
    with local_stack(None, root / ".mlreg") as local:
        store = local.settings.local_repository
        (root / "mlreg.toml").write_text(
            f'[environments.signed]\nstore = "{store}"\ntargets = ["{local.url}"]\n'
            'gpu = false\nsignatures = "required"\ntrusted_keys = ["keys/trusted.pub"]\n\n'
            f'[environments.warned]\nstore = "{store}"\ntargets = ["{local.url}"]\n'
            'gpu = false\nsignatures = "warn"\ntrusted_keys = ["keys/trusted.pub"]\n'
        )
        work = root / "work"
        work.mkdir()
        yield Stack(local.settings, local.registry, local.url, keys, work)


def _fingerprint(stack: Stack, name: str) -> str:
    return key_fingerprint((stack.keys / f"{name}.pub").read_bytes())[:16]


def test_a_version_signed_with_a_trusted_key_promotes(stack: Stack) -> None:
    version = stack.register(MODEL, "1.0", key="trusted")
    result = stack.promote("signed", MODEL, version)
    assert result.ok
    assert stack.serving(MODEL) == [version]
    assert stack.registry.models.aliases(MODEL)["signed"] == version
    validate = next(s for s in result.stages if s.stage == "validate")
    assert f"{MODEL} v{version} signed by key {_fingerprint(stack, 'trusted')}" in validate.detail
    assert (stack.stored(MODEL, version) / SIGNATURE_FILE).is_file()  # beside the manifest
    assert open_store(stack.settings.local_repository).versions.check_version(MODEL, version).ok
    description = stack.registry.models.version(MODEL, version).description
    assert f"Signature: signed by key {_fingerprint(stack, 'trusted')}" in description


def _refused(stack: Stack, version: str, *expected: str) -> None:
    before = stack.snapshot(MODEL)
    with pytest.raises(PromotionError) as caught:
        stack.promote("signed", MODEL, version)
    for text in expected:
        assert text in caught.value.message
    assert "nothing was changed" in caught.value.message
    assert stack.snapshot(MODEL) == before


def test_an_unsigned_version_is_refused(stack: Stack) -> None:
    version = stack.register(MODEL, "2.0")
    _refused(stack, version, f"{MODEL} v{version} is not signed")


def test_a_version_signed_by_an_untrusted_key_is_refused(stack: Stack) -> None:
    version = stack.register(MODEL, "3.0", key="untrusted")
    _refused(
        stack,
        version,
        f"{MODEL} v{version} is signed by key {_fingerprint(stack, 'untrusted')}",
        "not trusted",
    )


def test_a_file_changed_after_signing_is_refused(stack: Stack) -> None:
    version = stack.register(MODEL, "4.0", key="trusted")
    stack.put_tampered(MODEL, version, lambda v: (v / "model.py").write_text(MODEL_PY.format(scale="400.0")))
    _refused(stack, version, f"{MODEL} v{version}", "model.py changed since signing")


def test_another_versions_signature_copied_beside_this_one_is_refused(stack: Stack) -> None:
    version = stack.register(MODEL, "5.0")
    stack.put_tampered(MODEL, version, lambda v: None)
    shutil.copy2(stack.stored(MODEL, "1") / SIGNATURE_FILE, stack.stored(MODEL, version) / SIGNATURE_FILE)
    _refused(stack, version, f"{MODEL} v{version}", "model.py changed since signing")


def test_an_extra_unsigned_file_in_the_version_folder_is_refused(stack: Stack) -> None:
    version = stack.register(MODEL, "6.0", key="trusted")
    stack.put_tampered(MODEL, version, lambda v: (v / "extra.py").write_text("import os\n"))
    _refused(stack, version, f"{MODEL} v{version}", "extra.py is not signed")


def test_the_previous_versions_signature_is_checked_before_any_change_and_on_an_abort(stack: Stack) -> None:
    """The serving version's stored bytes change (manifest and registered digest made to match, so
    the byte check passes; only its signature can tell).  A promotion with no way back is refused
    before any change; told ``no_way_back``, the new version fails to load and the abort refuses
    to load the previous version again: every replica keeps answering with what it served, and
    the store's config names only folders that are there."""
    first = stack.register(ABORTED, "1.0", key="trusted")
    assert stack.promote("signed", ABORTED, first).ok
    stack.put_tampered(ABORTED, first, lambda v: (v / "model.py").write_text(MODEL_PY.format(scale="9.0")))
    broken = stack.register(ABORTED, "2.0", key="trusted", code=failing_python_model("no vocabulary"))
    before = stack.snapshot(ABORTED)
    with pytest.raises(PromotionError) as refused:
        stack.promote("signed", ABORTED, broken)
    assert f"{ABORTED} v{first}, the version an abort would load again" in refused.value.message
    assert "model.py changed since signing" in refused.value.message
    assert "nothing was changed" in refused.value.message
    assert "--no-way-back" in (refused.value.fix or "")
    assert stack.snapshot(ABORTED) == before

    with pytest.raises(PromotionError) as caught:
        stack.promote("signed", ABORTED, broken, no_way_back=True)
    message = caught.value.message
    assert f"{ABORTED} v{first}: its signature does not verify" in message
    assert f"{ABORTED} left as it serves now" in message
    assert stack.registry.models.aliases(ABORTED)["signed"] == first
    assert stack.serving(ABORTED) == [first]  # never unloaded, never re-read
    with TritonControl(stack.url) as triton:
        answer = triton.infer(ABORTED, {"INPUT0": np.ones((1, 4), np.float32)}, ["OUTPUT0"])["OUTPUT0"]
    assert answer.ravel().tolist() == [1.0] * 4  # the bytes it loaded before the tampering (x 1.0)
    config = open_store(stack.settings.local_repository).read_config(ABORTED) or ""
    for version in serving_versions(config):  # the config never names a folder that is gone
        assert stack.stored(ABORTED, version).is_dir(), (version, config)


def test_warn_promotes_an_unsigned_version_and_warns(stack: Stack) -> None:
    result = stack.promote("warned", MODEL, "2")
    assert result.ok
    assert stack.serving(MODEL) == ["2"]
    validate = next(s for s in result.stages if s.stage == "validate")
    assert f"{MODEL} v2 signature NOT verified (warn: {MODEL} v2 is not signed)" in validate.detail


def test_status_flags_a_serving_version_whose_signature_does_not_verify(stack: Stack) -> None:
    """The warned environment put unsigned v2 into the store the signed environment reads."""
    report = status(stack.settings, "signed", MODEL)
    (row,) = report.models
    assert f"v2: its signature does not verify ({MODEL} v2 is not signed)" in row["drift"]
    assert report.drift


def test_store_verify_checks_signatures_beside_the_manifest(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(stack.settings.home))
    runner = CliRunner()
    store = str(stack.settings.local_repository)
    trusted = str(stack.keys / "trusted.pub")
    good = runner.invoke(
        app, ["store", "verify", MODEL, "1", "-s", store, "--signatures", "--trusted-key", trusted]
    )
    assert good.exit_code == 0, good.output
    assert f"signature: signed by key {_fingerprint(stack, 'trusted')}" in good.output
    bad = runner.invoke(
        app, ["store", "verify", MODEL, "4", "-s", store, "--signatures", "--trusted-key", trusted]
    )
    assert bad.exit_code == 5, bad.output
    assert f"signature: NOT verified: {MODEL} v4 is not signed" in bad.output
    assert f"not signed by a trusted key: {MODEL}/4" in bad.output
    # present but wrong: v1's signature (a trusted key's, of other bytes) beside v4's files (in the
    # archive, where retention moved v4)
    copied = Path(open_store(store).archive().uri) / MODEL / "4" / SIGNATURE_FILE
    shutil.copy2(stack.stored(MODEL, "1") / SIGNATURE_FILE, copied)
    try:
        wrong = runner.invoke(
            app, ["store", "verify", MODEL, "4", "-s", store, "--signatures", "--trusted-key", trusted]
        )
    finally:
        copied.unlink()
    assert wrong.exit_code == 5, wrong.output
    output = " ".join(wrong.output.split())  # the CLI wraps long lines
    trusted_key = _fingerprint(stack, "trusted")
    assert f"{MODEL}/4 (archived): verified" in output  # the bytes match their manifest ...
    assert f"signature: NOT verified: {MODEL} v4: the signature by key {trusted_key}" in output
    assert "does not match the version's files: model.py changed since signing" in output  # ... not it
    assert f"not signed by a trusted key: {MODEL}/4" in output


def test_mlreg_sign_signs_an_earlier_version_and_show_says_by_whom(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 3 was signed by the untrusted key: signed again with the trusted one, it promotes."""
    monkeypatch.setenv("MLREG_HOME", str(stack.settings.home))
    runner = CliRunner()
    signed = runner.invoke(app, ["sign", MODEL, "3", "--sign-key", str(stack.keys / "trusted.pem")])
    fingerprint = _fingerprint(stack, "trusted")
    assert signed.exit_code == 0, signed.output
    assert f"{MODEL}: version 3 signed by key {fingerprint}" in signed.output
    shown = runner.invoke(app, ["show", MODEL, "--version", "3"])
    assert f"signature: signed by key {fingerprint}" in shown.output
    listed = runner.invoke(app, ["versions", MODEL])
    rows = {line.split()[0]: line for line in listed.output.splitlines()[1:] if line.strip()}
    assert f"key {fingerprint}" in rows["3"]
    assert "unsigned" in rows["2"]
    description = stack.registry.models.version(MODEL, "3").description
    assert f"Signature: signed by key {fingerprint}" in description
    # what serves (v2, promoted through the warn environment on the same store) is unsigned: its way
    # back cannot be verified, so the promotion is refused unless told to go on without one
    with pytest.raises(PromotionError, match=f"{MODEL} v2, the version an abort would load again"):
        stack.promote("signed", MODEL, "3")
    assert stack.serving(MODEL) == ["2"]
    assert stack.promote("signed", MODEL, "3", no_way_back=True).ok
    assert stack.serving(MODEL) == ["3"]
    (row,) = status(stack.settings, "signed", MODEL).models  # the other side of the status flag:
    assert not [line for line in row["drift"] if "signature" in line], row["drift"]  # v3 verifies


def test_mlreg_sign_without_a_key_says_how(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLREG_HOME", str(stack.settings.home))
    monkeypatch.delenv("MLREG_SIGNING_KEY", raising=False)
    refused = CliRunner().invoke(app, ["sign", MODEL, "3"])
    assert refused.exit_code == 2
    assert "mlreg sign needs a key" in refused.output


def test_k8s_annotations_name_what_the_environment_serves_and_who_signed_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(stack.settings.home))
    patch_file = stack.work / "annotations.json"
    done = CliRunner().invoke(app, ["k8s-annotations", "--env", "signed", "-o", str(patch_file)])
    assert done.exit_code == 0, done.output
    annotations = json.loads(patch_file.read_text())["metadata"]["annotations"]
    assert annotations[f"{PREFIX}{MODEL}.version"] == "3"  # the signed alias's version
    assert annotations[f"{PREFIX}{MODEL}.signed-by"] == f"key {_fingerprint(stack, 'trusted')}"
    assert annotations[f"{PREFIX}{MODEL}.signature"].endswith("/signature.sigstore.json")
    assert annotations[f"{PREFIX}{ABORTED}.version"] == "1"
    assert set(json.loads(patch_file.read_text())) == {"metadata"}  # metadata only: no pod restart


def test_mlreg_register_signs_with_the_key_in_mlreg_signing_key(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(stack.settings.home))
    folder = stack.work / "cli" / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=MODEL))
    (folder / "1" / "model.py").write_text(MODEL_PY.format(scale="7.0"))
    env = {"MLREG_SIGNING_KEY": str(stack.keys / "trusted.pem")}
    done = CliRunner().invoke(app, ["register", MODEL, str(folder), "--json"], env=env)
    assert done.exit_code == 0, done.output
    (row,) = json.loads(done.output)["versions"]
    assert row["created"]
    assert row["signed_by"] == f"key {_fingerprint(stack, 'trusted')}"
    assert stack.registry.models.version_tags(MODEL, row["version"])["signed_by"] == row["signed_by"]
