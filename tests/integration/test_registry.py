"""The MLflow registry, on the embedded sqlite registry and on a real `mlflow server`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from registry.errors import RegistryError
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from tests.cli import CliRunner
from tests.conftest import ROOT, TEMPLATE
from tests.integration import forkcli
from tests.integration.stacks import seed_registry

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "server"])
def env(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """MLREG_HOME in tmp; MLFLOW_TRACKING_URI unset (embedded: an empty registry, seeded) or the
    real server."""
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = Settings.from_env()
    seed_registry(settings)
    return settings


def unique(name: str) -> str:
    """A fresh model name per test (the server is shared by the session)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def copy_model(built: Path, model: str, name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(built / model, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{model}"', f'name: "{name}"'))
    return target


def mlreg_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a separate process, as users run it (this process's MLREG_HOME and MLflow)."""
    return forkcli.run(args, cwd=ROOT, env=os.environ.copy(), timeout=300)


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
    mv = MlflowRegistry(env).models.version(name, result.version)
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


def weights(registry: MlflowRegistry, name: str, version: str, dest: Path) -> dict[str, Any]:
    """The registered ONNX graph's initializers (its weights), by name."""
    import onnx
    from onnx import numpy_helper

    registry.models.fetch_version(name, version, dest)
    graph = onnx.load(str(dest / version / "model" / "model.onnx")).graph
    return {i.name: numpy_helper.to_array(i) for i in graph.initializer}


def test_export_registers_and_reexport_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first export and the re-export are fresh ``mlreg`` processes, as users run them: the
    re-export is "unchanged" by MLflow's state alone.  (Both must be a process's first export of
    the model: tf2onnx numbers the symbolic batch dimensions, ``unk__N``, process-wide, so a second
    export in one process differs in bytes.)  The seeded export runs here (CliRunner); its new
    weights are read back from the registry.  On the embedded registry only (a name of the template
    in a tmp MLREG_HOME, shared with no other test): register's idempotence on the server is
    test_register_is_idempotent_and_queryable[server]."""
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seed_registry(Settings.from_env())  # empty: the first export's process does not migrate it
    registry = MlflowRegistry(Settings.from_env())
    first = mlreg_process("export", "table_data_model", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["versions"][0]["created"] is True
    again = mlreg_process("export", "table_data_model")
    assert again.returncode == 0, again.stderr
    assert "table_data_model: unchanged, matches version 1" in again.stdout
    assert [str(v.version) for v in registry.models.versions("table_data_model")] == ["1"]
    changed = CliRunner().invoke(app, ["export", "table_data_model", "--seed", "7"])
    assert changed.exit_code == 0, changed.output
    assert "table_data_model: registered version 2" in changed.stdout
    mv = registry.models.version("table_data_model", "2")
    assert mv.tags["exporter_sha256"]
    run = registry.connection.client.get_run(mv.run_id)
    assert run.data.params["seed"] == "7"
    assert run.data.params["opset"] == "13"
    assert run.data.metrics["tensor_count"] == 3
    one, seven = (weights(registry, "table_data_model", v, tmp_path / f"v{v}") for v in ("1", "2"))
    assert sorted(one) == sorted(seven)
    assert any((one[k] != seven[k]).any() for k in one)  # other weights: seed 7's, not a renumbering


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
    mv = MlflowRegistry(env).models.version(name, result.version)
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


def test_register_findings_name_the_users_folder_not_a_scratch_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the embedded registry (moved from tests/component/test_cli.py: it writes through MLflow)."""
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    model = tmp_path / "build" / "table_data_preprocess"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text((TEMPLATE / "table_data_preprocess" / "config.pbtxt").read_text())
    (model / "1" / "other.py").write_text("x = 1\n")  # model.py is missing
    result = CliRunner().invoke(app, ["register", "table_data_preprocess", str(model)])
    assert result.exit_code == 3, result.output  # recorded, and the exit says it failed (issue 48)
    assert "table_data_preprocess: registered version 1 (validation failed)" in result.stdout
    assert "error: table_data_preprocess v1 failed validation: registered" in result.stderr
    assert f"error: table_data_preprocess: unable to find '{model / '1' / 'model.py'}'" in result.stdout
    assert "mlreg-validate-" not in result.output
    assert "INFO mlflow" not in result.output  # MLflow's own start-up lines stay out of the CLI's output
    versions = json.loads(CliRunner().invoke(app, ["versions", "table_data_preprocess", "--json"]).stdout)
    assert [(v["version"], v["validation"]) for v in versions["versions"]] == [("1", "failed")]


def files_under(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: a file's sha256, a folder's '/' (links: their target)."""
    tree = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            tree[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            tree[rel] = "/"
        else:
            tree[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return tree


def test_tracking_server_down_fails_fast_and_writes_nothing(
    built_repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``register`` could write: MLflow (the server: down, so nothing), the state folder
    (MLREG_HOME: an embedded sqlite registry, artifacts, logs), the candidate's own folder, the
    working folder, and scratch folders (validation, run metadata).  None appears or changes."""
    from pipelines.devstack.local_triton import free_port

    home, scratch = tmp_path / "home", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where mlreg's scratch folders go
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("MLREG_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLREG_MLFLOW_TIMEOUT", "2")
    monkeypatch.chdir(tmp_path)
    folder = copy_model(built_repository, "table_data_preprocess", "table_data_preprocess", tmp_path / "m")
    before = files_under(tmp_path)
    result = CliRunner().invoke(app, ["register", "table_data_preprocess", str(folder)])
    assert result.exit_code == 4, result.output
    assert "error: MLflow (http://127.0.0.1:" in result.output
    assert "fix: check the tracking server at http://127.0.0.1:" in result.output
    assert files_under(tmp_path) == before  # no state folder, no registry file, no scratch left
    assert not home.exists()
    versions = CliRunner().invoke(app, ["versions", "table_data_preprocess"])
    assert versions.exit_code == 4
    assert "is up (MLFLOW_TRACKING_URI)" in versions.output
    assert files_under(tmp_path) == before


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

    monkeypatch.setattr(registry.models, "create_version", refuse)
    with pytest.raises(RegistryError, match="simulated"):
        register(registry, find_candidate(folder))
    runs = registry.connection.client.search_runs(
        [registry.runs.experiment_id()], filter_string=f"tags.mlreg_model = '{name}'", run_view_type=1
    )  # ACTIVE_ONLY
    assert runs == []
    assert registry.models.find_by_tag(name, "validation", "passed") == []


RACE_CHILD = """
import sys, time
from pathlib import Path
from registry.mlflow import MlflowRegistry
from registry.settings import Settings

home, barrier, me = sys.argv[1:4]
registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": home}))
client = registry.connection.client  # MLflow imported and the store opened before the race
lookup, create = client.get_experiment_by_name, client.create_experiment
outcome = []


def lookup_then_wait_for_the_other(name):
    found = lookup(name)
    if not outcome:  # the first lookup returns once both processes have looked
        Path(barrier, me).touch()
        deadline = time.monotonic() + 120  # a guard against a dead sibling, not a measurement
        while len(list(Path(barrier).iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    outcome.append("looked up: " + ("found" if found else "none"))
    return found


def create_and_note(*args, **kwargs):
    try:
        made = create(*args, **kwargs)
    except Exception:
        outcome.append("creation refused")
        raise
    outcome.append("created")
    return made


client.get_experiment_by_name = lookup_then_wait_for_the_other
client.create_experiment = create_and_note
experiment = registry.runs.experiment_id("mlreg-promotions")
print(experiment, "|".join(outcome))
"""


def test_two_processes_creating_one_experiment_at_once_share_it(tmp_path: Path) -> None:
    """Two promotions at once on a fresh MLflow both create 'mlreg-promotions'; the slower one
    used to lose its run (seen on PostgreSQL).  Two real processes on one real sqlite registry.
    Only the interleaving is arranged, in each child: its first ``get_experiment_by_name`` (the real
    one) returns only once both children have looked the name up, so both find nothing and both
    create it; the creations are not arranged (the database lets one win)."""
    home, barrier = tmp_path / ".mlreg", tmp_path / "barrier"
    barrier.mkdir()
    registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(home)}))
    registry.connection.client.search_experiments()  # the database made (schema) before the race
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_CHILD, str(home), str(barrier), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for i in range(2)
    ]
    answers = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        answers.append(out.strip().splitlines()[-1].split(" ", 1))
    ids = {experiment for experiment, _ in answers}
    assert sorted(outcome for _, outcome in answers) == [
        "looked up: none|created",
        "looked up: none|creation refused|looked up: found",
    ]  # both looked before either created; one creation lost, and its process found the winner's
    from mlflow.entities import ViewType

    named = registry.connection.client.search_experiments(
        view_type=ViewType.ALL, filter_string="name = 'mlreg-promotions'"
    )
    assert [e.experiment_id for e in named] == list(ids)  # one experiment, the id both use


