"""The local stack's first-day surprises (issue 48 item 4): ``stack up --s3`` on a promoted or an
empty project, and a restarted stack bringing back what its store says should serve.

Real parts: a promoted local store (the promotion of tests/unit/worlds.py writes its manifests and
configs), the session's real moto_server, the in-process stand-in Triton of tests/standin_triton.py
(it reads the store folder as Triton 2.51 reads its repository)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipelines.devstack import local_s3
from pipelines.devstack.restore import desired_state, restore_served
from pipelines.devstack.seed import seed_store
from pipelines.storage import ensure_root, open_store
from pipelines.storage.base import MANIFEST, Repository
from pipelines.storage.push import push_path
from pipelines.triton.control import TritonControl
from registry.errors import StorageError
from tests.standin_triton import StandinFleet
from tests.unit.worlds import World


def _bucket(request: pytest.FixtureRequest) -> Repository:
    server = request.getfixturevalue("s3_server")
    bucket = f"seed-{uuid.uuid4().hex[:12]}"
    local_s3.create_bucket(server.endpoint, bucket)
    return open_store(server.store_uri(bucket, "model_repository"))


def _promoted(tmp_path: Path) -> World:
    world = World(tmp_path)
    assert world.promote("ens", "1").ok
    return world


def _digest(world: World):  # type: ignore[no-untyped-def]
    return lambda model, version: world.registry.tags.get((model, version), {}).get("artifact_digest")


def test_seed_copies_a_promoted_repository_manifests_created_never_pushed_as_files(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    world = _promoted(tmp_path)
    source, target = open_store(world.store_root), _bucket(request)
    # what `stack up --s3` did before: the manifest sent as a file, then its create collides
    with pytest.raises(StorageError, match="another writer|manifest"):
        push_path(_bucket(request), world.store_root)

    seeded = seed_store(source, world.store_root, target)

    assert seeded.models == {"ens": ["1"], "net": ["1"], "pre": ["1"]}
    for model in ("ens", "net", "pre"):
        assert target.read_config(model) == source.read_config(model)  # the promotion's config
        assert target.objects.read(f"{model}/1/{MANIFEST}") == source.objects.read(f"{model}/1/{MANIFEST}")
        # the copy verifies against MLflow's digest, as a promotion's load would
        target.versions.verify_version(model, "1", world.registry.tags[(model, "1")]["artifact_digest"])
    assert target.session.locks() == []  # its own locks released; none of the source's copied
    assert not [k for k in target.objects.list_prefix("") if "__pycache__" in k]


def test_seed_of_an_empty_project_copies_nothing_and_marks_the_root(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    root = tmp_path / "model_repository"
    root.mkdir()
    target = _bucket(request)
    with pytest.raises(StorageError, match="holds no model folder"):  # what `stack up --s3` said
        push_path(target, root)
    seeded = seed_store(open_store(root), root, target)
    assert seeded.models == {}
    assert seeded.files == 0
    assert ensure_root(target.uri)  # Triton can start on it: the root marker, nothing else
    assert target.objects.list_prefix("") == [".mlreg-root.json"]


def test_seed_refuses_a_version_whose_manifest_is_there_already(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    world = _promoted(tmp_path)
    target = _bucket(request)
    target.objects.write(f"pre/1/{MANIFEST}", b"{}")  # someone else's
    with pytest.raises(StorageError, match="already has a manifest"):
        seed_store(open_store(world.store_root), world.store_root, target)
    assert target.objects.read(f"pre/1/{MANIFEST}") == b"{}"  # never overwritten


def test_desired_state_is_the_promoted_configs_members_first(tmp_path: Path) -> None:
    world = _promoted(tmp_path)
    wanted = desired_state(open_store(world.store_root))
    assert [(d.model, d.versions) for d in wanted] == [("net", ("1",)), ("pre", ("1",)), ("ens", ("1",))]
    assert wanted[-1].members == ("pre", "net")


def test_a_restarted_stack_serves_what_the_store_says_verified_only(tmp_path: Path) -> None:
    world = _promoted(tmp_path)
    store = open_store(world.store_root)
    with StandinFleet(world.store_root, 1, load_delay=0.01) as fleet:  # a fresh server: serves nothing
        (url,) = fleet.urls
        assert fleet.replica(url).states() == {}
        with TritonControl(url, timeout=5, load_timeout=10) as triton:
            restored = restore_served(store, [url], lambda _: triton, _digest(world), ready_timeout=5)
            states = fleet.replica(url).states()
    assert restored.loaded == ["net:1", "pre:1", "ens:1"]
    assert restored.left == []
    assert states == {
        "net": {"1": "READY"},
        "pre": {"1": "READY"},
        "ens": {"1": "READY"},
    }


def test_a_restart_never_loads_bytes_that_do_not_verify_nor_an_ensemble_over_them(tmp_path: Path) -> None:
    world = _promoted(tmp_path)
    (world.store_root / "net" / "1" / "model.py").write_text("raise SystemExit('not registered')\n")
    store = open_store(world.store_root)
    with StandinFleet(world.store_root, 1, load_delay=0.01) as fleet:
        (url,) = fleet.urls
        with TritonControl(url, timeout=5, load_timeout=10) as triton:
            restored = restore_served(store, [url], lambda _: triton, _digest(world), ready_timeout=5)
            states = fleet.replica(url).states()
    assert restored.loaded == ["pre:1"]
    assert restored.left[0].startswith("net v1: ")
    assert "model.py" in restored.left[0]
    assert restored.left[1] == "ens v1: its member(s) net were not loaded"
    assert set(states) == {"pre"}  # neither the tampered member nor the ensemble over it


def test_a_restart_loads_nothing_mlflow_did_not_register(tmp_path: Path) -> None:
    world = _promoted(tmp_path)
    with StandinFleet(world.store_root, 1, load_delay=0.01) as fleet:
        (url,) = fleet.urls
        with TritonControl(url, timeout=5, load_timeout=10) as triton:
            restored = restore_served(
                open_store(world.store_root), [url], lambda _: triton, lambda m, v: None, ready_timeout=5
            )
            states = fleet.replica(url).states()
    assert restored.loaded == []
    assert states == {}
    assert "net v1: v1 has no digest registered in MLflow" in restored.left


def test_a_failed_s3_start_stops_the_moto_server_it_started(tmp_path: Path) -> None:
    """An empty project (nothing promoted yet) is copied to S3 as nothing; then the stack's
    tritonserver cannot start (its ports are taken): the moto_server this start started is stopped
    and its record removed -- no server left running behind a stack that says it is not running."""
    import socket

    from pipelines.devstack import processes
    from pipelines.devstack.stack import s3_state_file, stack_status, stack_up
    from registry.errors import StackError
    from registry.settings import Settings

    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    started: list[int] = []
    real_write = processes.write_state

    def noting(path: Path, state: dict[str, object]) -> None:  # the moto_server's pid, as recorded
        if path == s3_state_file(settings):
            started.append(int(str(state["pid"])))
        real_write(path, state)

    try:
        with socket.socket() as busy, pytest.MonkeyPatch.context() as patch:
            busy.bind(("127.0.0.1", 0))
            port = busy.getsockname()[1]
            patch.setattr(processes, "write_state", noting)
            with pytest.raises(StackError, match="already in use"):
                stack_up(settings, s3=True, ports=(port, port, port))
        (pid,) = started
        assert processes.process_gone(pid)  # the moto_server it started is stopped
    finally:  # what a broken stop left running (the test's own moto_server, by its recorded pid)
        for left in started:
            local_s3.stop_s3(left)
    assert not s3_state_file(settings).exists()
    assert not (settings.stack_dir / "triton.json").exists()
    assert stack_status(settings).running is False


def test_the_local_environment_writes_the_store_the_stack_serves(tmp_path: Path) -> None:
    """`stack up --s3` (a real moto_server and tritonserver, an empty project): the built-in local
    environment's store is the S3 store the stack serves, each replica's recorded repository with
    it -- before, promotions wrote .mlreg/model_repository while Triton served the S3 copy."""
    from mlreg.ops.context import environment, store_of
    from pipelines.devstack.stack import stack_up, stop_stack
    from registry.settings import Settings

    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    try:
        status = stack_up(settings, s3=True)
        assert status.info is not None
        served = status.info.repository
        assert served.startswith("s3://127.0.0.1:")
        env = environment(settings, "local")
        assert env.store == served
        assert env.served_from == ((status.info.grpc_url, served),)
        assert store_of(settings, None, "local").uri == served
        assert open_store(env.store).objects.list_prefix("") == [
            ".mlreg-root.json"
        ]  # reachable: the stack's S3
    finally:
        stop_stack(settings)
    assert environment(settings, "local").store == str(settings.local_repository)  # down: the folder


def test_a_target_started_on_another_repository_refuses_before_any_change(tmp_path: Path) -> None:
    """The stack's record says a target serves another repository than the environment's store:
    the promotion refuses before anything is loaded, stored or recorded."""
    import dataclasses

    from registry.errors import PromotionError

    world = World(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    world.env = dataclasses.replace(world.env, served_from=(("t1:8001", str(elsewhere)),))
    with pytest.raises(PromotionError, match="t1:8001 does not serve from the store") as failed:
        world.promote("ens", "1")
    assert f"it was started on {elsewhere}" in failed.value.message
    assert world.loads() == []
    assert open_store(world.store_root).list_models() == []
    assert world.registry.models.aliases("ens") == {}


def test_what_the_s3_server_held_is_copied_back_to_the_projects_folder(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`stack down` of an --s3 stack: moto_server keeps its objects in memory only, so what was
    promoted there goes back to the project's folder it was copied from -- the next start (S3 or
    not) then serves it again (its desired state is the folder's)."""
    from pipelines.devstack.seed import copy_back

    world = _promoted(tmp_path)
    served = _bucket(request)
    seed_store(open_store(world.store_root), world.store_root, served)  # the S3 copy after promotions
    folder = tmp_path / "project"
    folder.mkdir()
    lines = copy_back(served, open_store(folder))
    assert lines == [
        "ens v1",
        "ens: its config (what serves)",
        "net v1",
        "net: its config (what serves)",
        "pre v1",
        "pre: its config (what serves)",
    ]
    back = open_store(folder)
    for model in ("ens", "net", "pre"):
        assert back.objects.read(f"{model}/1/{MANIFEST}") == served.objects.read(f"{model}/1/{MANIFEST}")
        assert back.read_config(model) == served.read_config(model)
        back.versions.verify_version(model, "1", world.registry.tags[(model, "1")]["artifact_digest"])
    assert [(d.model, d.versions) for d in desired_state(back)] == [
        ("net", ("1",)),
        ("pre", ("1",)),
        ("ens", ("1",)),
    ]
    assert copy_back(served, back) == []  # nothing new: nothing written


