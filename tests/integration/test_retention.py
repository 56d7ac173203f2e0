"""Store retention on the real parts: moto_server S3, a real tritonserver on it, the embedded MLflow
registry; then the same on a local store with its own tritonserver.

In file order on one module-scoped stack: twelve promotions of a python model with ``keep = 2``
leave the serving version and the one before it under Triton's prefix and the rest archived with
their manifests; a rollback to archived version 3 serves it after verification (a server-side copy,
nothing uploaded); a promotion SIGKILLed mid-archive loses nothing and a rerun finishes the move;
``store gc --dry-run`` lists and changes nothing; a version an ensemble pins is never archived (by
``store gc`` or a promotion); the same on a local store.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from mlreg.ops.rollback import rollback
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed, PromotionResult
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.storage.archive import archive_of
from pipelines.storage.base import Repository
from pipelines.triton.control import TritonControl
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.cli import CliRunner
from tests.conftest import failing_python_model
from tests.integration import forkcli
from tests.integration.stacks import (
    SCORER_CONFIG,
    SCORER_MODEL,
    mlreg_process,
    paused_mlreg,
    ready_versions,
    refusal_state,
    register_model,
    register_scorer,
    s3_repository,
    stack_settings,
    tritons,
    unloaded_on,
)

pytestmark = pytest.mark.integration

PINNING = """name: "scoring"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "scorer" model_version: PIN
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
"""
WEIGHTS = 256 * 1024  # per version: small here; benchmarks/retention.py uses 8 MB


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    root: Path
    env_vars: dict[str, str]
    s3_url: str
    disk_url: str

    def register(self, tag: str) -> str:
        return register_scorer(self.registry, self.root / "work", tag, WEIGHTS)

    def promote(self, env_name: str, version: str) -> PromotionResult:
        env = environment(self.settings, env_name)
        return Promotion(self.settings, env, self.registry, Options(skip_quality=True)).run("scorer", version)

    def store(self, env_name: str) -> Repository:
        return open_store(environment(self.settings, env_name).store)

    def digest(self, version: str) -> str:
        return self.registry.models.version_tags("scorer", version)["artifact_digest"]

    def states(self, url: str) -> dict[str, dict[str, str]]:
        with TritonControl(url) as triton:
            return triton.model_states()

    def ready(self, url: str) -> list[str]:
        return ready_versions(url, "scorer")

    def cli(self, *args: str) -> forkcli.Process:
        return mlreg_process(self.env_vars, *args)

    def state(self, env_name: str) -> dict[str, Any]:
        """What a refusal must leave alone (stacks.refusal_state): the store's and its archive's
        objects, the environment's Triton (whole index and pins), every alias of every model."""
        url = self.s3_url if env_name == "s3" else self.disk_url
        return refusal_state(environment(self.settings, env_name).store, [url], self.registry)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("retention")
    settings, env_vars = stack_settings(root)
    s3_store = s3_repository(s3_server, "retention")
    disk_store = root / "disk" / "repository"
    disk_store.mkdir(parents=True)
    with tritons(settings, root, [s3_store, str(disk_store)]) as servers:
        (s3_url, disk_url) = (info.grpc_url for info, _ in servers)
        (root / "mlreg.toml").write_text(
            f'[environments.s3]\nstore = "{s3_store}"\ntargets = ["{s3_url}"]\ngpu = false\nkeep = 2\n'
            f'[environments.disk]\nstore = "{disk_store}"\ntargets = ["{disk_url}"]\ngpu = false\n'
        )
        yield Stack(settings, MlflowRegistry(settings), root, env_vars, s3_url, disk_url)


def archived_whole(stack: Stack, archive: Repository, versions: list[str]) -> None:
    """Each version in the archive with its manifest, every file matching it and the registered digest."""
    assert archive.list_versions("scorer") == versions
    for version in versions:
        assert archive.versions.read_manifest("scorer", version) is not None, version
        archive.versions.verify_version("scorer", version, stack.digest(version), full=True)