# -- what the promotion asks of the registry (pipelines/core/ports.py Registry) -----------------


def test_a_registration_leaves_the_process_environment_as_it_was(
    env: Settings, built_repository: Path, tmp_path: Path
) -> None:
    """MLflow's settings are environment variables and ``mlflow.set_tracking_uri`` writes one:
    register + alias + a promotion's record (with the download the plan does) change none of them,
    nor MLflow's global tracking URI (they used to point every later registry at this one)."""
    import mlflow

    from registry.mlflow.model import PROMOTIONS_EXPERIMENT

    before, uri_before = dict(os.environ), mlflow.get_tracking_uri()
    registry = MlflowRegistry(env)
    name = unique("table_data_model")
    version = register(
        registry, find_candidate(copy_model(built_repository, "table_data_model", name, tmp_path))
    )
    registry.models.set_alias(name, "local", version.version)
    run_id = registry.runs.start_run(PROMOTIONS_EXPERIMENT, f"{name}-v1-local", {"mlreg_model": name})
    registry.runs.log(run_id, {"to_version": version.version}, {"deploy_seconds": 1.0})
    registry.runs.finish_run(run_id, ok=True)
    registry.deployed.record_deployment(name, version.version, "local", run_id, ["triton-0:8001"])
    registry.runs.download(version.run_id, "model", tmp_path / "download")  # the logged model's folder
    assert (tmp_path / "download" / "model").is_dir()
    assert dict(os.environ) == before
    assert mlflow.get_tracking_uri() == uri_before


