"""typer's ``CliRunner``, with the app's click command built once a run.

typer builds the click command tree again on every ``invoke`` (~15 ms for mlreg's 26 commands: it
reads each command's signature and evaluates its annotations); the real CLI builds it once a
process, and so do the tests.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from unittest import mock

import typer
import typer.main
import typer.testing
from typer.testing import Result

__all__ = ["CliRunner", "Result"]


@functools.cache
def _command(app: typer.Typer) -> Any:
    return typer.main.get_command(app)


class CliRunner(typer.testing.CliRunner):
    def invoke(self, app: typer.Typer, args: str | Sequence[str] | None = None, **kwargs: Any) -> Result:  # type: ignore[override]
        with mock.patch.object(typer.testing, "_get_command", _command):
            return super().invoke(app, args, **kwargs)
