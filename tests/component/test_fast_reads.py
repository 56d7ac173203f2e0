"""Answers in a second (issue 48 item 3): the read-only commands read the embedded registry's file
(``registry.mlflow.reads.EmbeddedReads``) and answer what MLflow's client answers on the same
registry, without importing MLflow; a typo'd ``promote`` is refused from the registry alone; a
table is drawn without rich's import where it draws the same lines.

The registry is made by MLflow itself, beside the run (``BACKGROUND``): two template models
registered by ``register()``, an alias, promotion runs as ``record`` writes them (a deleted one
among them), and the client's answers printed as JSON for the test to compare with the file's.
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app
from mlreg.cli.table import plain_lines
from registry.errors import RegistryError
from registry.mlflow import sqlite
from registry.mlflow.reads import EmbeddedReads, open_reads
from registry.mlflow.registry import MlflowRegistry
from registry.settings import Settings
from tests.component.conftest import SCRATCH, Background, Finished

ROOT = Path(__file__).resolve().parents[2]
MODEL, OTHER = "table_data_preprocess", "image_preprocess"
MADE_BY_MLFLOW = r"""
import dataclasses, json, sys, time
from pathlib import Path
from registry.mlflow import MlflowRegistry, queries
from registry.mlflow.reads import ClientReads
from registry.settings import PROMOTIONS_EXPERIMENT, Settings

template, home = Path(sys.argv[1]), Path.cwd() / "home"
settings = Settings.from_env(env={"MLREG_HOME": str(home)})
registry = MlflowRegistry(settings)
for model in ("table_data_preprocess", "image_preprocess"):
    registry.register_version(model, template / model / "1", template / model / "config.pbtxt")
registry.models.set_alias("table_data_preprocess", "production", "1")
runs = []
for env, before, result in (("local", "none", "promoted"), ("staging", "none", "refused"),
                            ("local", "1", "rolled back"), ("local", "1", "promoted")):
    tags = {"mlreg_model": "table_data_preprocess", "mlreg_version": "1", "environment": env,
            "result": result, "user": "h7"}
    run = registry.runs.start_run(PROMOTIONS_EXPERIMENT, f"table_data_preprocess-v1-{env}", tags)
    registry.runs.log(run, {"from_version": before, "to_version": "1"}, {"deploy_seconds": 1.0})
    registry.runs.finish_run(run, result == "promoted")
    runs.append(run)
    time.sleep(0.02)  # distinct start times: the order is MLflow's, not a tie-break
registry.runs._client.delete_run(runs[1])  # a deleted run is in no history
# image_preprocess v1 went live as a member of an ensemble's promotion (no run of its own); its other
# promotion_run_ tags name a deleted run, another model's run in another environment and no run at all
ensemble = registry.runs.start_run(PROMOTIONS_EXPERIMENT, "an_ensemble-v3-local",
                              {"mlreg_model": "an_ensemble", "mlreg_version": "3", "environment": "local",
                               "result": "promoted", "user": "h7"})
registry.runs.log(ensemble, {"from_version": "2", "to_version": "3"}, {"deploy_seconds": 1.0})
registry.runs.finish_run(ensemble, True)
for env, run_id in (("local", ensemble), ("staging", runs[1]), ("production", runs[0]), ("dev", "../x")):
    registry.models.set_version_tag("image_preprocess", "1", f"promotion_run_{env}", run_id)
