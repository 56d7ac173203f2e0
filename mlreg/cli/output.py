"""Rendering shared by every command: errors, JSON, plain lines."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from registry.errors import MlregError

F = TypeVar("F", bound=Callable[..., Any])
INTERNAL_ERROR_EXIT = 70


def debug() -> bool:
    return os.environ.get("MLREG_DEBUG", "").strip() in {"1", "true", "yes"}


_emitted: list[bool] = []  # whether this command already wrote its JSON document


def emit_json(data: object) -> None:
    _emitted.append(True)
    typer.echo(json.dumps(data, indent=2, default=str))


def error_document(exc: BaseException, code: int) -> dict[str, object]:
    """What ``--json`` prints on stdout when a command fails before its own document."""
    if isinstance(exc, MlregError):
        return {
            "ok": False,
            "error": exc.message,
            "fix": exc.fix,
            "exit_code": code,
            "kind": type(exc).__name__,
        }
    return {
        "ok": False,
        "error": f"internal error: {type(exc).__name__}: {exc}",
        "fix": "",
        "exit_code": code,
        "kind": "InternalError",
    }


def fail(exc: BaseException) -> typer.Exit:
    """Print a failure the way users see it and return the Exit to raise."""
    if debug():
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, MlregError):
        typer.echo(f"error: {exc.message}", err=True)
        if exc.fix:
            typer.echo(f"fix: {exc.fix}", err=True)
        code = exc.exit_code
    else:
        typer.echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        code = INTERNAL_ERROR_EXIT
    if not debug():
        typer.echo("(set MLREG_DEBUG=1 for the traceback)", err=True)
    return typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn every exception of a command into one clear message and an exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _emitted.clear()  # per command, also when several run in one process (tests)
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except Exception as exc:
            failure = fail(exc)
            if kwargs.get("as_json") and not _emitted:  # CI reads stdout: one document always
                emit_json(error_document(exc, failure.exit_code))
            raise failure from None

    return wrapper  # type: ignore[return-value]