def test_twelve_promotions_leave_what_serves_and_the_one_before_it_under_triton_s_prefix(
    stack: Stack,
) -> None:
    results = []
    for index in range(1, 13):
        assert stack.register(f"v{index}") == str(index)
        results.append(stack.promote("s3", str(index)))
    store = stack.store("s3")
    assert store.list_versions("scorer") == ["11", "12"]
    archived_whole(stack, archive_of(store), [str(v) for v in range(1, 11)])
    assert archive_of(store).uri.endswith("/retention/.mlreg-archive/repository")
    assert stack.ready(stack.s3_url) == ["12"]
    assert ".mlreg-archive" not in stack.states(stack.s3_url)  # Triton never sees the archive:
    assert not archive_of(store).uri.startswith(store.uri.rstrip("/") + "/")  # it is outside its prefix
    archived = [next((s.detail for s in r.stages if s.stage == "archive"), "") for r in results]
    retained = [s.detail for r in results for s in r.stages if s.stage == "retain"]
    assert retained == [], (retained, archived)  # every move happened before the load
    for result in results[2:]:  # its own stage, after the upload and before any load
        names = result.stage_names()
        assert names.index("assemble") < names.index("archive") < names.index("deploy"), names
    size = WEIGHTS + len(f"# v1\n{SCORER_MODEL}")
    assert archived[2] == f"keep 2: archived scorer v1 ({size:,} bytes)"
    assert all(f"keep 2: archived scorer v{i - 2} (" in archived[i - 1] for i in range(3, 13))
    assert archived[:2] == ["", ""]  # nothing beyond the window yet: the stage did not run
    keys = store.objects.list_prefix("scorer/")
    assert {k.split("/")[1] for k in keys} == {"config.pbtxt", "11", "12"}  # what a load localizes


def test_a_rollback_to_an_archived_version_serves_it_after_verification(stack: Stack) -> None:
    result = rollback(stack.settings, "s3", "scorer", "3")
    assert result.ok
    assemble = next(s for s in result.stages if s.stage == "assemble")
    assert assemble.detail.startswith("0 bytes uploaded")  # a server-side copy from the archive
    archived = next(s for s in result.stages if s.stage == "archive")
    assert archived.detail.startswith("keep 2: archived scorer v11 (")  # before the load
    assert stack.ready(stack.s3_url) == ["3"]
    assert stack.registry.models.aliases("scorer")["s3"] == "3"
    store = stack.store("s3")
    store.versions.verify_version("scorer", "3", stack.digest("3"), full=True)
    assert store.list_versions("scorer") == ["3", "12"]  # what serves, and the one before it
    retain = result.stages[-1]  # once the alias moved: v3's archive copy is not needed any more
    assert (retain.stage, retain.detail) == (
        "retain",
        "keep 2: archived nothing (0 bytes); the archive's copy of scorer v3 dropped (live again)",
    )
    archived_whole(stack, archive_of(store), [str(v) for v in (1, 2, 4, 5, 6, 7, 8, 9, 10, 11)])


def test_a_promotion_killed_mid_archive_loses_nothing_and_a_rerun_finishes(stack: Stack) -> None:
    """Killed between the archive's copy and the live copy's delete (S3: a server-side copy, then
    a delete): both are whole, ``store verify`` says so, and the rerun finishes the move."""
    assert stack.register("v13") == "13"
    args = ("promote", "scorer", "--version", "13", "--env", "s3", "--skip-quality")
    point = "archive-copied:scorer/12"  # 13 will serve, 3 serves now: 12 leaves before the load
    with paused_mlreg(stack.env_vars, point, *args) as paused:
        paused.kill()
    store = stack.store("s3")
    assert stack.ready(stack.s3_url) == ["3"]  # killed before the load
    assert serving_versions(store.read_config("scorer")) == ["3"]  # the store's config as it was
    assert stack.registry.models.aliases("scorer")["s3"] == "3"  # and the alias
    verify = CliRunner().invoke(
        app, ["store", "verify", "scorer", "12", "--store", store.uri, "--json"], env=stack.env_vars
    )
    assert verify.exit_code == 0, verify.output
    found = sorted((v["location"], v["status"]) for v in json.loads(verify.stdout)["versions"])
    assert found == [("archived", "verified"), ("live", "verified")]  # both whole: nothing lost
    rerun = stack.cli(*args)  # the killed holder's locks are stale: taken over
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert "promoted scorer version 13" in out
    assert stack.ready(stack.s3_url) == ["13"]
    assert stack.registry.models.aliases("scorer")["s3"] == "13"
    assert store.list_versions("scorer") == ["3", "13"]
    archived_whole(stack, archive_of(store), [str(v) for v in (1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12)])


def _broken(stack: Stack) -> str:
    """A version of scorer that fails to load (identical bytes: the same version every time)."""
    files: dict[str, str | bytes] = {"model.py": failing_python_model("cannot open the weights")}
    folder = Path(tempfile.mkdtemp(prefix="broken-", dir=stack.root / "work")) / "scorer"
    return register_model(stack.registry, folder, "scorer", SCORER_CONFIG, files)


