"""`mlreg rollback MODEL` without --to-version: the newest version promoted in the environment
that is not what serves now, never a repair rerun (``N -> N``) nor a failed attempt.

The registry is tests/fakes.py's, its history the rows ``MlflowRuns.promotions`` returns
(newest first); the promotion itself is not run: ``mlreg.ops.rollback.promote`` is replaced by a recorder.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlreg.cli.main import app
from mlreg.ops import rollback as rollback_op
from mlreg.ops.context import Context
from mlreg.ops.rollback import rollback_target
from pipelines.promote.environments import Environment
from registry.errors import UsageError
from tests.cli import CliRunner
from tests.fakes import FakeRegistry, FakeRuns

MODEL = "scorer"


def run(frm: str, to: str, result: str = "promoted", env: str = "local") -> dict[str, Any]:
    """One history row as MlflowRuns.promotions returns it."""
    return {
        "when": 0,
        "environment": env,
        "from": frm,
        "to": to,
        "result": result,
        "user": "u",
        "run_id": "r",
    }


class HistoryRuns(FakeRuns):
    """Runs whose promotions are ``rows`` (newest first)."""

    def __init__(self, registry: FakeRegistry, rows: list[dict[str, Any]]) -> None:
        super().__init__(registry)
        self.rows = rows

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.rows if env is None or r["environment"] == env]


class History(FakeRegistry):
    """A registry whose promotions are ``rows`` (newest first: ``runs``) and whose alias
    ``local`` names ``alias`` (none when "")."""

    def __init__(self, rows: list[dict[str, Any]], alias: str = "") -> None:
        super().__init__()
        self.runs = HistoryRuns(self, rows)
        if alias:
            self.alias_map = {MODEL: {"local": alias}}


def target(rows: list[dict[str, Any]], alias: str = "") -> tuple[str | None, tuple[str, ...]]:
    found = rollback_target(History(rows, alias), MODEL, "local", "local")
    return found.version, found.serving


def test_a_repair_rerun_is_not_a_way_back() -> None:
    rows = [run("2", "2"), run("1", "2"), run("none", "1")]  # 1 -> 2, then a repair rerun 2 -> 2
    assert target(rows, alias="2") == ("1", ("2",))


def test_a_failed_attempt_is_not_a_way_back() -> None:
    rows = [run("2", "3", "rolled back"), run("2", "4", "refused"), run("1", "2"), run("none", "1")]
    assert target(rows, alias="2") == ("1", ("2",))


def test_an_alias_left_on_an_interrupted_promotion_s_version_is_skipped_too() -> None:
    rows = [run("2", "7", "rolled back"), run("1", "2"), run("none", "1")]  # the alias moved, 2 serves
    assert target(rows, alias="7") == ("1", ("2", "7"))


def test_after_a_rollback_it_returns_to_the_version_it_left() -> None:
    rows = [run("2", "1"), run("1", "2"), run("none", "1")]
    assert target(rows, alias="1") == ("2", ("1",))


def test_only_repairs_of_what_serves_leave_no_way_back() -> None:
    assert target([run("2", "2"), run("2", "2"), run("none", "2")], alias="2") == (None, ("2",))


def test_other_environments_promotions_are_not_a_way_back() -> None:
    rows = [run("1", "2"), run("none", "1", env="prod")]
    assert target(rows, alias="2") == (None, ("2",))


# -- the rollback op and the CLI: the error a user sees ---------------------------------------------


@pytest.fixture
def app_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SimpleNamespace:
    """``context`` answers ``.registry`` (a History to fill); each promotion asked of ``promote``
    is appended to ``.promoted`` (both as ``mlreg.ops.rollback`` calls them)."""
    registry: Any = History([])  # the Registry protocol, where Context names MlflowRegistry
    env = Environment("local", str(tmp_path / "store"), ("triton-0:8001",), "local", gpu=False)
    monkeypatch.setattr(rollback_op, "context", lambda settings, name: Context(settings, env, registry))
    promoted: list[tuple[Any, ...]] = []

    def promote(settings: Any, env_name: str, model: str, version: str, options: Any) -> Any:
        promoted.append((env_name, model, version, options.allow_breaking, options.skip_quality))
        return SimpleNamespace(version=version)

    monkeypatch.setattr(rollback_op, "promote", promote)
    return SimpleNamespace(registry=registry, promoted=promoted)


def test_rollback_after_a_repair_rerun_promotes_the_version_before(app_state: SimpleNamespace) -> None:
    app_state.registry.runs.rows = [run("2", "2"), run("1", "2"), run("none", "1")]
    app_state.registry.alias_map = {MODEL: {"local": "2"}}
    rollback_op.rollback(SimpleNamespace(), "local", MODEL)  # type: ignore[arg-type]
    assert app_state.promoted == [("local", MODEL, "1", True, True)]  # breaking allowed, no gate


def test_rollback_with_no_other_promoted_version_names_what_serves_and_the_fix(
    app_state: SimpleNamespace,
) -> None:
    app_state.registry.runs.rows = [run("2", "2"), run("none", "2")]
    app_state.registry.alias_map = {MODEL: {"local": "2"}}
    with pytest.raises(
        UsageError, match=r"scorer in 'local': no earlier promoted version .*\(v2 serves"
    ) as err:
        rollback_op.rollback(SimpleNamespace(), "local", MODEL)  # type: ignore[arg-type]
    assert err.value.fix == "pass --to-version N (see 'mlreg history scorer --env local')"
    assert app_state.promoted == []  # nothing promoted, not even a no-op


def test_the_cli_exits_2_with_the_message_and_the_fix(
    app_state: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    app_state.registry.runs.rows = [run("1", "1")]
    app_state.registry.alias_map = {MODEL: {"local": "1"}}
    result = CliRunner().invoke(app, ["rollback", MODEL])
    assert result.exit_code == 2, result.output
    assert "error: scorer in 'local': no earlier promoted version to return to (v1 serves;" in result.output
    assert "fix: pass --to-version N (see 'mlreg history scorer --env local')" in result.output
    assert app_state.promoted == []
