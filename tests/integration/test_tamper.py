"""Tampered bytes at the promotion level: a real tritonserver, the embedded MLflow registry, the local
store, a small python model (no TensorFlow).

Every version a promotion may make Triton load is checked against the digest registered in MLflow
(``pipelines/promote/integrity.py``): a new version after its upload, a stored one (a rollback's
target) before any change.  A stored copy that does not verify is restored from the registry's
artifacts when those match the registered digest; when neither copy does, the promotion is refused.
Each refusal is asserted on state -- the store's files, every alias of the model, what Triton serves
and what it answers -- and on the line a user sees, which names the model, the version and the file.

``tamper_echo`` answers ``INPUT0 * SCALE``; v1 (SCALE 1) and v2 (SCALE 2) are promoted by the
fixture, v2 serves.  The tests run in file order; the last one moves the alias back to v1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.cli.main import app
from mlreg.ops.context import environment
from pipelines.core.context import Options
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.errors import PromotionError, StorageError
from registry.mlflow import MlflowRegistry, sqlite
from registry.register import find_candidate, register
from registry.settings import Settings
from tests.cli import CliRunner, Result
from tests.integration.stacks import (
    SCALING_CONFIG,
    SCALING_MODEL_PY,
    local_stack,
    ready_versions,
    refusal_state,
)

pytestmark = pytest.mark.integration

MODEL = "tamper_echo"
ENV = "tamper"
CONFIG = SCALING_CONFIG.format(name=MODEL)
MODEL_PY = SCALING_MODEL_PY
X = np.array([[1, 2, 3, 4]], np.float32)


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    url: str
    work: Path

    def register(self, scale: str) -> str:
        folder = self.work / f"scale-{scale}" / MODEL
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG)
        (folder / "1" / "model.py").write_text(MODEL_PY.format(scale=scale))
        return register(self.registry, find_candidate(folder)).version

    def promote(self, version: str) -> None:
        env = environment(self.settings, ENV)
        Promotion(self.settings, env, self.registry, Options(skip_quality=True)).run(MODEL, version)

    def mlreg(self, *args: str) -> Result:
        """The ``mlreg`` CLI in-process, on this stack's project."""
        return CliRunner().invoke(app, list(args), env={"MLREG_HOME": str(self.settings.home)})

    def stored(self, version: str) -> Path:
        """A version's model.py in the store (what Triton reads)."""
        return self.settings.local_repository / MODEL / version / "model.py"

    def registered(self, version: str) -> Path:
        """A version's model.py in MLflow's artifact store (the embedded registry's local files)."""
        record = sqlite.model_version(self.registry.uri, MODEL, version)
        source = record.local_source() if record is not None else None
        assert source is not None, f"{MODEL} v{version}: no local artifacts"
        return source / "model.py"

    def answers(self) -> np.ndarray:
        with TritonControl(self.url) as triton:
            return np.asarray(triton.infer(MODEL, {"INPUT0": X}, ["OUTPUT0"])["OUTPUT0"])

    def snapshot(self) -> dict[str, Any]:
        """What a refused promotion must leave alone (stacks.refusal_state): the store's objects
        (sha256 each, locks left out), every alias of every model, Triton's whole repository index
        (every version it lists, loaded or given back) and pins; and what it serves."""
        state = refusal_state(self.settings.local_repository, [self.url], self.registry)
        return {"serving": ready_versions(self.url, MODEL), **state}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("tamper")
    with local_stack(None, root / ".mlreg") as local:
        (root / "mlreg.toml").write_text(
            f'[environments.{ENV}]\nstore = "{local.settings.local_repository}"\ntargets = ["{local.url}"]\n'
            "gpu = false\n"
        )
        work = root / "work"
        work.mkdir()
        built = Stack(local.settings, local.registry, local.url, work)
        for scale in ("1.0", "2.0"):
            built.promote(built.register(scale))
        yield built


def _serves_v2(stack: Stack) -> None:
    assert stack.snapshot()["serving"] == ["2"]
    assert stack.registry.models.aliases(MODEL)[ENV] == "2"
    np.testing.assert_allclose(stack.answers(), X * 2)


