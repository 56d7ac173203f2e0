"""Every failure of the ``mlreg`` command, reported in one place (``report``, called by
``MlregGroup.main``): ``error: what, where`` and ``fix: what to do`` on stderr, the error class's
exit code (``registry.errors``), one JSON error document on stdout with ``--json``, and a traceback
only with ``MLREG_DEBUG=1``; credentials in URIs masked.  Signals: :mod:`mlreg.cli.signals`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from tempfile import gettempdir
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.24 carries its own click
    from typer import _click
except ImportError:  # pragma: no cover - older typer
    import click as _click  # type: ignore[no-redef]

from mlreg.cli.signals import sigterm_raises
from mlreg.cli.sink import RUN, Output
from registry.errors import (
    INTERRUPT_EXIT_CODES,
    MlregError,
    OutputClosedError,
    SettingsError,
    Terminated,
    UsageError,
)
from registry.settings import redact_uri

INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130


def _as_mlreg_error(exc: BaseException) -> MlregError | None:
    """The user-facing error ``exc`` stands for; None for a bug (an internal error)."""
    if isinstance(exc, MlregError):
        return exc
    if isinstance(exc, _click.exceptions.UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "mlreg"
        return UsageError(exc.format_message(), fix=f"see '{command} --help'")
    if isinstance(exc, _click.exceptions.ClickException):
        return UsageError(exc.format_message(), fix="see 'mlreg --help'")
    if isinstance(exc, BrokenPipeError):
        return closed_pipe()
    full = _disk_full(exc)
    if full is not None:
        return full
    if isinstance(exc, OSError) and exc.strerror:
        where = f": '{exc.filename}'" if exc.filename else ""
        if RUN.home and str(exc.filename or "").startswith(RUN.home):
            return SettingsError(
                f"the state folder MLREG_HOME={RUN.home} cannot be used: {exc.strerror}{where}",
                fix="set MLREG_HOME to a writable folder (or unset it for <project>/.mlreg)",
            )
        return MlregError(
            f"{exc.strerror}{where}", fix="check that the path exists and that you may read and write there"
        )
    return None


def _disk_full(exc: BaseException) -> MlregError | None:
    """A full disk anywhere (TMPDIR, MLREG_HOME, a local store), however it was wrapped: one
    "disk full at PATH" error with the fix (the path the error names, else the fuller of the two)."""
    from pipelines.storage.disk import disk_full_error, is_disk_full  # lazy: only a failed command reads it

    if not is_disk_full(exc):
        return None
    places = [Path(gettempdir()), *([Path(RUN.home)] if RUN.home else [])]
    return disk_full_error(exc, "a file could not be written", *places)


def closed_pipe() -> OutputClosedError:
    return OutputClosedError(
        "the program reading mlreg's output closed it before the end (a closed pipe)",
        fix="let the reader take all of it (e.g. 'mlreg status | less'); "
        "ignore this if you wanted only the first lines",
    )


def error_document(exc: BaseException, code: int) -> dict[str, object]:
    """What ``--json`` prints on stdout when a command fails before its own document."""
    error = _as_mlreg_error(exc)
    if error is None:
        return {
            "ok": False,
            "error": redact_uri(f"internal error: {type(exc).__name__}: {exc}"),
            "fix": "",
            "exit_code": code,
            "kind": "InternalError",
        }
    return {
        "ok": False,
        "error": redact_uri(error.message),
        "fix": redact_uri(error.fix) if error.fix else error.fix,
        "exit_code": code,
        "kind": type(error).__name__,
    }


def _print_failure(exc: BaseException, error: MlregError | None) -> int:
    if RUN.debugging:
        import traceback  # lazy: only MLREG_DEBUG=1 prints a traceback

        sys.stderr.write(redact_uri("".join(traceback.format_exception(exc))))
    if error is None:
        typer.echo(redact_uri(f"error: internal error: {type(exc).__name__}: {exc}"), err=True)
        typer.echo("fix: this is a bug in mlreg: report it with the traceback (MLREG_DEBUG=1)", err=True)
        return INTERNAL_ERROR_EXIT
    if isinstance(exc, _click.exceptions.UsageError) and exc.ctx is not None:
        typer.echo(exc.ctx.get_usage(), err=True)
    typer.echo(redact_uri(f"error: {error.message}"), err=True)
    if error.fix:
        typer.echo(redact_uri(f"fix: {error.fix}"), err=True)
    if not RUN.debugging and not isinstance(error, (UsageError, SettingsError, OutputClosedError)):
        typer.echo("(set MLREG_DEBUG=1 for the traceback)", err=True)
    return error.exit_code


def report(exc: BaseException) -> int:
    """Print a failure the way users see it; return the exit code.  The one place errors go."""
    if isinstance(exc, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        return INTERRUPTED_EXIT
    if isinstance(exc, Terminated):
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            typer.echo(
                "terminated" if exc.signal_name == "SIGTERM" else f"terminated ({exc.signal_name})", err=True
            )
        return INTERRUPT_EXIT_CODES[exc.signal_name]
    if isinstance(exc, _click.exceptions.NoArgsIsHelpError):
        typer.echo(exc.format_message())
        return UsageError.exit_code
    if isinstance(exc, typer.Abort):
        typer.echo("aborted", err=True)
        return 1
    error = _as_mlreg_error(exc)
    if isinstance(error, OutputClosedError):
        silence_stdout()
    code = _print_failure(exc, error)
    if RUN.json and not RUN.emitted and not isinstance(error, OutputClosedError):
        Output(True).document(error_document(exc, code))  # CI reads stdout: one document, always
    return code


def silence_stdout() -> None:
    """After a closed pipe: later writes and the exit's flush go nowhere instead of failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests' captured stdout)
        pass


class MlregGroup(TyperGroup):
    """The root command: runs a command and sends every failure to ``report``."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        RUN.reset(argv)
        try:
            with sigterm_raises():
                outcome = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = outcome if isinstance(outcome, int) else 0
            sys.stdout.flush()
        except Exception as exc:
            code = report(exc)
        except (KeyboardInterrupt, Terminated) as exc:
            code = report(exc)
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx: _click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # typer would turn it into a bare exit 1
            raise closed_pipe() from None
