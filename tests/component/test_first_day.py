"""A team's first day with a model of its own (issue 48, items 2-6): ``register`` says when the
version it recorded failed validation, shell completion and "did you mean", every replica's ports
from ``stack up``/``stack status``, history results that read one way, and the wordings fixed."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app
from mlreg.ops.history import result_of
from pipelines.checks.capture import Shadow
from pipelines.checks.replay import ShadowResult, judge
from pipelines.core.reports import QualityStageReport
from pipelines.devstack.processes import process_runs
from registry.mlflow import sqlite
from tests.component.conftest import Background, CliRuns, Finished

ROOT = Path(__file__).resolve().parents[2]
MLREG = str(Path(sys.executable).parent / "mlreg")  # the console script: completion keys on its name
SCORER = """name: "scorer"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [ 1 ] }]
"""


def _complete(shell: str, words: str) -> Background:
    env = {
        "_MLREG_COMPLETE": f"complete_{shell}",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    env |= {"_TYPER_COMPLETE_ARGS": words, "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    return Background([MLREG], env=env)


# fresh interpreters, run beside the suite (tests/component/conftest.py)
# typer detects the user's shell (shellingham); its testing switch takes the shell as a value instead
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
BACKGROUND = {
    **{
        f"show {shell}": Background([MLREG, "--show-completion", shell], env=NAMED_SHELL)
        for shell in ("bash", "zsh", "fish")
    },
    **{f"complete {shell}": _complete(shell, "mlreg sta") for shell in ("bash", "zsh", "fish")},
}


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    return CliRunner()


# -- item 2: register exits non-zero for a version that failed validation --------------------------


def _broken_scorer(root: Path, other: str) -> Path:
    """A python model whose model.py is missing (its version folder holds ``other.py``)."""
    folder = root / "scorer"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(SCORER)
    (folder / "1" / "other.py").write_text(other)
    return folder


def test_register_of_a_version_that_fails_validation_records_it_and_exits_3(
    tmp_path: Path, registry_home: Path, mlreg_cli: CliRuns
) -> None:
    first = _broken_scorer(tmp_path / "a", "x = 1\n")
    second = _broken_scorer(tmp_path / "b", "x = 2\n")
    failed, meant = mlreg_cli(
        registry_home,
        ["register", "scorer", str(first), "--json"],
        ["register", "scorer", str(second), "--allow-invalid"],
    )
    assert failed["exit_code"] == 3, failed
    [row] = json.loads(failed["stdout"])["versions"]  # one JSON document, the version in it
    assert (row["version"], row["created"], row["validation"]) == ("1", True, "failed")
    assert "error: scorer v1 failed validation: registered, tagged validation=failed" in failed["stderr"]
    assert "pass --allow-invalid where a failing version is meant" in failed["stderr"]
    assert meant["exit_code"] == 0, meant
    assert "scorer: registered version 2 (validation failed)" in meant["stdout"]
    record = sqlite.registered_model(f"sqlite:///{registry_home / 'mlflow.db'}", "scorer")
    assert record is not None
    assert sorted((v, tags["validation"]) for v, _, tags in record.versions) == [
        ("1", "failed"),
        ("2", "failed"),
    ]


def test_register_of_a_folder_whose_version_folder_is_not_a_number_is_a_contract_error(
    runner: CliRunner, tmp_path: Path
) -> None:
    folder = tmp_path / "scorer"
    (folder / "v1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(SCORER)
    result = runner.invoke(app, ["register", "scorer", str(folder)])
    assert result.exit_code == 3, result.output
    assert (
        f"error: '{folder}' holds no version folder: Triton's version folders are named by numbers "
        "(1/, 2/, ...), and 'v1' is not"
    ) in result.stderr
    assert f"fix: rename '{folder / 'v1'}' to '{folder / '1'}'" in result.stderr
    assert not (tmp_path / "home").exists()  # refused before any registry was opened


# -- item 3: shell completion, "did you mean" ------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_scripts_and_answers(shell: str, background: Finished) -> None:
    script = background(f"show {shell}")
    assert script.returncode == 0, script.stderr
    assert "_MLREG_COMPLETE" in script.stdout
    assert f"complete_{shell}" in script.stdout
    answer = background(f"complete {shell}")
    assert answer.returncode == 0, answer.stderr
    assert "stack" in answer.stdout
    assert "status" in answer.stdout
    assert "promote" not in answer.stdout  # only what "sta" begins


def test_help_offers_completion(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--install-completion" in result.stdout
    assert "--show-completion" in result.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["promte", "m"], "No such command 'promte'. Did you mean 'promote'?"),
        (["stack", "stauts"], "'status'?"),
    ],
)
def test_a_typo_d_command_gets_did_you_mean(runner: CliRunner, argv: list[str], said: str) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert said in result.stderr


# -- item 4: every replica's ports -----------------------------------------------------------------


def _live(http_url: str) -> int:
    with urllib.request.urlopen(f"{http_url}/v2/health/live", timeout=10) as answer:
        return int(answer.status)


def test_stack_up_and_status_print_every_replica_s_ports(runner: CliRunner) -> None:
    """A real two-replica local stack (tritonserver from the wheel; ~1 s up, ~1 s down)."""
    try:
        up = runner.invoke(app, ["stack", "up", "--no-ui", "--replicas", "2"])
        assert up.exit_code == 0, up.output
        status = runner.invoke(app, ["stack", "status", "--json"])
        assert status.exit_code == 0, status.output
        servers = json.loads(status.stdout)["servers"]
        assert [s["replica"] for s in servers] == [0, 1]
        assert len({s["grpc_url"] for s in servers} | {s["http_url"] for s in servers}) == 4
        for server in servers:
            assert _live(str(server["http_url"])) == 200  # the ports printed are the replica's own
            line = (
                f"replica {server['replica']}    grpc {server['grpc_url']}  http {server['http_url']}  "
                f"metrics {server['metrics_url']}  (pid {server['pid']})"
            )
            assert line in up.stdout
            assert line in runner.invoke(app, ["stack", "status"]).stdout
    finally:
        down = runner.invoke(app, ["stack", "down"])
    assert down.exit_code == 0, down.output
    assert not [s["pid"] for s in servers if process_runs(int(s["pid"]), "tritonserver")]


# -- item 5: history results read one way ----------------------------------------------------------


def _row(result: str, before: str, to: str) -> dict[str, str]:
    """A promotion as the registry's ``promotions`` returns it (registry/mlflow/runs.py)."""
    return {"environment": "local", "from": before, "to": to, "result": result, "run_id": "r"}