def test_a_new_version_whose_registered_bytes_changed_is_refused_and_never_served(stack: Stack) -> None:
    """v3's model.py is rewritten in MLflow's artifact store after registration: the bytes the
    promotion uploads no longer hash to the registered digest.  The upload is verified before any
    server loads it, and the refusal removes it from the store again.  The refusal names the model,
    the version, the manifest whose digest differs and the file that differs from the registry's
    own manifest.json."""
    version = stack.register("3.0")
    registered = stack.registered(version)
    registered.write_text(MODEL_PY.format(scale="300.0"))
    before = stack.snapshot()
    assert f"{MODEL}/2/model.py" in before["objects"]  # the snapshot sees the store
    refused = stack.mlreg("promote", MODEL, "--version", version, "--env", ENV, "--skip-quality")
    assert refused.exit_code == PromotionError.exit_code, refused.output
    output = " ".join(refused.output.split())  # the CLI wraps long lines
    assert f"{MODEL}/{version} does not match what was registered" in output
    assert ".mlreg-manifest.json does not match the digest registered in MLflow" in output
    assert f"{MODEL}/{version}/model.py changed since registration" in output
    assert f"rolled back, the previous versions serve (restored {MODEL}/{version} removed)" in output
    assert stack.snapshot() == before  # no v3 folder left in the store; alias and Triton as they were
    assert not stack.stored(version).parent.exists()
    _serves_v2(stack)
    # never loaded, not merely rolled back: Triton's repository index keeps every version it ever
    # loaded (v1, retired when v2 came, is listed UNLOADING/UNAVAILABLE: the positive control) --
    # v3 is absent
    with TritonControl(stack.url) as triton:
        states = triton.model_states()[MODEL]
    assert states.get("1") in {"UNLOADING", "UNAVAILABLE"}, states
    assert version not in states, states


PLANTED = """import os
__path__ = [os.path.join(os.path.dirname(__file__), "{version}")]  # 'import {version}.model' goes on
SCALE_OVERRIDE = -1.0  # code nobody verified, imported before {version}/model.py
"""


def test_a_module_planted_beside_the_version_folders_refuses_every_load_and_nothing_is_loaded(
    stack: Stack,
) -> None:
    """Issue 44's repro: ``<model>/<v>.py`` (no manifest covers it) is what Triton 2.51's python
    stub imports for ``<v>.model`` (it puts the model folder on sys.path).  The promotion of v<v>
    is refused naming the file, before Triton hears of v<v>; a variant verb (a rollback to v1) is
    refused as well; ``store verify`` and ``status`` name it.  The store, the aliases and Triton's
    index are as they were, v2 serves and answers X * 2."""
    version = stack.register("4.0")
    planted = stack.settings.local_repository / MODEL / f"{version}.py"
    planted.write_text(PLANTED.format(version=version))
    try:
        before = stack.snapshot()
        refused = stack.mlreg("promote", MODEL, "--version", version, "--env", ENV, "--skip-quality")
        assert refused.exit_code == PromotionError.exit_code, refused.output
        output = " ".join(refused.output.split())
        assert f"{MODEL}/{version}.py lies beside the version folders" in output
        assert stack.snapshot() == before  # the planted file stays (not mlreg's): nothing else changed
        rollback = stack.mlreg("rollback", MODEL, "--to-version", "1", "--env", ENV)
        assert rollback.exit_code == PromotionError.exit_code, rollback.output
        assert f"{MODEL}/{version}.py lies beside the version folders" in " ".join(rollback.output.split())
        assert stack.snapshot() == before
        _serves_v2(stack)
        with TritonControl(stack.url) as triton:
            states = triton.model_states()[MODEL]
        assert version not in states, states  # never loaded
        verified = stack.mlreg("store", "verify", MODEL)
        assert verified.exit_code != 0
        assert f"{MODEL}/{version}.py" in " ".join(verified.output.split())
        status = stack.mlreg("status", "--env", ENV)
        assert status.exit_code == 1, status.output
        assert f"{MODEL}/{version}.py lies beside the version folders" in " ".join(status.output.split())
    finally:
        planted.unlink()
    assert open_store(stack.settings.local_repository).versions.verify_version(MODEL, "2").ok  # clean again


