"""One ``Options`` (pipelines/core/options.py), built where a request comes in and passed down whole
(issue 47 item 1): the CLI's promote, rollback and fleet sync build it from their flags, the MLflow
deployments target from its ``-C`` keys; the verbs take it, none re-declares its fields.  A check's
``--skip`` name is the registered name (pipelines/promote/registered.py), so a new check needs no
new keyword anywhere.

The verbs below the CLI are replaced by recorders (the promotion itself is not what is tested here:
tests/integration/test_promote.py runs it); what is asserted is the Options object they receive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlreg import deployment_io
from mlreg.cli.main import app
from mlreg.cli.promote_render import batch_stage
from mlreg.ops import fleet_pins, promote_many
from mlreg.ops import promote as promote_op
from mlreg.ops import rollback as rollback_op
from pipelines.core.options import Options
from pipelines.promote import registered
from registry.errors import UsageError
from registry.settings import Settings
from tests.cli import CliRunner

STOP = "recorded: the promotion itself is not run here"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    return tmp_path / "home"


def recorder(calls: list[tuple[Any, ...]]) -> Any:
    """A verb that records its positional arguments and stops the command (exit 2, STOP)."""

    def verb(*args: Any) -> Any:
        calls.append(args)
        raise UsageError(STOP)

    return verb


def stopped(result: Any) -> None:
    """The command reached the recorder: exit 2 with its message."""
    assert result.exit_code == 2, result.output
    assert STOP in result.output


def test_promote_builds_one_options_from_every_flag_the_older_ones_as_skip_names(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(promote_op, "promote", recorder(calls))
    args = ["promote", "m", "--version", "2", "--skip", "golden, perf", "--skip-shadow", "--dry-run"]
    result = CliRunner().invoke(app, [*args, "--serve-as", "onnx", "--no-way-back", "--allow-breaking"])
    stopped(result)
    [(_, env, model, version, options)] = calls
    assert (env, model, version) == ("local", "m", "2")
    assert isinstance(options, Options)
    assert options.skip == {"golden", "perf", "shadow"}
    assert (options.skip_quality, options.skip_perf, options.skip_shadow) == (False, True, True)
    assert (options.dry_run, options.allow_breaking, options.no_way_back) == (True, True, True)
    assert (options.serve_as, options.rollback) == ("onnx", False)
    assert callable(options.on_stage)  # the stage lines the CLI prints


@pytest.mark.parametrize(("flag", "name"), [("--skip-quality", "quality"), ("--skip-perf", "perf")])
def test_each_older_skip_flag_is_its_registered_name(
    home: Path, monkeypatch: pytest.MonkeyPatch, flag: str, name: str
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(promote_op, "promote", recorder(calls))
    result = CliRunner().invoke(app, ["promote", "m", "--version", "2", flag])
    stopped(result)
    assert calls[0][4].skip == {name}
    assert name in registered.names()


def test_promote_from_an_alias_passes_the_same_options_with_the_batch_stage_lines(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(promote_many, "promote_listed", recorder(calls))
    args = ["promote", "--from-alias", "staging", "--env", "local", "--skip", "shadow", "--dry-run"]
    result = CliRunner().invoke(app, args)
    stopped(result)
    [(_, env, from_alias, from_file, model, options)] = calls
    assert (env, from_alias, from_file, model) == ("local", "staging", None, None)
    assert (options.skip, options.dry_run) == ({"shadow"}, True)
    assert options.on_stage is batch_stage


def test_rollback_keeps_the_callers_options_and_adds_its_own(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(rollback_op, "promote", recorder(calls))
    result = CliRunner().invoke(app, ["rollback", "m", "--to-version", "1", "--dry-run"])
    stopped(result)
    [(_, env, model, version, options)] = calls
    assert (env, model, version) == ("local", "m", "1")
    assert (options.dry_run, options.allow_breaking, options.rollback) == (True, True, True)
    assert (options.skip, options.skip_quality) == ({"quality"}, True)  # a rollback runs no gate
    assert callable(options.on_stage)


def test_fleet_sync_builds_its_options_from_its_flags(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(fleet_pins, "sync", recorder(calls))
    file = tmp_path / "production.toml"
    result = CliRunner().invoke(app, ["fleet", "sync", str(file), "--dry-run", "--skip-quality"])
    stopped(result)
    [(_, path, env, options)] = calls
    assert (path, env) == (file, None)
    assert options == Options(dry_run=True, skip_quality=True, on_stage=batch_stage)
    assert options.skip == {"quality"}


def test_the_deployment_targets_config_keys_are_one_options() -> None:
    config = {"dry_run": "true", "skip_quality": "1", "serve_as": "onnx", "allow_breaking": "off"}
    assert deployment_io.promote_options(config) == Options(dry_run=True, skip_quality=True, serve_as="onnx")
    assert deployment_io.promote_options({}) == Options()


@dataclass(frozen=True)
class Novel:
    """A check registered after the CLI was written: only its name matters to --skip."""

    name: str = "novel"
    phase: str = "gate"
    where: tuple[str, ...] = ("canary",)
    aliases: tuple[str, ...] = ()


def test_a_newly_registered_check_is_skipped_by_its_name_with_no_new_keyword(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verb refuses a name no check is registered under, and takes one as soon as it is: the
    vocabulary of --skip is the registration, not a keyword of the CLI, the verb or Options."""
    settings = Settings.from_env()
    unknown = Options(skip=frozenset({"novel"}))
    with pytest.raises(UsageError, match=r"--skip: unknown check 'novel'"):
        promote_op.promote(settings, "local", "m", "two", unknown)
    monkeypatch.setattr(registered, "CHECKS", (*registered.CHECKS, Novel()))
    # past the names: the next refusal is the version's (nothing was read before either)
    with pytest.raises(UsageError, match=r"version 'two' is not a number"):
        promote_op.promote(settings, "local", "m", "two", unknown)
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(promote_op, "promote", recorder(calls))
    result = CliRunner().invoke(app, ["promote", "m", "--version", "2", "--skip", "novel"])
    stopped(result)
    assert calls[0][4].skip == {"novel"}


def test_options_without_a_caller_are_the_defaults_and_replace_keeps_the_aliases_equal() -> None:
    told = replace(Options(skip=frozenset({"perf"})), skip_quality=True)
    assert (told.skip, told.skip_perf, told.skip_shadow) == ({"perf", "quality"}, True, False)
    assert SimpleNamespace(**vars(Options())) == SimpleNamespace(
        dry_run=False,
        allow_breaking=False,
        skip_quality=False,
        serve_as="auto",
        on_stage=None,
        skip_perf=False,
        no_way_back=False,
        skip_shadow=False,
        on_start=None,
        rollback=False,
        skip=frozenset(),
    )
