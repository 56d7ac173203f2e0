"""The mlreg CLI: exit codes and the lines users see."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    return CliRunner()


def test_help_lists_the_command_groups(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "template" in result.output
    assert "stack" in result.output


def test_stack_status_when_nothing_runs(runner: CliRunner) -> None:
    result = runner.invoke(app, ["stack", "status"])
    assert result.exit_code == 1
    assert "the local stack is not running (start it with 'mlreg stack up')" in result.output


def test_stack_down_when_nothing_runs(runner: CliRunner) -> None:
    result = runner.invoke(app, ["stack", "down"])
    assert result.exit_code == 0
    assert "the local stack was not running" in result.output


def test_stack_up_on_a_missing_repository_names_it_and_the_fix(
    runner: CliRunner,
    tmp_path: Path,
) -> None:
    result = runner.invoke(app, ["stack", "up", "--repository", str(tmp_path / "nope")])
    assert result.exit_code == 7
    assert f"error: model repository '{tmp_path / 'nope'}' does not exist" in result.output
    assert "fix: build one with 'mlreg template build" in result.output
    assert "Traceback" not in result.output


def test_template_build_of_an_unknown_model(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["template", "build", str(tmp_path / "out"), "-m", "nope"])
    assert result.exit_code == 11
    assert "error: no model named nope in the template" in result.output
    assert "fix: choose from: ensemble_multi_modal_model, image_model" in result.output


def test_template_build_of_python_models_needs_no_export(
    runner: CliRunner,
    tmp_path: Path,
) -> None:
    result = runner.invoke(
        app, ["template", "build", str(tmp_path / "out"), "-m", "table_data_preprocess", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"table_data_preprocess"' in result.output
    assert (tmp_path / "out/table_data_preprocess/1/model.py").is_file()
