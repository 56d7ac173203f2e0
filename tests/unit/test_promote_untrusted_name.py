"""A model name that cannot be stored is refused before any registry is asked: the manual
workflow's dispatch input reaches ``mlreg promote`` as data (tests/integration/test_workflows.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlreg.cli.main import app
from tests.cli import CliRunner

INJECTION = 'x"; touch PWNED; echo "'


def test_a_name_that_cannot_be_stored_is_refused_before_mlflow_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mlreg.toml").write_text(
        f'[environments.staging]\nstore = "{tmp_path / "store"}"\ntargets = ["127.0.0.1:1"]\n'
        'alias = "staging"\ngpu = false\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / ".mlreg"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens: never asked
    result = CliRunner().invoke(app, ["promote", INJECTION, "--version", "1", "--env", "staging"])
    assert result.exit_code == 5, result.output
    assert f"error: model name '{INJECTION}' cannot be stored" in result.stderr
    assert "MLflow" not in result.stderr  # refused before the registry, not by its lookup
    assert list(tmp_path.rglob("PWNED")) == []
    assert not (tmp_path / "store").exists()  # nothing written