def test_store_push_finishes_a_version_without_its_manifest_only_with_the_registered_bytes(
    stack: Stack,
) -> None:
    """Issue 44 item 3 through the CLI and the stack's MLflow: the serving v2's manifest removed,
    ``store push`` of a folder whose model.py was rewritten is refused naming ``store repair``,
    the store byte-identical; the registered bytes (fetched from MLflow) finish it."""
    store = open_store(stack.settings.local_repository)
    manifest = stack.settings.local_repository / MODEL / "2" / ".mlreg-manifest.json"
    kept, config = manifest.read_bytes(), store.read_config(MODEL)
    folder = stack.work / "push" / MODEL
    stack.registry.models.fetch_version(MODEL, "2", folder)
    good = (folder / "2" / "model.py").read_bytes()
    manifest.unlink()
    try:
        (folder / "2" / "model.py").write_text(MODEL_PY.format(scale="-2.0"))
        before = stack.snapshot()
        refused = stack.mlreg("store", "push", str(folder))
        assert refused.exit_code == StorageError.exit_code, refused.output
        output = " ".join(refused.output.split())
        assert "is not what MLflow registered" in output
        assert f"mlreg store repair {MODEL} 2" in output
        assert stack.snapshot() == before  # nothing sent, nothing finished
        (folder / "2" / "model.py").write_bytes(good)
        done = stack.mlreg("store", "push", str(folder))
        assert done.exit_code == 0, done.output
        digest = stack.registry.models.version_tags(MODEL, "2")["artifact_digest"]
        assert store.versions.verify_version(MODEL, "2", digest, full=True).digest == digest
    finally:
        if not manifest.exists():
            manifest.write_bytes(kept)
        if config is not None and store.read_config(MODEL) != config:
            (stack.settings.local_repository / MODEL / "config.pbtxt").write_text(config)
    _serves_v2(stack)


def test_a_rollback_to_a_version_corrupt_in_the_store_and_the_registry_is_refused(stack: Stack) -> None:
    """v1's model.py changed in the store and in MLflow's artifact store: nothing verifies against
    the registered digest, so nothing can be loaded or restored: refused before any change."""
    stored, registered = stack.stored("1"), stack.registered("1")
    originals = stored.read_bytes(), registered.read_bytes()
    try:
        stored.write_text(MODEL_PY.format(scale="9.0"))
        registered.write_text(MODEL_PY.format(scale="9.0"))
        before = stack.snapshot()
        refused = stack.mlreg("rollback", MODEL, "--to-version", "1", "--env", ENV)
        assert refused.exit_code == PromotionError.exit_code, refused.output
        output = " ".join(refused.output.split())  # the CLI wraps long lines
        assert f"{MODEL} v1 in {stack.settings.local_repository} does not verify" in output
        assert "model.py changed: its sha256 differs from the manifest" in output
        assert "the registry's copy does not match its registered digest either" in output
        assert stack.snapshot() == before  # the corrupt v1 left as it was, v2 serving, aliases
        _serves_v2(stack)
    finally:
        stored.write_bytes(originals[0])
        registered.write_bytes(originals[1])


def test_a_rollback_to_a_version_corrupt_in_the_store_loads_the_registered_bytes(stack: Stack) -> None:
    """v1's model.py changed in the store only (SCALE 9, the same size): the registry's copy verifies, so the
    rollback writes the registered bytes back before Triton loads v1, which answers X * 1."""
    good = stack.stored("1").read_bytes()
    stack.stored("1").write_text(MODEL_PY.format(scale="9.0"))
    done = stack.mlreg("rollback", MODEL, "--to-version", "1", "--env", ENV)
    assert done.exit_code == 0, done.output
    assert f"{MODEL}/1 (corrupt: restored by assemble)" in " ".join(done.output.split())
    assert stack.stored("1").read_bytes() == good
    digest = stack.registry.models.version_tags(MODEL, "1")["artifact_digest"]
    assert (
        open_store(stack.settings.local_repository).versions.verify_version(MODEL, "1", digest, full=True).ok
    )
    assert stack.snapshot()["serving"] == ["1"]
    assert stack.registry.models.aliases(MODEL)[ENV] == "1"
    np.testing.assert_allclose(stack.answers(), X * 1)
