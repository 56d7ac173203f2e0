"""`mlreg stack up|status|down` against a real tritonserver process."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.devstack import local_triton, processes
from pipelines.triton.control import TritonControl
from registry.settings import Settings
from tests.cli import CliRunner
from tests.conftest import failing_python_model

pytestmark = pytest.mark.integration

REASON = "the tokenizer vocabulary is missing"


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    return CliRunner()


def test_up_twice_starts_one_server_and_down_cleans_up(
    runner: CliRunner,
    built_repository: Path,
    tmp_path: Path,
) -> None:
    repo = str(built_repository)
    first = runner.invoke(
        app, ["stack", "up", "-r", repo, "-l", "table_data_preprocess", "--no-ui", "--json"]
    )
    assert first.exit_code == 0, first.output
    info = json.loads(first.output)
    try:
        assert info["already_running"] is False
        assert info["loaded"] == ["table_data_preprocess"]
        assert local_triton.pid_alive(info["pid"])
        assert list(Path("/dev/shm").glob(f"{info['shm_prefix']}*"))

        second = runner.invoke(app, ["stack", "up", "-r", repo])
        assert second.exit_code == 0, second.output
        assert "tritonserver already running" in second.output
        assert f"pid          {info['pid']}" in second.output
        # the second `up` (UI on by default) adds the MLflow UI on the local registry
        assert "mlflow_url   http://127.0.0.1:" in second.output
        ui = json.loads((tmp_path / "home/stack/mlflow.json").read_text())
        assert local_triton.http_ok(f"{ui['url']}/health")

        other = runner.invoke(app, ["stack", "up", "-r", str(tmp_path)])
        assert other.exit_code == 7
        assert "the local stack already runs" in other.output

        status = runner.invoke(app, ["stack", "status", "--json"])
        assert status.exit_code == 0
        shown = json.loads(status.output)
        assert shown["grpc_url"] == info["grpc_url"]
        assert shown["repository"] == repo
        assert "table_data_preprocess:1" in shown["loaded"]
    finally:
        down = runner.invoke(app, ["stack", "down"])
    assert down.exit_code == 0
    assert re.search(
        rf"stopped replica-0: tritonserver \(pid {info['pid']}\) and \d+ python stubs?", down.output
    )
    assert not local_triton.pid_alive(info["pid"])
    assert not list(Path("/dev/shm").glob(f"{info['shm_prefix']}*"))
    assert runner.invoke(app, ["stack", "status"]).exit_code == 1
    assert processes.process_gone(ui["pid"])


def test_a_model_that_fails_to_load_reports_the_servers_reason(
    runner: CliRunner,
    built_repository: Path,
    tmp_path: Path,
) -> None:
    """The reason is Triton's own: the python backend's ``initialize`` raises in the stub that
    Triton started, and the server hands that error back in its load answer."""
    repo = tmp_path / "repo"
    shutil.copytree(built_repository / "table_data_preprocess", repo / "table_data_preprocess")
    (repo / "table_data_preprocess" / "1" / "model.py").write_text(failing_python_model(REASON))
    result = runner.invoke(app, ["stack", "up", "-r", str(repo), "-l", "table_data_preprocess", "--no-ui"])
    try:
        assert result.exit_code == 6, result.output
        assert "error: load failed on 127.0.0.1:" in result.output
        assert "model 'table_data_preprocess'" in result.output
        # Triton's own words: its load answer names the state and the stub's exception
        assert f"version 1 is at UNAVAILABLE state: Internal: RuntimeError: {REASON}" in result.output
        status = runner.invoke(app, ["stack", "status", "--json"])
        assert status.exit_code == 0, status.output  # the server runs on; the model does not
        with TritonControl(json.loads(status.output)["grpc_url"]) as triton:
            index = {m["name"]: m for m in triton.repository_index()}
        assert index["table_data_preprocess"]["state"] == "UNAVAILABLE"
        assert REASON in index["table_data_preprocess"]["reason"]  # Triton's record, not mlreg's
    finally:
        runner.invoke(app, ["stack", "down"])


def test_up_with_s3_serves_from_a_local_s3_server(
    runner: CliRunner,
    built_repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A promoted project (issue 48 item 4): `stack up --s3` copies it -- each version's manifest
    created there, never pushed as a file (before: "ens v1 was created by another writer") -- and
    the new server serves what the store says should serve, each version verified against the
    registry's digest (the registry of tests/unit/worlds.py, whose promotion wrote the store);
    a model nobody promoted loads only on demand (-l)."""
    from mlreg.ops import store_push
    from pipelines.storage import open_store
    from pipelines.storage.base import MANIFEST
    from tests.unit.worlds import World

    (tmp_path / "world").mkdir()
    world = World(tmp_path / "world")
    assert world.promote("ens", "1").ok
    repo = world.store_root
    shutil.copytree(built_repository / "table_data_preprocess", repo / "table_data_preprocess")
    tags = world.registry.tags
    monkeypatch.setattr(
        store_push,
        "registered_digest",
        lambda settings: lambda m, v: tags.get((m, v), {}).get("artifact_digest"),
    )
    before = sorted(repo.rglob("*"))
    result = runner.invoke(
        app, ["stack", "up", "--s3", "-r", str(repo), "--no-ui", "-l", "table_data_preprocess", "--json"]
    )
    try:
        assert result.exit_code == 0, result.output
        info = json.loads(result.output)
        assert info["repository"].startswith("s3://127.0.0.1:")
        assert info["repository"].endswith("/mlreg/model_repository")
        assert info["restored"] == ["net:1", "pre:1", "ens:1"]
        assert info["not_restored"] == []
        assert info["loaded"] == ["table_data_preprocess"]
        served = open_store(info["repository"])
        for model in ("ens", "net", "pre"):
            assert (
                served.objects.read(f"{model}/1/{MANIFEST}") == (repo / model / "1" / MANIFEST).read_bytes()
            )
        with TritonControl(info["grpc_url"]) as triton:
            ready = {
                m["name"]: m.get("version") for m in triton.repository_index() if m.get("state") == "READY"
            }
        assert ready == {"ens": "1", "net": "1", "pre": "1", "table_data_preprocess": "1"}
        moto_pid = json.loads((tmp_path / "home/stack/s3.json").read_text())["pid"]
        assert not processes.process_gone(moto_pid)
    finally:
        down = runner.invoke(app, ["stack", "down"])
    assert down.exit_code == 0
    assert processes.process_gone(moto_pid)
    # a --repository folder is the user's: never written back (only .mlreg/model_repository is)
    assert f"not copied back to {repo} (a --repository folder is yours, never written)" in down.output
    assert sorted(repo.rglob("*")) == before