def _local_world(tmp_path: Path, served: Path) -> tuple[World, StandinFleet]:
    """The promotion's World on the built-in local environment, its one target a stand-in Triton
    serving the folder ``served`` (it lists that folder's folders, as Triton 2.51 does)."""
    import dataclasses

    world = World(tmp_path)
    key = os.environ["MLREG_CONTROL_KEY"]  # tests/conftest.py: what every client of the tests sends
    fleet = StandinFleet(served, 1, load_delay=0.01, key=key)
    fleet.__enter__()
    world.env = dataclasses.replace(world.env, targets=tuple(fleet.urls), local_stack=True)
    return world, fleet


def _promote_on(world: World, model: str) -> Any:
    """``model`` v1 promoted by the promotion's runner on the world's environment, its targets
    reached for real (pipelines.triton.control.TritonControl: the stand-in speaks Triton's gRPC)."""
    from pipelines.core.context import Options
    from pipelines.promote.runner import Promotion

    def connect(url: str) -> TritonControl:
        return TritonControl(url, timeout=5, load_timeout=10)

    promotion = Promotion(
        world.settings, world.env, world.registry, Options(skip_quality=True), connect=connect
    )
    return promotion.run(model, "1")


def test_a_local_target_reading_a_copy_of_the_store_refuses_before_any_change(tmp_path: Path) -> None:
    """The reported surprise without any record to go by: the target serves a copy of the store
    (same models), so the repository index cannot tell them apart -- the folder written to the
    environment's store is not in its index, and the promotion refuses before any change."""
    import shutil

    from registry.errors import PromotionError

    (tmp_path / "first").mkdir()
    seeded = World(tmp_path / "first")
    assert seeded.promote("ens", "1").ok
    copy = tmp_path / "copy"
    shutil.copytree(seeded.store_root, copy)  # the S3 copy `stack up --s3` served
    (tmp_path / "second").mkdir()
    world, fleet = _local_world(tmp_path / "second", copy)
    shutil.rmtree(world.store_root)
    shutil.copytree(seeded.store_root, world.store_root)  # the folder the local environment wrote
    world.registry.tags = seeded.registry.tags
    before = sorted(world.store_root.rglob("*"))
    try:
        with pytest.raises(PromotionError, match="does not serve from the store") as failed:
            _promote_on(world, "pre")
        states = fleet.replica(fleet.urls[0]).states()
    finally:
        fleet.close()
    assert "is not in its repository index" in failed.value.message
    assert states == {}  # nothing loaded
    assert sorted(world.store_root.rglob("*")) == before  # the marker removed, nothing else written
    assert world.registry.models.aliases("pre") == {}


def test_a_local_target_reading_the_store_finds_the_marker_and_it_is_removed(tmp_path: Path) -> None:
    world, fleet = _local_world(tmp_path, tmp_path / "store")
    try:
        result = _promote_on(world, "ens")
        states = fleet.replica(fleet.urls[0]).states()
    finally:
        fleet.close()
    assert result.ok
    assert states["ens"] == {"1": "READY"}
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith("mlreg-serves-from-")]