from mlreg.ops.history import arrivals
client = ClientReads(registry)
version = client.version("table_data_preprocess", "1")
queries.open_reads = lambda settings, adapter=None: client  # show_version through MLflow's client
print(json.dumps({
    "home": str(home),
    "version": dataclasses.asdict(version),
    "aliases": client.require_model("table_data_preprocess"),
    "everywhere": client.promotions("table_data_preprocess"),
    "local": client.promotions("table_data_preprocess", "local"),
    "staging": client.promotions("table_data_preprocess", "staging"),
    "none": client.promotions("image_preprocess"),
    "arrivals": arrivals(client, "image_preprocess", None, set()),
    "ensemble": ensemble,
    "config": client.artifact_text(version.run_id, "config.pbtxt"),
    "manifest": client.artifact_text(version.run_id, "manifest.json"),
    "show": queries.show_version(settings, "table_data_preprocess", "1"),
    "searched": {
        model: [
            {"version": str(v.version), "tags": dict(v.tags), "run_id": v.run_id, "source": v.source,
             "creation_timestamp": v.creation_timestamp}
            for v in registry.connection.client.search_model_versions(f"name='{model}'")
        ]
        for model in ("table_data_preprocess", "image_preprocess", "nothing_here")
    },
}))
"""
BACKGROUND = {
    "registry": Background(
        [sys.executable, "-c", MADE_BY_MLFLOW, str(ROOT / "model_repository_template")],
        cwd=SCRATCH,
        env={"PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""},
    )
}


@pytest.fixture(autouse=True)
def mlflow_hidden(monkeypatch: pytest.MonkeyPatch) -> Any:
    """MLflow cannot be imported during a test of this module: every ``mlflow`` module is hidden
    (an import of it raises ImportError), whether or not an earlier test of the same process (an
    integration module, on the same xdist worker) imported it before."""
    for name in [n for n in sys.modules if n == "mlflow" or n.startswith("mlflow.")] or ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    yield
    leaked = [
        n for n, m in sys.modules.items() if (n == "mlflow" or n.startswith("mlflow.")) and m is not None
    ]
    assert not leaked, f"MLflow was imported: {leaked[:3]}"


def _mlflow_untouched() -> bool:
    """No module of MLflow was imported (they are hidden by ``mlflow_hidden``)."""
    return all(m is None for n, m in sys.modules.items() if n == "mlflow" or n.startswith("mlflow."))


@pytest.fixture
def made(background: Finished) -> dict[str, Any]:
    proc = background("registry")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _env(made: dict[str, Any]) -> dict[str, str | None]:
    return {"MLREG_HOME": made["home"], "MLFLOW_TRACKING_URI": None}  # the project's own registry


def _settings(made: dict[str, Any]) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": made["home"]})


def _no_client() -> MlflowRegistry:
    raise AssertionError("the embedded registry's file should have answered, not MLflow's client")


def test_the_file_answers_what_mlflow_s_client_answers_on_the_same_registry(made: dict[str, Any]) -> None:
    settings = _settings(made)
    reads = open_reads(settings, _no_client)
    assert isinstance(reads, EmbeddedReads)
    version = reads.version(MODEL, "1")
    # MLflow's ModelVersion carries no storage location: the file's is where the folder lies
    assert dataclasses.asdict(version) == made["version"] | {"storage_location": version.storage_location}
    assert version.storage_location.startswith("file://")
    assert made["version"]["storage_location"] == ""
    assert version.created > 0
    assert version.tags["validation"] == "passed"
    assert reads.require_model(MODEL) == made["aliases"] == {"production": "1"}
    assert reads.promotions(MODEL) == made["everywhere"]
    assert [row["result"] for row in made["everywhere"]] == ["promoted", "rolled back", "promoted"]
    assert reads.promotions(MODEL, "local") == made["local"] == made["everywhere"]
    assert reads.promotions(MODEL, "staging") == made["staging"] == []  # its one run was deleted
    assert reads.promotions(OTHER) == made["none"] == []
    assert reads.artifact_text(version.run_id, "config.pbtxt") == made["config"]
    assert json.loads(reads.artifact_text(version.run_id, "manifest.json")) == json.loads(made["manifest"])
    assert _mlflow_untouched()


def test_versions_from_the_file_are_mlflow_s_search_on_the_same_registry(made: dict[str, Any]) -> None:
    """``registry.versions`` (status's ensemble numbering, a -1 member, fleet pins) reads the file."""
    uri = _settings(made).tracking_uri
    for model, searched in made["searched"].items():
        found = sqlite.model_versions(uri, model)
        assert found is not None
        mine = [
            {
                "version": v.version,
                "tags": v.tags,
                "run_id": v.run_id,
                "source": v.source,
                "creation_timestamp": v.creation_timestamp,
            }
            for v in found
        ]
        key = lambda row: int(row["version"])  # noqa: E731 - MLflow's order is its own
        assert sorted(mine, key=key) == sorted(searched, key=key)
    assert [v.version for v in sqlite.model_versions(uri, MODEL) or []] == ["1"]
    assert made["searched"]["nothing_here"] == []
    assert _mlflow_untouched()


def test_show_reads_the_file_and_prints_what_it_prints_through_the_client(made: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["show", MODEL, "-V", "1", "--json"], env=_env(made))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == made["show"]
    assert made["show"]["aliases"] == ["production"]
    assert made["show"]["contract"]["platform"] == "python"
    assert _mlflow_untouched()


def test_history_reads_the_runs_from_the_file(made: dict[str, Any]) -> None:
    env = _env(made)
    result = CliRunner().invoke(app, ["history", MODEL, "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["promotions"]
    assert [row["run_id"] for row in rows] == [row["run_id"] for row in made["everywhere"]]
    assert [row["result"] for row in rows] == ["promoted", "aborted (undone)", "promoted"]
    missing = CliRunner().invoke(app, ["history", MODEL + "s"], env=env)
    assert missing.exit_code == 4
    assert f"did you mean '{MODEL}'" in missing.stderr
    assert _mlflow_untouched()


def test_a_member_s_arrival_through_its_ensemble_is_in_its_history(made: dict[str, Any]) -> None:
    """image_preprocess v1 has no promotion run of its own: it went live with an_ensemble v3.  Its
    other promotion_run_ tags (a deleted run, another model's run in another environment, no run
    id at all) are not trusted into rows; the file answers what MLflow's client answers."""
    arrived = {
        "environment": "local",
        "from": None,
        "to": "1",
        "result": "arrived with an_ensemble v3",
        "through": {"model": "an_ensemble", "version": "3"},
        "user": "h7",
        "run_id": made["ensemble"],
        "model": "an_ensemble",
    }
    assert [{k: v for k, v in row.items() if k != "when"} for row in made["arrivals"]] == [arrived]
    result = CliRunner().invoke(app, ["history", OTHER, "--json"], env=_env(made))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["promotions"] == made["arrivals"]
    table = CliRunner().invoke(app, ["history", OTHER, "--env", "local"], env=_env(made))
    assert table.exit_code == 0, table.output
    assert "arrived with an_ensemble v3" in table.stdout
    assert _mlflow_untouched()


def test_alias_ls_reads_the_aliases_from_the_file(made: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["alias", "ls", MODEL, "--json"], env=_env(made))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"model": MODEL, "aliases": made["aliases"]}
    table = CliRunner().invoke(app, ["alias", "ls", MODEL], env=_env(made))
    assert table.stdout.splitlines() == ["ALIAS       VERSION", "production        1"]
    assert _mlflow_untouched()


def test_a_typo_d_promote_is_refused_from_the_registry_before_any_server_is_asked(
    made: dict[str, Any],
) -> None:
    """No stack runs: the refusal is the registry's ("did you mean"), not the stack's."""
    env = _env(made)
    result = CliRunner().invoke(app, ["promote", MODEL + "s", "--version", "1"], env=env)
    assert result.exit_code == 4, result.output
    assert f"model '{MODEL}s' is not registered" in result.stderr
    assert f"did you mean '{MODEL}'" in result.stderr
    version = CliRunner().invoke(app, ["promote", MODEL, "--version", "7"], env=env)
    assert version.exit_code == 4, version.output
    assert f"{MODEL} version '7' is not a registered version" in version.stderr
    assert f"{MODEL} has versions 1;" in version.stderr
    assert _mlflow_untouched()


def test_an_unknown_version_of_show_names_the_versions_there_are(made: dict[str, Any]) -> None:
    reads = open_reads(_settings(made), _no_client)
    with pytest.raises(RegistryError, match="version '3' is not a registered version") as caught:
        reads.version(OTHER, "3")
    assert caught.value.fix.startswith(f"{OTHER} has versions 1;")
    with pytest.raises(RegistryError, match="did you mean 'image_preprocess'"):
        reads.version("image_preprocesss", "1")


def test_a_run_s_artifact_outside_its_folder_is_never_read(made: dict[str, Any]) -> None:
    reads = open_reads(_settings(made), _no_client)
    run_id = reads.version(MODEL, "1").run_id
    folder = sqlite.run_artifacts(reads_uri(made), run_id)
    assert folder is not None
    assert (folder / "config.pbtxt").is_file()
    with pytest.raises(AssertionError, match="should have answered"):  # handed to the client, not read
        reads.artifact_text(run_id, "../../../mlflow.db")


def reads_uri(made: dict[str, Any]) -> str:
    return _settings(made).tracking_uri


TABLES = [
    (["A", "BB", "C"], [["x", "12345", "-"], ["longer", "1", "z"]], None, {"BB"}),
    (["", "TENSOR", "DTYPE", "SHAPE"], [["input", "table_data_input_1", "INT8", "[-1, 1]"]], None, ()),
    (["MODEL", "ALIAS"], [], None, ()),
    (["MODEL", "ALIAS"], [["a", "b"]], "a title", ()),
    (["VERSION", "NOTE"], [["1", "two  spaces "]], None, {"VERSION"}),
]


def _rich_lines(columns: list[str], rows: list[list[str]], title: str | None, right: Any) -> list[str]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False, header_style="bold", title_justify="left")
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    Console(file=buffer, width=10_000, force_terminal=False, soft_wrap=True).print(table)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


@pytest.mark.parametrize(("columns", "rows", "title", "right"), TABLES)
def test_a_plain_table_is_the_lines_rich_draws(
    columns: list[str], rows: list[list[str]], title: str | None, right: Any
) -> None:
    drawn = plain_lines(columns, rows, title=title, right=right, width=10_000, terminal=False)
    assert drawn == _rich_lines(columns, rows, title, right)


def test_rich_draws_what_plain_lines_cannot() -> None:
    wide = plain_lines(["A"], [["日本"]], title=None, right=(), width=80, terminal=False)
    narrow = plain_lines(["A", "B"], [["x" * 50, "y" * 50]], title=None, right=(), width=80, terminal=True)
    assert wide is None
    assert narrow is None
    bold = plain_lines(["A"], [["x"]], title=None, right=(), width=80, terminal=True)
    assert bold == ["\x1b[1mA\x1b[0m", "x"]