@pytest.mark.parametrize(
    ("row", "reads"),
    [
        (_row("promoted", "none", "1"), "promoted"),  # the first promotion
        (_row("promoted", "1", "2"), "promoted"),
        (_row("promoted", "2", "2"), "promoted"),  # a repair rerun
        (_row("promoted", "1,2", "1"), "rolled back"),  # back to an earlier version (mlreg rollback)
        (_row("promoted", "3", "2"), "rolled back"),
        (_row("refused", "1", "2"), "refused"),  # a check refused it before any change
        (_row("rolled back", "1", "2"), "aborted (undone)"),  # a failed attempt, its changes put back
        (_row("rollback failed", "1", "2"), "aborted (undo failed)"),
    ],
)
def test_history_results_read_unambiguously(row: dict[str, str], reads: str) -> None:
    assert result_of(row) == reads


# -- item 6: wordings --------------------------------------------------------------------------------


def test_the_shadow_refusal_says_what_is_allowed_of_what() -> None:
    result = ShadowResult("m", "2", "1", judged=60, diverged=5, floor=0)
    judged = judge(result, Shadow())
    assert not judged.ok
    assert judged.allowed == 0.3
    assert judged.verdict == (
        "refused: 5 divergent request(s) above the floor, more than the 0.3 allowed "
        "(max_divergence 0.5% of 60 judged request(s))"
    )


@pytest.mark.parametrize(
    ("checked", "generated", "line"),
    [
        (["a"], [], "golden inputs passed on a"),
        (
            ["a", "b"],
            ["b"],
            "golden inputs passed on a; inputs made from the config (no golden inputs given) passed on b",
        ),
        ([], [], "no model was sent inputs"),
    ],
)
def test_the_quality_line_says_whose_inputs_were_golden(
    checked: list[str], generated: list[str], line: str
) -> None:
    report = QualityStageReport(checked, {}, generated=generated)
    assert report.detail() == line


def test_an_unknown_environment_without_mlreg_toml_says_the_file_does_not_exist(
    runner: CliRunner, tmp_path: Path
) -> None:
    result = runner.invoke(app, ["status", "--env", "fleet"])
    assert result.exit_code == 2, result.output
    assert "error: unknown environment 'fleet'" in result.stderr
    assert f"{tmp_path / 'mlreg.toml'} does not exist: 'mlreg init' writes one" in result.stderr
    assert "defined in" not in result.stderr
    (tmp_path / "mlreg.toml").write_text("")
    result = runner.invoke(app, ["status", "--env", "fleet"])
    assert f"(defined in {tmp_path / 'mlreg.toml'})" in result.stderr


def test_an_unknown_model_name_gets_did_you_mean_from_the_embedded_registry(
    runner: CliRunner, registry_state: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(registry_state("a_v1")))  # model 'a' registered
    result = runner.invoke(app, ["versions", "a_"])
    assert result.exit_code == 4, result.output
    assert "error: model 'a_' is not registered in MLflow" in result.stderr
    assert "fix: did you mean 'a'? check the name; 'mlreg export' or 'mlreg register" in result.stderr
    far = runner.invoke(app, ["versions", "image_model"])
    assert "fix: check the name;" in far.stderr  # nothing close: no guess
