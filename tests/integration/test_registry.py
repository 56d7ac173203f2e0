"""The MLflow registry, on the embedded sqlite registry and on a real `mlflow server`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app
from registry.errors import RegistryError
from registry.mlflow_registry import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "server"])
def env(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """MLREG_HOME in tmp; MLFLOW_TRACKING_URI unset (embedded) or the real server."""
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return Settings.from_env()


def unique(name: str) -> str:
    """A fresh model name per test (the server is shared by the session)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def copy_model(built: Path, model: str, name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(built / model, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{model}"', f'name: "{name}"'))
    return target


def mlreg(*args: str, env: Settings) -> subprocess.CompletedProcess[str]:
    """The CLI as a separate process (each export in a fresh process, as users run it)."""
    return subprocess.run(
        [sys.executable, "-m", "mlreg", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
        env=os.environ.copy(),
    )


def test_register_is_idempotent_and_queryable(env: Settings, built_repository: Path, tmp_path: Path) -> None:
    name = unique("table_data_model")
    folder = copy_model(built_repository, "table_data_model", name, tmp_path)
    registry = MlflowRegistry(env)
    first = register(registry, find_candidate(folder))
    assert (first.version, first.created, first.validation) == ("1", True, "passed")
    again = register(registry, find_candidate(folder))
    assert (again.version, again.created) == ("1", False)
    forced = register(registry, find_candidate(folder), force=True)
    assert (forced.version, forced.created) == ("2", True)

    runner = CliRunner()
    assert runner.invoke(app, ["alias", "set", name, "staging", "1"]).exit_code == 0
    listed = runner.invoke(app, ["versions", name, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)["versions"]
    assert [(r["version"], r["aliases"], r["validation"]) for r in rows] == [
        ("2", [], "passed"),
        ("1", ["staging"], "passed"),
    ]
    assert runner.invoke(app, ["alias", "rm", name, "staging"]).exit_code == 0
    assert json.loads(runner.invoke(app, ["versions", name, "--json"]).output)["versions"][1]["aliases"] == []


def test_version_tags_and_description_carry_the_lineage(
    env: Settings, built_repository: Path, tmp_path: Path
) -> None:
    name = unique("image_model")
    result = register(
        MlflowRegistry(env),
        find_candidate(copy_model(built_repository, "image_model", name, tmp_path)),
        exporter=ROOT / "model_repository_template/image_model/image_model_exporter.py",
        export_info={"seed": 0, "tensorflow": "2.x"},
    )
    mv = MlflowRegistry(env).version(name, result.version)
    tags = mv.tags
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    assert tags["git_commit"] == (commit or "unknown")
    assert tags["git_dirty"] in {"true", "false"}
    for key in ("artifact_digest", "contract_digest", "exporter_sha256"):
        assert len(tags[key]) == 64
    assert (tags["framework"], tags["platform"], tags["validation"]) == (
        "tensorflow",
        "tensorflow_savedmodel",
        "passed",
    )
    assert "| input | `image` | FP32 | `[-1, 3, 256, 256]` |" in mv.description
    assert f"- artifact sha256 `{tags['artifact_digest']}`" in mv.description
    assert f"Promote with `mlreg promote {name} --version" in mv.description

    shown = CliRunner().invoke(app, ["show", name, "--version", result.version, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["contract"]["outputs"] == [{"name": "output", "dtype": "FP32", "shape": [-1, 10]}]
    assert "model/saved_model.pb" in data["files"]
    assert data["validation"] == {"validation": "passed", "errors": []}


def test_export_registers_and_reexport_is_idempotent(env: Settings) -> None:
    first = mlreg("export", "table_data_model", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["versions"][0]["created"] is True
    again = mlreg("export", "table_data_model", env=env)
    assert again.returncode == 0, again.stderr
    assert "table_data_model: unchanged, matches version 1" in again.stdout
    changed = mlreg("export", "table_data_model", "--seed", "7", env=env)
    assert "table_data_model: registered version 2" in changed.stdout
    mv = MlflowRegistry(env).version("table_data_model", "2")
    assert mv.tags["exporter_sha256"]
    run = MlflowRegistry(env).client.get_run(mv.run_id)
    assert run.data.params["seed"] == "7"
    assert run.data.params["opset"] == "13"
    assert run.data.metrics["tensor_count"] == 3


def test_a_contract_failure_is_registered_but_tagged_failed(
    env: Settings, built_repository: Path, tmp_path: Path
) -> None:
    name = unique("image_model")
    folder = copy_model(built_repository, "image_model", name, tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "output"', 'name: "output_0"'))
    result = register(MlflowRegistry(env), find_candidate(folder))
    assert result.validation == "failed"
    assert any(
        "unexpected inference output 'output_0', allowed outputs are: output" in f for f in result.findings
    )
    mv = MlflowRegistry(env).version(name, result.version)
    assert mv.tags["validation"] == "failed"
    assert "**Validation: failed**" in mv.description


def test_bad_input_gets_a_clear_error(env: Settings, built_repository: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["register", "empty", str(empty)])
    assert result.exit_code == 4
    assert f"error: '{empty}' holds no config.pbtxt" in result.output
    bad = copy_model(built_repository, "table_data_preprocess", "bad name", tmp_path)
    result = runner.invoke(app, ["register", "bad name", str(bad)])
    assert "error: invalid model name 'bad name'" in result.output
    leak = copy_model(built_repository, "table_data_preprocess", unique("leak"), tmp_path)
    (leak / "1" / "secrets").symlink_to("/etc/passwd")
    result = runner.invoke(app, ["register", leak.name, str(leak)])
    assert result.exit_code == 4
    assert "is a link to /etc/passwd, outside the model folder" in result.output
    dangling = copy_model(built_repository, "table_data_preprocess", unique("dangling"), tmp_path)
    (dangling / "1" / "gone").symlink_to(tmp_path / "nothing-here")
    result = runner.invoke(app, ["register", dangling.name, str(dangling)])
    assert "is a link to" in result.output or "is not a regular file" in result.output
    assert "Traceback" not in result.output


def test_tracking_server_down_fails_fast_and_writes_nothing(
    built_repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipelines.local_triton import free_port

    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLREG_MLFLOW_TIMEOUT", "2")
    folder = copy_model(built_repository, "table_data_preprocess", "table_data_preprocess", tmp_path / "m")
    result = CliRunner().invoke(app, ["register", "table_data_preprocess", str(folder)])
    assert result.exit_code == 4
    assert "error: MLflow (http://127.0.0.1:" in result.output
    assert "fix: check the tracking server at http://127.0.0.1:" in result.output
    versions = CliRunner().invoke(app, ["versions", "table_data_preprocess"])
    assert versions.exit_code == 4
    assert "is up (MLFLOW_TRACKING_URI)" in versions.output


def test_a_failure_after_the_run_started_leaves_no_orphan(
    mlflow_server,
    built_repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MOCK, said plainly: the registry refusing the version *after* the run was created cannot
    be provoked on demand against a healthy server, so create_version is made to fail here."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    registry = MlflowRegistry(Settings.from_env())
    name = unique("table_data_preprocess")
    folder = copy_model(built_repository, "table_data_preprocess", name, tmp_path)

    def refuse(*args, **kwargs):
        raise RegistryError("MLflow: version creation failed: simulated", fix="-")

    monkeypatch.setattr(registry, "create_version", refuse)
    with pytest.raises(RegistryError, match="simulated"):
        register(registry, find_candidate(folder))
    runs = registry.client.search_runs(
        [registry.experiment_id()], filter_string=f"tags.mlreg_model = '{name}'", run_view_type=1
    )  # ACTIVE_ONLY
    assert runs == []
    assert registry.find_by_tag(name, "validation", "passed") == []


def test_two_processes_creating_one_experiment_at_once_share_it(tmp_path: Path) -> None:
    """Two promotions at once on a fresh MLflow both create 'mlreg-promotions'; the slower one
    used to lose its run (seen on PostgreSQL).  Both registries here are real (one sqlite file);
    only the ordering is arranged: the second looks the name up just before the first creates it."""
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg"), "PATH": os.environ["PATH"]})
    first, second = MlflowRegistry(settings), MlflowRegistry(settings)
    lookup = second.client.get_experiment_by_name
    calls: list[str] = []

    def lookup_before_the_other_creates(name: str) -> Any:  # MLflow's Experiment | None
        calls.append(name)
        if len(calls) == 1:
            first.experiment_id(name)  # the other process creates it now...
            return None  # ...after this process's lookup found nothing
        return lookup(name)

    second.client.get_experiment_by_name = lookup_before_the_other_creates  # type: ignore[method-assign]
    assert second.experiment_id("mlreg-promotions") == first.experiment_id("mlreg-promotions")
    assert calls == ["mlreg-promotions", "mlreg-promotions"]  # the creation failed, the lookup found it
