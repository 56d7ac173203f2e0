"""Faults of the parts a promotion records into (issue 26, items 1, 2, 4, 6, 7), on real parts:
a real ``mlflow server`` stopped at a pause point of the record stage, a real tritonserver over the
local store, and a real tmpfs under ``MLREG_HOME`` for the full disk (issue 38, items 5 and 11: a
full disk under ``register`` and ``sign`` leaves no file and no folder behind).

One module-scoped stack (the server, Triton, one model in two versions), used in file order; the
full-disk tests mount their own tmpfs and use the embedded registry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from mlreg.ops.context import environment
from mlreg.ops.status import model_status
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.devstack.local_mlflow import MlflowServer, start_mlflow, stop_mlflow
from pipelines.devstack.stack import stack_down, stack_up
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.errors import PromotionError, RegistryError
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from registry.signing import SIGNATURE_ARTIFACT, SIGNED_BY_TAG
from tests.cli import CliRunner
from tests.conftest import ROOT, TEMPLATE
from tests.integration import forkcli
from tests.integration.stacks import (
    paused_mlreg,
    ready_versions,
    refusal_state,
    stack_settings,
    store_files,
)

pytestmark = pytest.mark.integration

MODEL = "table_data_preprocess"
ONE_HOT = "return (flat == VOCAB[np.newaxis, :]).astype(np.float32)"


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    url: str
    env_vars: dict[str, str]
    mlflow: MlflowServer
    mlflow_process: subprocess.Popen[bytes]
    mlflow_root: Path

    def promote(self, version: str, env_name: str = "local", **changes: object) -> PromotionResult:
        env = dataclasses.replace(environment(self.settings, env_name), **changes)  # type: ignore[arg-type]
        return Promotion(self.settings, env, self.registry, Options()).run(MODEL, version)

    def serving(self, model: str = MODEL) -> list[str]:
        return ready_versions(self.url, model)

    def desired(self) -> list[str]:
        return serving_versions(open_store(self.settings.local_repository).read_config(MODEL))

    def alias(self) -> str | None:
        return self.registry.models.aliases(MODEL).get("local")

    def tags(self, version: str) -> dict[str, str]:
        return self.registry.models.version_tags(MODEL, version)

    def stop_mlflow(self) -> None:
        stop_mlflow(self.mlflow.pid, self.mlflow_process)

    def start_mlflow(self) -> None:
        root = self.mlflow_root
        self.mlflow, self.mlflow_process = start_mlflow(
            f"sqlite:///{root / 'mlflow.db'}",
            root / "artifacts",
            root / "mlflow.log",
            serve_artifacts=True,
            port=self.mlflow.port,
        )


def _version(folder: Path, mark: str) -> Path:
    shutil.copytree(TEMPLATE / MODEL, folder)
    code = folder / "1" / "model.py"
    code.write_text(code.read_text().replace(ONE_HOT, f"{ONE_HOT}  # {mark}"))
    return folder


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("faults-registry")
    root = base / "mlflow-server"
    root.mkdir()
    server, process = start_mlflow(
        f"sqlite:///{root / 'mlflow.db'}", root / "artifacts", root / "mlflow.log", serve_artifacts=True
    )
    settings, env_vars = stack_settings(base, MLFLOW_TRACKING_URI=server.url, MLREG_MLFLOW_TIMEOUT="5")
    settings.local_repository.mkdir(parents=True)
    stack_up(settings, ui=False)
    registry = MlflowRegistry(settings)
    made = Stack(settings, registry, "", env_vars, server, process, root)
    try:
        for mark in ("v1", "v2"):
            register(registry, find_candidate(_version(base / mark / MODEL, mark)))
        env = environment(settings, "local")
        made.url = env.targets[0]
        yield made
    finally:
        stack_down(settings)
        made.stop_mlflow()


@pytest.fixture
def serving_v2(stack: Stack) -> Stack:
    """v2 serves, from the store, with the alias on it: what the module's first test leaves, built
    here when a test runs alone (or after a failure left something else), never assumed."""
    if (stack.serving(), stack.desired(), stack.alias()) != (["2"], ["2"], "2"):
        stack.promote("2")
    assert (stack.serving(), stack.desired(), stack.alias()) == (["2"], ["2"], "2"), "v2 must serve first"
    return stack


def _paused_promote(stack: Stack, point: str, version: str, at_pause: object) -> tuple[int, str]:
    """``mlreg promote`` run until the test hook pauses it at ``point``; ``at_pause()`` runs there,
    then the promotion goes on.  Returns its exit code and stderr."""
    resume = stack.mlflow_root / f"resume-{point.replace(':', '-')}"
    args = ("promote", MODEL, "--version", version, "--env", "local")
    with paused_mlreg(stack.env_vars, point, *args, resume=resume) as paused:
        at_pause()  # type: ignore[operator]
        resume.touch()
        return paused.finish(240)


def test_first_deployment_and_a_swap_wait_for_the_retired_version(stack: Stack) -> None:
    """Item 6: the swap returns only once the retired version is unloaded; a rerun says "already
    serves", never "retired v1" while v1 serves.  The wait is observed, not inferred from a state
    read after the record stage's MLflow round trips: every call the promotion makes to Triton is
    noted in order, and after the retire's load (the store's config serving v2 alone) comes a look
    at the repository index that finds v1 no longer READY -- the last call, before the promotion
    records anything (on S3, issue 26 saw v1 READY there: then the wait loads again)."""
    stack.promote("1")
    assert (stack.serving(), stack.desired(), stack.alias()) == (["1"], ["1"], "1")
    calls: list[tuple[str, object]] = []  # ("load", what the store serves) / ("states", v1's state)

    def connect(url: str) -> TritonControl:
        control = TritonControl(url)
        load, model_states = control.load, control.model_states

        def noted_load(model: str, config: str | None = None, files: Any = None) -> None:
            load(model, config, files)
            if model == MODEL:
                calls.append(("load", stack.desired()))

        def noted_states() -> dict[str, dict[str, str]]:
            states = model_states()
            calls.append(("states", states.get(MODEL, {}).get("1")))
            return states

        setattr(control, "load", noted_load)  # noqa: B010 (instance attributes, on purpose)
        setattr(control, "model_states", noted_states)  # noqa: B010
        return control

    env = environment(stack.settings, "local")
    result = Promotion(stack.settings, env, stack.registry, Options(), connect=connect).run(MODEL, "2")
    assert "retired table_data_preprocess v1" in " ".join(s.detail for s in result.stages)
    retire = calls.index(("load", ["2"]))
    assert ("load", ["1", "2"]) in calls[:retire]  # the overlap came first
    looked = calls[retire + 1 :]
    assert looked, calls  # the retire was followed by a look at what Triton serves ...
    assert {kind for kind, _ in looked} == {"states"}, calls
    assert looked[-1][1] in {"UNLOADING", "UNAVAILABLE"}, calls  # ... which found v1 gone
    assert stack.serving() == ["2"]
    assert (stack.desired(), stack.alias()) == (["2"], "2")
    again = stack.promote("2")
    assert again.noop
    assert stack.serving() == ["2"]


@pytest.mark.usefixtures("serving_v2")
def test_mlflow_down_at_the_record_stage_moves_no_alias_and_a_rerun_repairs_the_tags(stack: Stack) -> None:
    """Item 2: the real MLflow server stopped after the record stage's tags, before the alias: the
    promotion of v1 fails, serving is rolled back to v2, the alias still names v2 and the message
    says what moved; the version tag the failed attempt left (MLflow was down, it could not be
    removed) is removed by a rerun of the serving version, which repairs the record."""
    assert stack.alias() == "2"
    stamp_v1 = stack.tags("1").get("promoted_local")

    code, err = _paused_promote(stack, "record:aliases", "1", stack.stop_mlflow)
    stack.start_mlflow()
    assert code == 8, err
    assert "Traceback" not in err
    assert "recording in MLflow failed" in err, err
    assert "no MLflow alias was moved" in err, err
    assert "the MLflow alias was not moved" not in err  # the old, generic claim
    assert (stack.serving(), stack.desired()) == (["2"], ["2"])
    assert stack.alias() == "2"
    left = stack.tags("1").get("promoted_local")  # MLflow was down: the tag could not be put back
    assert left != stamp_v1

    again = stack.promote("2")
    assert again.noop
    assert any("promoted_local of table_data_preprocess v1" in n for n in again.notes), again.notes
    assert "promoted_local" not in stack.tags("1")
    assert (stack.serving(), stack.desired(), stack.alias()) == (["2"], ["2"], "2")


@pytest.mark.usefixtures("serving_v2")
def test_an_alias_moved_by_a_failed_attempt_is_repaired_by_the_no_op_rerun(stack: Stack) -> None:
    """Item 2, the no-op path: the alias names v1 (what a failed record left before) while v2
    serves; a rerun of v2 says it already serves and moves the alias back."""
    stack.registry.models.set_alias(MODEL, "local", "1")
    result = stack.promote("2")
    assert result.noop
    assert any("alias 'local' of table_data_preprocess moved back to v2" in n for n in result.notes)
    assert (stack.alias(), stack.serving()) == ("2", ["2"])


@pytest.mark.usefixtures("serving_v2")
def test_status_sees_a_model_the_store_lost_that_serves_and_the_alias_names(stack: Stack) -> None:
    """Item 1: the store's folder deleted (a recreated bucket): status is drift, not clean; one
    promotion of the serving version puts the store back and status is clean again."""
    env = environment(stack.settings, "local")
    shutil.rmtree(stack.settings.local_repository / MODEL)
    rows = {r["model"]: r for r in model_status(stack.settings, env, stack.registry)}
    row = rows[MODEL]
    assert row["drift"], row
    assert row["drift"][0].startswith(f"the store has no {MODEL}/config.pbtxt (alias names v2, v2 serves)")
    with TritonControl(stack.url) as triton:  # gone from the repository index, still loaded
        assert triton.is_ready(MODEL, "2")

    stack.promote("2")
    rows = {r["model"]: r for r in model_status(stack.settings, env, stack.registry)}
    assert rows[MODEL]["drift"] == []
    assert (stack.serving(), stack.desired(), stack.alias()) == (["2"], ["2"], "2")


@pytest.mark.usefixtures("serving_v2")
def test_a_store_the_targets_do_not_serve_from_is_refused_and_never_unloads(
    stack: Stack, tmp_path: Path
) -> None:
    """Item 4: an environment whose store is another folder (a copy-paste mistake) holding another
    model: the pre-deploy check refuses (the target's repository index lists none of the store's
    models); what serves, the store and the alias are untouched."""
    other = tmp_path / "other-store"
    shutil.copytree(TEMPLATE / "image_preprocess", other / "image_preprocess")
    before = refusal_state(stack.settings.local_repository, [stack.url], stack.registry)
    wrong = store_files(other)
    with pytest.raises(PromotionError, match="does not serve from the store"):
        stack.promote("1", store=str(other))
    assert (stack.serving(), stack.desired(), stack.alias()) == (["2"], ["2"], "2")
    # the store Triton serves from, Triton's whole index, every alias -- and the wrong store: no
    # upload, no config, no archive there either
    assert refusal_state(stack.settings.local_repository, [stack.url], stack.registry) == before
    assert store_files(other) == wrong
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-store"]

    assert stack.promote("2").noop  # the rerun on the right store: nothing to do


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir(parents=True)
    for command in (["mount"], ["sudo", "-n", "mount"]):
        if shutil.which(command[0]) is None:
            continue
        done = subprocess.run(
            [*command, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=False
        )
        if done.returncode == 0:
            return True
    return False


def _umount(folder: Path) -> None:
    """Lazily: this process's MLflow client may still hold the database open."""
    for command in (["umount", "-l"], ["sudo", "-n", "umount", "-l"]):
        if shutil.which(command[0]) is None:
            continue
        if subprocess.run([*command, str(folder)], check=False, capture_output=True).returncode == 0:
            return