def test_fetch_version_writes_a_triton_model_folder_and_returns_the_tags(
    env: Settings, built_repository: Path, tmp_path: Path
) -> None:
    registry = MlflowRegistry(env)
    name = unique("table_data_model")
    source = copy_model(built_repository, "table_data_model", name, tmp_path)
    registered = register(registry, find_candidate(source))
    dest = tmp_path / "fetched" / name
    (dest / "stale").mkdir(parents=True)  # whatever was there goes
    tags = registry.models.fetch_version(name, registered.version, dest)
    assert tags["validation"] == "passed"
    assert (
        tags["artifact_digest"] == registry.models.version(name, registered.version).tags["artifact_digest"]
    )
    assert sorted(p.name for p in dest.iterdir()) == ["1", "config.pbtxt"]
    assert (dest / "config.pbtxt").read_text() == (source / "config.pbtxt").read_text()
    fetched = sorted(p.relative_to(dest / "1").as_posix() for p in (dest / "1").rglob("*") if p.is_file())
    assert fetched == sorted(
        p.relative_to(source / "1").as_posix() for p in (source / "1").rglob("*") if p.is_file()
    )
    with pytest.raises(RegistryError, match="check the name and version"):
        registry.models.fetch_version(name, "9", tmp_path / "fetched" / "nothing")


FETCH_WITHOUT_MLFLOW = """
import sys
from pathlib import Path
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
tags = MlflowRegistry(Settings.from_env()).models.fetch_version(sys.argv[1], "1", Path(sys.argv[2]))
print(tags["validation"], "mlflow" in sys.modules)
"""


def test_fetch_version_from_the_embedded_registry_does_not_import_mlflow(
    built_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seed_registry(Settings.from_env())
    name = unique("image_preprocess")
    register(
        MlflowRegistry(Settings.from_env()),
        find_candidate(copy_model(built_repository, "image_preprocess", name, tmp_path)),
    )
    proc = subprocess.run(
        [sys.executable, "-c", FETCH_WITHOUT_MLFLOW, name, str(tmp_path / "out" / name)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["passed", "False"]
    assert (tmp_path / "out" / name / "1" / "model.py").is_file()


def test_ping_register_version_aliases_and_promotions(
    env: Settings, built_repository: Path, tmp_path: Path
) -> None:
    from registry.mlflow.model import PROMOTIONS_EXPERIMENT

    registry = MlflowRegistry(env)
    registry.models.ping()  # the embedded registry: created if missing; a server: answers
    name, other = unique("table_data_preprocess"), unique("table_data_preprocess")
    source = copy_model(built_repository, "table_data_preprocess", name, tmp_path)
    first = registry.register_version(
        name, source / "1", source / "config.pbtxt", export_info={"derived": "yes"}
    )
    assert registry.register_version(name, source / "1", source / "config.pbtxt") == first  # identical
    copied = copy_model(built_repository, "table_data_preprocess", other, tmp_path)
    registry.register_version(other, copied / "1", copied / "config.pbtxt")
    registry.models.set_alias(name, "staging", first)
    registry.models.set_alias(name, "production", first)
    registry.models.set_alias(other, "staging", "1")
    staged = registry.models.alias_versions("staging")
    assert (staged[name], staged[other]) == (first, "1")
    assert other not in registry.models.alias_versions("production")
    for to, env_name in (("1", "staging"), ("1", "production")):
        run = registry.runs.start_run(
            PROMOTIONS_EXPERIMENT,
            f"{name}-{env_name}",
            {"mlreg_model": name, "environment": env_name, "result": "promoted", "user": "me"},
        )
        registry.runs.log(run, {"from_version": "none", "to_version": to}, {})
        registry.runs.finish_run(run, ok=True)
    found = registry.runs.promotions(name, "staging")
    assert [(p["environment"], p["from"], p["to"], p["result"], p["user"]) for p in found] == [
        ("staging", "none", "1", "promoted", "me")
    ]
    assert [p["environment"] for p in registry.runs.promotions(name)] == [
        "production",
        "staging",
    ]  # newest first
    assert registry.runs.promotions(other) == []


def test_ping_of_a_server_that_is_down_fails_fast(tmp_path: Path) -> None:
    from pipelines.devstack.local_triton import free_port

    settings = Settings.from_env(
        env={
            "MLREG_HOME": str(tmp_path / "home"),
            "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
            "MLREG_MLFLOW_TIMEOUT": "2",
        }
    )
    with pytest.raises(RegistryError, match="check the tracking server"):
        MlflowRegistry(settings).models.ping()