def test_a_failed_promotion_puts_back_what_it_archived_before_the_load(stack: Stack) -> None:
    version = _broken(stack)
    before = stack.state("s3")
    with pytest.raises(PromotionFailed, match="rolled back, the previous versions serve") as info:
        stack.promote("s3", version)
    archived = next(s for s in info.value.result.stages if s.stage == "archive")
    assert archived.detail.startswith("keep 2: archived scorer v3 (")  # 3 left before the load ...
    # ... and came back: every object of the store and the archive, every alias, Triton's whole index
    # (listing the version that failed to load, UNAVAILABLE) and pins as they were
    assert stack.state("s3") == unloaded_on(before, stack.s3_url, "scorer", version)
    rollback = next(s for s in info.value.result.stages if s.stage == "rollback")
    assert "scorer/3 back from the archive" in rollback.detail  # the report says so
    assert stack.ready(stack.s3_url) == ["13"]
    assert stack.registry.models.aliases("scorer")["s3"] == "13"


def test_store_gc_dry_run_lists_and_changes_nothing(stack: Stack) -> None:
    before = stack.state("s3")
    runner = CliRunner()
    result = runner.invoke(
        app, ["store", "gc", "--env", "s3", "--keep", "1", "--dry-run"], env=stack.env_vars
    )
    assert result.exit_code == 0, result.output
    assert "keep 1: would move to the archive" in result.stdout
    assert "1 version(s), would free" in result.stdout
    assert stack.state("s3") == before  # the store's and the archive's objects, Triton, the aliases
    assert stack.ready(stack.s3_url) == ["13"]


def test_a_version_an_ensemble_pins_is_never_archived(stack: Stack) -> None:
    """Neither by ``store gc`` nor by a promotion's ``make_room`` (the archive stage, before the
    load), which would otherwise move v3: the new version and v13, serving, fill the window."""
    store = stack.store("s3")
    store.session.write_config("scoring", PINNING.replace("PIN", "3"))  # an ensemble of the store pins v3
    try:
        runner = CliRunner()
        result = runner.invoke(
            app, ["store", "gc", "--env", "s3", "--keep", "1", "--json"], env=stack.env_vars
        )
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["moves"] == []
        assert report["protected"] == {"scorer": {"3": "pinned by ensemble scoring"}}
        assert store.list_versions("scorer") == ["3", "13"]
        version = _broken(stack)
        before = stack.state("s3")
        with pytest.raises(PromotionFailed, match="rolled back, the previous versions serve") as info:
            stack.promote("s3", version)  # fails at its load, after the archive stage
        archived = next(s for s in info.value.result.stages if s.stage == "archive")
        pinned = "kept beyond the window: scorer v3 (pinned by ensemble scoring)"
        assert archived.detail == f"keep 2: archived nothing (0 bytes); {pinned}"
        assert stack.state("s3") == unloaded_on(before, stack.s3_url, "scorer", version)
    finally:
        store.objects.delete("scoring/config.pbtxt")


def test_the_same_on_a_local_store(stack: Stack) -> None:
    for version in ("1", "2", "3", "4"):
        assert stack.promote("disk", version).ok
    store = stack.store("disk")
    assert store.list_versions("scorer") == ["3", "4"]
    archive = archive_of(store)
    assert Path(archive.uri) == stack.root / "disk" / ".mlreg-archive" / "repository"
    archived_whole(stack, archive, ["1", "2"])
    assert stack.ready(stack.disk_url) == ["4"]
    assert ".mlreg-archive" not in stack.states(stack.disk_url)
    assert not Path(archive.uri).is_relative_to(Path(store.uri))  # outside Triton's repository
    result = rollback(stack.settings, "disk", "scorer", "1")
    assert result.ok
    assert stack.ready(stack.disk_url) == ["1"]
    store.versions.verify_version("scorer", "1", stack.digest("1"), full=True)
    assert store.list_versions("scorer") == ["1", "4"]
    archived_whole(stack, archive, ["2", "3"])


@pytest.mark.parametrize(("env_name", "version"), [("s3", "5"), ("disk", "2")])
def test_an_archived_copy_corrupted_in_place_is_never_served(
    stack: Stack, env_name: str, version: str
) -> None:
    """Issue 32 item 3: the archive's copy of a version changed in place (same size, other bytes); a
    rollback to it never serves those bytes: the copy brought back fails verification, and the
    version served is the registry's, verified against the registered digest."""
    store = stack.store(env_name)
    archive = archive_of(store)
    key = f"scorer/{version}/model.py"
    good = archive.objects.read(key)
    assert good is not None, archive.objects.list_prefix("scorer/")
    assert b"# v" in good
    archive.objects.write(key, good.replace(b"# v", b"#-v", 1))  # same size: only the hash can tell
    result = rollback(stack.settings, env_name, "scorer", version)
    assert result.ok
    url = stack.s3_url if env_name == "s3" else stack.disk_url
    assert stack.ready(url) == [version]
    assert store.objects.read(key) == good  # the registered bytes serve, not the archive's
    store.versions.verify_version("scorer", version, stack.digest(version), full=True)
    assert stack.registry.models.aliases("scorer")[env_name] == version