def test_up_with_nothing_built_serves_an_empty_repository_ready_for_promote(
    runner: CliRunner,
    tmp_path: Path,
) -> None:
    result = runner.invoke(app, ["stack", "up", "--no-ui", "--json"])
    try:
        assert result.exit_code == 0, result.output
        info = json.loads(result.stdout)
        repository = tmp_path / "home" / "model_repository"
        assert info["repository"] == str(repository)
        assert list(repository.iterdir()) == []
        assert local_triton.http_ok(f"{info['http_url']}/v2/health/live")
        again = runner.invoke(app, ["stack", "up", "--no-ui"])  # no --repository: the running one
        assert again.exit_code == 0, again.output
        assert "tritonserver already running" in again.stdout
        state = json.loads((tmp_path / "home/stack/triton.json").read_text())
        assert state["pid"] == info["pid"]
    finally:
        down = runner.invoke(app, ["stack", "down", "--json"])
    # stack down --json also says, replica by replica, what stopping its process group did (issue 45
    # item 2): the one replica's tritonserver ran and stopped on SIGTERM, no stub, nothing left
    assert json.loads(down.stdout) == {
        "stopped": True,
        "pid": info["pid"],
        "pids": [info["pid"]],
        "replicas": [
            {
                "replica": "replica-0",
                "pid": info["pid"],
                "tritonserver": True,
                "python_stubs": 0,
                "killed": False,
                "left": [],
            }
        ],
    }
    assert processes.process_gone(info["pid"])
    assert not (tmp_path / "home/stack/triton.json").exists()


def test_a_scratch_server_loads_on_demand_and_stops_when_left(built_repository: Path, tmp_path: Path) -> None:
    """The quality gate's dry-run server (pipelines/devstack/scratch.py): explicit model control."""
    from pipelines.devstack.scratch import scratch_servers

    repository = tmp_path / "repo"
    shutil.copytree(built_repository / "table_data_preprocess", repository / "table_data_preprocess")
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / "home"), "PATH": os.environ["PATH"]})
    with scratch_servers(settings)(repository) as url, TritonControl(url) as triton:
        assert not triton.is_ready("table_data_preprocess")  # nothing loads until asked
        triton.load("table_data_preprocess")
        triton.wait_ready("table_data_preprocess", "1")
    assert not local_triton.port_in_use(int(url.rpartition(":")[2]))