def _home_files(home: Path) -> dict[str, str]:
    """Every file under ``home`` and its sha256, and every folder (``"folder"``: an empty one left
    behind counts), MLflow's database aside (a failed run is written there, marked FAILED and
    deleted: its rows are checked through MLflow)."""
    return {
        str(path.relative_to(home)): hashlib.sha256(path.read_bytes()).hexdigest()
        if path.is_file()
        else "folder"
        for path in sorted(home.rglob("*"))
        if not path.name.startswith("mlflow.db")
    }


def test_a_full_disk_during_register_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    """Item 7 on a real full disk: a 6 MB tmpfs under MLREG_HOME (mounted as root, or with
    passwordless sudo as on GitHub's runners).  A 3 MB artifact after a 5 MB one: "disk full at
    MLREG_HOME", no traceback, the partial artifact removed and the folders MLflow made for it (the
    run's and the logged model's: issue 38 item 11 found both left empty), the run and the logged
    model FAILED and deleted; once space is back the same register works."""
    home = tmp_path / "home"
    if not _mount_tmpfs(home, "6m"):
        pytest.fail("cannot mount a tmpfs (needs root or passwordless sudo): the disk-full test needs one")
    try:
        env = {**os.environ, "MLREG_HOME": str(home)}
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("MLREG_DEBUG", None)

        def mlreg(name: str, folder: Path) -> subprocess.CompletedProcess[str]:
            return forkcli.run(["register", name, str(folder)], cwd=ROOT, env=env, timeout=300)

        big = _version(tmp_path / "big" / MODEL, "big")
        (big / "1" / "weights.bin").write_bytes(os.urandom(5_000_000))
        assert mlreg(MODEL, big).returncode == 0
        full = _version(tmp_path / "full" / MODEL, "full")
        (full / "1" / "weights.bin").write_bytes(os.urandom(3_000_000))
        files = _home_files(home)
        failed = mlreg(MODEL, full)
        assert failed.returncode == RegistryError.exit_code, failed.stderr
        assert "Traceback" not in failed.stderr
        assert f"error: disk full at {home}" in failed.stderr, failed.stderr
        assert "tracking server" not in failed.stderr
        assert _home_files(home) == files  # every file and folder under MLREG_HOME (the db aside)
        leftovers = [p for p in home.rglob("weights.bin")]
        assert len(leftovers) == 1, leftovers  # only the first registration's

        settings = Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]})
        client = MlflowRegistry(settings).connection.client
        runs = client.search_runs(
            [e.experiment_id for e in client.search_experiments()],
            run_view_type=3,  # ALL
        )
        assert [str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")] == ["1"]
        failed_runs = [r for r in runs if r.info.status == "FAILED"]
        assert len(failed_runs) == 1
        assert failed_runs[0].info.lifecycle_stage == "deleted"
        assert not [r for r in runs if r.info.status == "RUNNING"]

        leftovers[0].unlink()  # space back
        again = mlreg(MODEL, full)
        assert again.returncode == 0, again.stderr
        assert "registered version 2" in again.stdout
    finally:
        _umount(home)


def _fill(disk: Path, keep: int) -> Path:
    """A file taking all of ``disk``'s free space but ``keep`` bytes."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with filler.open("wb") as out:
        os.posix_fallocate(out.fileno(), 0, max(stats.f_bavail * stats.f_frsize - keep, 1))
    return filler


def _signing_key(folder: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = folder / "release.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key


def test_a_full_disk_during_sign_leaves_no_signature_and_a_rerun_signs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38 item 5 on a real full disk: a version registered on a 6 MB tmpfs under MLREG_HOME,
    the disk then filled but for nothing (the signature's upload fails) or one page (the signature is
    written, the tag's update fails: it stayed in the run while ``versions`` said unsigned).  Both:
    exit 4 "disk full", and the fix's "what the failed command wrote was removed" holds -- no
    signature in the version's run, no ``signed_by`` tag, every file and folder under MLREG_HOME as
    before.  Once space is back the same ``sign`` signs and ``versions`` says by whom."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "6m"):
        pytest.fail("cannot mount a tmpfs (needs root or passwordless sudo): the disk-full test needs one")
    try:
        home = disk / "home"
        monkeypatch.setenv("MLREG_HOME", str(home))
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        monkeypatch.delenv("MLREG_DEBUG", raising=False)
        registry = MlflowRegistry(Settings.from_env())
        run_id = register(registry, find_candidate(_version(tmp_path / "v1" / MODEL, "v1"))).run_id
        signature = Path(registry.runs.artifact_uri(run_id).removeprefix("file://")) / SIGNATURE_ARTIFACT
        key, runner, files = _signing_key(tmp_path), CliRunner(), _home_files(home)
        failed_steps = []
        for keep in (0, 4096):
            filler = _fill(disk, keep)
            result = runner.invoke(app, ["sign", MODEL, "1", "--sign-key", str(key)])
            filler.unlink()
            assert result.exit_code == RegistryError.exit_code, result.output
            assert "Traceback" not in result.output
            assert f"error: disk full at {home}: MLflow " in result.output, result.output
            assert "(what the failed command wrote was removed)" in result.output
            failed_steps.append(result.output.split("MLflow ")[1].split(" failed")[0])
            assert not signature.exists()
            assert SIGNED_BY_TAG not in registry.models.version_tags(MODEL, "1")
            assert _home_files(home) == files  # every file and folder (the db aside)
        assert failed_steps == ["artifact upload", "tag update"]  # both sides of the signature's write

        signed = runner.invoke(app, ["sign", MODEL, "1", "--sign-key", str(key)])
        assert signed.exit_code == 0, signed.output
        signer = registry.models.version_tags(MODEL, "1")[SIGNED_BY_TAG]
        assert f"{MODEL}: version 1 signed by {signer}" in signed.output
        assert signature.is_file()
        listed = runner.invoke(app, ["versions", MODEL])
        assert signer in listed.output.splitlines()[1], listed.output
    finally:
        _umount(disk)
