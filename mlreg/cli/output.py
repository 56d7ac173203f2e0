"""The one output sink of the ``mlreg`` command.

Commands never format text themselves: they hand results to an ``Output`` (``sink(ctx, as_json)``),
which prints either one JSON document (``--json``) or what people read — ``rich`` tables
(``render_table``), ``key value`` fields and plain lines.  Every failure, from a bad option to a
closed pipe, is reported in one place (``report``, called by ``MlregGroup.main``):
``error: what, where`` and ``fix: what to do`` on stderr, the error class's exit code
(``registry.errors``), one JSON error document on stdout with ``--json``, and a traceback only
with ``MLREG_DEBUG=1``.  Whatever passes through here -- documents, lines, tables, errors,
tracebacks -- has the credentials of every URI in it masked (``registry.settings.redact_uri``).

Importing this module stays cheap (``mlreg --help`` loads it): ``rich`` is imported only when a
table is drawn.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import typer
from typer.core import TyperGroup

try:  # typer >= 0.24 carries its own click
    from typer import _click
except ImportError:  # pragma: no cover - older typer
    import click as _click  # type: ignore[no-redef]

from registry.errors import (
    INTERRUPT_EXIT_CODES,
    MlregError,
    OutputClosedError,
    SettingsError,
    Terminated,
    UsageError,
)
from registry.settings import env_flag, redact_data, redact_uri

F = TypeVar("F", bound=Callable[..., Any])
INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130


class _Run:
    """What the error handler needs to know about the command that runs now."""

    def __init__(self) -> None:
        self.json = False
        self.emitted = False
        self.debug: bool | None = None  # the Settings' value once the root callback read it
        self.home: str | None = None  # MLREG_HOME: a file error under it is a SettingsError

    def reset(self, argv: Sequence[str]) -> None:
        options = argv[: list(argv).index("--")] if "--" in argv else argv
        self.json = "--json" in options
        self.emitted = False
        self.debug = None
        self.home = None

    @property
    def debugging(self) -> bool:
        return env_flag("MLREG_DEBUG") if self.debug is None else self.debug


RUN = _Run()


def render_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    right: Collection[str] = (),
) -> None:
    """Print ``rows`` under ``columns`` as a ``rich`` table on stdout (``right``: right-aligned columns).

    Cells are never cut or wrapped when stdout is not a terminal, so ``grep``/``awk`` see whole rows.
    """
    import io
    import shutil

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False, header_style="bold", title_justify="left")
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*("-" if cell is None or cell == "" else redact_uri(str(cell)) for cell in row))
    terminal = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else 10_000
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=terminal, soft_wrap=not terminal).print(table)
    for line in buffer.getvalue().splitlines():
        typer.echo(line.rstrip())


def rollout_line(rollout: Mapping[str, Any]) -> str:
    """``canary [a] ▸ bake 60 s ▸ wave 2 [b, c]`` for a plan's roll-out."""
    parts = []
    waves = rollout["waves"]
    for index, wave in enumerate(waves):
        parts.append(f"{'canary' if index == 0 else f'wave {index + 1}'} [{', '.join(wave)}]")
        if index + 1 < len(waves) and rollout["bake_seconds"]:
            parts.append(f"bake {rollout['bake_seconds']:g} s")
    from pipelines.promote.policy import Check

    checks = ", ".join(Check(c["metric"], c["min"], c["max"]).describe() for c in rollout["checks"])
    return " ▸ ".join(parts) + f" (max_parallel {rollout['max_parallel']}; bake checks: {checks or 'none'})"


class Output:
    """One command's results: a JSON document with ``--json``, else lines and tables for people."""

    def __init__(self, as_json: bool = False) -> None:
        self.json = as_json

    def document(self, data: object) -> None:
        """The command's one JSON document (stdout)."""
        import json

        RUN.emitted = True
        plain = json.loads(json.dumps(data, default=str))  # what default=str makes of objects, too
        typer.echo(json.dumps(redact_data(plain), indent=2))

    def result(self, data: object, human: Callable[[], None]) -> None:
        """``data`` as JSON with ``--json``, else whatever ``human`` prints."""
        if self.json:
            self.document(data)
        else:
            human()

    def line(self, text: str = "") -> None:
        if not self.json:
            typer.echo(redact_uri(text))

    def note(self, text: str) -> None:
        """A line about progress (stderr), never mixed into a JSON document."""
        if not self.json:
            typer.echo(redact_uri(text), err=True)

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[object]],
        *,
        title: str | None = None,
        right: Collection[str] = (),
    ) -> None:
        if not self.json:
            render_table(columns, rows, title=title, right=right)

    def fields(self, pairs: Mapping[str, object], indent: int = 2) -> None:
        """``key  value`` lines, keys aligned."""
        if self.json or not pairs:
            return
        width = max(len(k) for k in pairs)
        for key, value in pairs.items():
            typer.echo(redact_uri(f"{' ' * indent}{key:<{width}}  {value}"))


def emit_json(data: object) -> None:
    """The command's JSON document (kept for commands not yet on ``Output``)."""
    Output(True).document(data)


def handle_errors(fn: F) -> F:
    """No longer needed: ``MlregGroup`` reports every failure.  Kept so older commands still import."""
    return fn


# -- failures ------------------------------------------------------------------------------------


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
    # lazy: the storage package is read only when a command failed (mlreg --help stays cheap)
    from pathlib import Path
    from tempfile import gettempdir

    from pipelines.storage.disk import disk_full_error, is_disk_full

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
        import traceback

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


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


RAISED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM, SIGHUP (a closed terminal or SSH session) and SIGQUIT raise ``Terminated`` where the
    command is (as SIGINT raises KeyboardInterrupt), so a promotion puts back what it changed
    before the process exits 143, 129 or 131 (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _terminated) for sig in RAISED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
            with _sigterm_raises():
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
