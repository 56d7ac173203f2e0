"""What mlreg/cli/main.py does to start faster changes nothing a user sees.

- mlreg/cli/startup.py converts a plain parameter value only where typer's pydantic adapter would
  return the very same value; everything else (errors included) is typer's own.
- ``only_the_named`` builds the click tree of the one command or group a run names, and the whole
  app for anything else: the same help and errors either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param, resolve_type_descriptor
from typer.models import ArgumentInfo, OptionInfo
from typer.testing import CliRunner

from mlreg.cli import startup
from mlreg.cli.main import app, only_the_named

VALUES = [
    "0",
    "7",
    "007",
    "-3",
    "+5",
    " 5",
    "5 ",
    "1_000",
    "0x10",
    "5.0",
    "",
    "abc",
    "99999999999999999999",
    3,
    True,
]
VALUES += ["a", "a/", "./a//b/", "-", "~/x", " x ", Path("p"), b"bytes", None]
CASES = [
    (str, OptionInfo()),
    (bool, OptionInfo()),
    (int, OptionInfo()),
    (int, OptionInfo(min=0)),
    (int, OptionInfo(min=1, max=10)),
    (int, OptionInfo(min=0, clamp=True)),
    (Path, ArgumentInfo()),
    (Path, ArgumentInfo(exists=True)),
    (Path, ArgumentInfo(resolve_path=True)),
    (Path, ArgumentInfo(dir_okay=False)),
]


def typer_result(annotation: Any, info: Any, value: Any) -> Any:
    runtime = build_runtime_param(resolve_type_descriptor(annotation, info))
    try:
        return runtime._coerce_value(value, param=None, ctx=None)
    except BadParameter as exc:
        return f"error: {exc.message}"


@pytest.mark.parametrize(("annotation", "info"), CASES)
def test_a_plain_value_is_what_typers_adapter_returns(annotation: Any, info: Any) -> None:
    """Each value converted here equals (value and type) what typer's pydantic adapter returns;
    the others are left to the adapter, and what they give is the adapter's (errors too)."""
    descriptor = resolve_type_descriptor(annotation, info)
    light = startup.plain_runtime_param(descriptor)
    for value in [v for v in VALUES if v is not None]:
        expected = typer_result(annotation, info, value)
        plain = startup.plain_value(annotation, info, value)
        if plain is not startup._UNSURE:
            assert (plain, type(plain)) == (expected, type(expected)), value
        try:
            got = light._coerce_value(value, param=None, ctx=None)
        except BadParameter as exc:
            got = f"error: {exc.message}"
        assert (got, type(got)) == (expected, type(expected)), value


def test_the_plain_types_are_converted_here_and_the_cli_installs_it() -> None:
    assert typer.core.build_runtime_param is startup.plain_runtime_param
    assert typer.main.get_params_from_function.reads_once  # type: ignore[attr-defined]
    assert startup.install()  # installed once: again is a no-op
    assert startup.plain_value(Path, ArgumentInfo(), "model_repository") == Path("model_repository")
    assert startup.plain_value(int, OptionInfo(min=0), "2") == 2
    assert startup.plain_value(int, OptionInfo(min=0), "-1") is startup._UNSURE  # pydantic's message
    assert app is not None


def test_a_run_naming_one_command_builds_that_command_only() -> None:
    for argv in ([], ["--help"], ["-v", "validate"], ["nosuch"], ["validat"]):
        assert only_the_named(argv) is app, argv
    named = only_the_named(["validate", "x"])
    assert [c.name for c in named.registered_commands] == ["validate"]
    assert named.registered_groups == []
    assert [g.name for g in only_the_named(["store", "ls"]).registered_groups] == ["store"]
    assert len(app.registered_commands) > 1  # the app itself is left whole


@pytest.mark.parametrize(
    "argv",
    [["validate", "--help"], ["validate", "--gpus", "abc", "x"], ["store", "--help"], ["store", "nosuch"]],
)
def test_the_one_command_app_says_what_the_whole_app_says(argv: list[str]) -> None:
    runner = CliRunner()
    whole, named = runner.invoke(app, argv), runner.invoke(only_the_named(argv), argv)
    assert (named.exit_code, named.output) == (whole.exit_code, whole.output)
    assert whole.output
