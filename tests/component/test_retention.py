"""Retention on a real local store: the window's rules, the archive beside the store, moves that a
crash can cut short at any point without losing a version, ``store gc`` (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.promote import retention
from pipelines.promote.environments import environment
from pipelines.storage import open_store
from pipelines.storage.archive import archive_of, bring_back, complete, move_to_archive
from pipelines.storage.base import Repository
from pipelines.storage.s3 import S3Objects
from registry.errors import StorageError, TritonError, UsageError
from registry.settings import Settings
from tests.cli import CliRunner

CONFIG = 'name: "m"\nbackend: "python"\nversion_policy: {{ specific: {{ versions: [{versions}] }} }}\n'
ENSEMBLE = (
    'name: "ens"\nplatform: "ensemble"\nensemble_scheduling { step [ { model_name: "m" '
    'model_version: PIN input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }\n'
)

SIZE = len("VERSION = 1\n") + 4096 + 1  # model.py + weights.bin of one version


def push(store: Repository, tmp: Path, model: str, version: str, payload: bytes = b"w" * 4096) -> None:
    folder = tmp / "src" / model / version
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(f"VERSION = {version}\n")
    (folder / "weights.bin").write_bytes(payload + version.encode())
    store.versions.put_version(model, version, folder)


@pytest.fixture
def store(tmp_path: Path) -> Repository:
    """``m`` v1..v5 in a local store whose config serves v5."""
    store = open_store(tmp_path / "home" / "model_repository")
    for version in "12345":
        push(store, tmp_path, "m", version)
    store.session.write_config("m", CONFIG.format(versions="5"))
    return store


def no_stamp(model: str, version: str) -> str:
    return ""


def test_the_window_keeps_what_serves_then_what_served_before_then_the_latest_promoted() -> None:
    live = ["1", "2", "3", "12"]
    stamps = {"3": "2026-12-04T09:00:00Z", "12": "2026-12-04T08:00:00Z"}

    def stamp(model: str, version: str) -> str:
        return stamps.get(version, "")

    assert retention.window(2, live, ["3"], ["12"], stamp, "m") == ["3", "12"]
    assert retention.window(2, live, ["12"], [], stamp, "m") == ["12", "3"]  # 3 promoted last
    assert retention.window(3, live, ["12"], [], no_stamp, "m") == ["12", "3", "2"]  # then by number
    assert retention.window(1, live, ["2", "3"], [], no_stamp, "m") == ["2", "3"]  # all it serves


def test_the_archive_sits_beside_the_store_never_in_it(store: Repository, tmp_path: Path) -> None:
    archive = archive_of(store)
    assert archive.uri == str(tmp_path / "home" / ".mlreg-archive" / "model_repository")
    s3 = Repository(
        S3Objects(
            "bucket", "models/staging", "http://127.0.0.1:9", uri="s3://127.0.0.1:9/bucket/models/staging"
        )
    )
    assert s3.archive().uri == "s3://127.0.0.1:9/bucket/models/.mlreg-archive/staging"
    assert Repository(S3Objects("bucket", "staging")).archive().uri == "s3://bucket/.mlreg-archive/staging"
    with pytest.raises(
        StorageError, match="a store at the root of bucket 'bucket' has no place for an archive"
    ):
        Repository(S3Objects("bucket", "")).archive()


def test_a_local_move_is_a_rename_and_the_version_comes_back_whole(store: Repository) -> None:
    archive = archive_of(store)
    manifest = store.versions.read_manifest("m", "2")
    assert manifest is not None
    assert move_to_archive(store, archive, "m", "2") == SIZE
    assert store.list_versions("m") == ["1", "3", "4", "5"]
    assert archive.list_versions("m") == ["2"]
    assert archive.versions.read_manifest("m", "2") == manifest  # the manifest travels with the files
    archive.versions.verify_version("m", "2", manifest.digest)
    assert bring_back(store, archive, "m", "2")
    store.versions.verify_version("m", "2", manifest.digest)
    assert archive.list_versions("m") == ["2"]  # kept until the version is live again for good
    assert not bring_back(store, archive, "m", "9")


def test_an_incomplete_version_is_never_the_archive_s_only_copy(store: Repository) -> None:
    store.objects.delete("m/3/weights.bin")
    with pytest.raises(StorageError, match="m/3 is incomplete or does not match its manifest; not moved to "):
        move_to_archive(store, archive_of(store), "m", "3")
    assert store.list_versions("m") == ["1", "2", "3", "4", "5"]


def test_a_move_cut_short_by_a_crash_is_finished_and_loses_nothing(store: Repository) -> None:
    """The two states a crash can leave on S3 (a local move is one rename): the archive's copy
    partial beside the whole live one, and the live one partly deleted beside a whole copy."""
    archive = archive_of(store)
    store.objects.copy_object_to("m/1/model.py", archive.objects, "m/1/model.py")  # cut short: no manifest
    report = retention.plan(store, archive, ["m"], 2, {}, no_stamp)
    assert [(m.model, m.version) for m in report.moves] == [("m", "1"), ("m", "2"), ("m", "3")]
    for key in store.objects.list_prefix("m/2/"):
        store.objects.copy_object_to(key, archive.objects, key)  # copy finished ...
    store.objects.delete("m/2/model.py")  # ... and the delete cut short
    retention.apply(store, archive, report)
    assert report.failed == []
    assert store.list_versions("m") == ["4", "5"]
    assert archive.list_versions("m") == ["1", "2", "3"]
    for version in "123":
        assert complete(archive.versions, "m", version) is not None
        archive.versions.verify_version("m", version)


def test_what_an_ensemble_pins_or_a_target_holds_is_never_archived(store: Repository) -> None:
    store.session.write_config("ens", ENSEMBLE.replace("PIN", "1"))
    held = {"127.0.0.1:8001": {"m": {"5": "READY", "3": "LOADING", "2": "UNLOADING", "4": "UNAVAILABLE"}}}
    report = retention.plan(store, archive_of(store), ["m"], 1, held, no_stamp)
    assert [m.version for m in report.moves] == ["2", "4"]
    assert report.kept == {"m": ["1", "3", "5"]}
    assert report.protected == {"m": {"1": "pinned by ensemble ens", "3": "held by 127.0.0.1:8001 (LOADING)"}}


def test_gc_dry_run_lists_and_changes_nothing_then_gc_moves(store: Repository) -> None:
    before = store.objects.list_prefix("")
    report = retention.collect(store, dict, no_stamp, 2, dry_run=True)
    assert [(m.version, m.bytes) for m in report.moves] == [(v, SIZE) for v in "123"]
    assert report.bytes_freed == 3 * SIZE
    assert store.objects.list_prefix("") == before
    assert archive_of(store).list_models() == []
    done = retention.collect(store, dict, no_stamp, 2)
    assert [m.version for m in done.moves] == ["1", "2", "3"]
    assert store.list_versions("m") == ["4", "5"]


def test_gc_refuses_when_a_target_cannot_be_asked(store: Repository) -> None:
    def ask() -> retention.States:
        return {"10.0.0.9:8001": TritonError("10.0.0.9:8001: unreachable")}

    with pytest.raises(TritonError, match="cannot ask every target what it holds, so nothing is archived"):
        retention.collect(store, ask, no_stamp, 2)
    assert store.list_versions("m") == ["1", "2", "3", "4", "5"]
    assert retention.collect(store, dict, no_stamp, 0).skipped == "retention is off (keep = 0)"


def test_keep_in_mlreg_toml(tmp_path: Path) -> None:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    toml = tmp_path / "mlreg.toml"
    toml.write_text(
        '[environments.a]\nstore = "s"\ntargets = ["h:1"]\n[environments.b]\nstore = "s"\nkeep = 0\n'
    )
    assert environment(settings, "a").keep == 2
    assert environment(settings, "b").keep == 0
    assert environment(settings, "local").keep == 2
    toml.write_text('[environments.c]\nstore = "s"\nkeep = "two"\n')
    with pytest.raises(
        UsageError, match="environment 'c': keep must be a number of versions \\(0 or more\\)"
    ):
        environment(settings, "c")


def test_store_gc_and_ls_on_the_cli(
    store: Repository, registry_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(registry_home))  # the local store is home/model_repository
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runner = CliRunner()
    dry = runner.invoke(app, ["store", "gc", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert [m["version"] for m in json.loads(dry.stdout)["moves"]] == ["1", "2", "3"]
    assert store.list_versions("m") == ["1", "2", "3", "4", "5"]
    done = runner.invoke(app, ["store", "gc", "--keep", "1"])
    assert done.exit_code == 0, done.output
    assert f"4 version(s), freed {4 * SIZE:,} bytes under the prefix Triton reads" in done.stdout
    listing = runner.invoke(app, ["store", "ls", "--store", store.uri])
    rows = [line.split() for line in listing.stdout.splitlines()[1:]]
    assert rows == [["m", "5", "unverified", "2"]] + [["m", v, "archived", "2"] for v in "1234"]
    verify = runner.invoke(app, ["store", "verify", "m", "3", "--store", store.uri])
    assert verify.exit_code == 0, verify.output
    assert verify.stdout.startswith("m/3 (archived): verified (2 file(s)")


def test_every_triton_mlreg_starts_or_deploys_is_told_not_to_write_bytecode() -> None:
    """The local stack, compose and Kubernetes start tritonserver with PYTHONDONTWRITEBYTECODE=1 (2.51's
    python stub ignores it -- its interpreter runs isolated -- so verification still tolerates
    __pycache__ in a local store's version folder)."""
    import yaml

    from pipelines.devstack import local_triton
    from tests.conftest import ROOT

    assert local_triton.server_env(local_triton.locate_triton(), {})["PYTHONDONTWRITEBYTECODE"] == "1"
    compose = yaml.safe_load((ROOT / "infra" / "compose" / "compose.yaml").read_text())
    assert compose["services"]["triton"]["environment"]["PYTHONDONTWRITEBYTECODE"] == "1"
    [deployment] = [
        doc
        for doc in yaml.safe_load_all((ROOT / "infra" / "k8s" / "base" / "triton.yaml").read_text())
        if doc and doc.get("kind") in {"Deployment", "StatefulSet"}
    ]
    [triton] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton"]
    assert {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"} in triton["env"]
