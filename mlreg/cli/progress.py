"""Progress: bars drawn only here, only in a terminal, never with MLREG_NO_PROGRESS=1; and the
lines that say a command still waits on a store or server that does not answer (``waiting``)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

from registry.settings import Settings, env_flag, redact_uri

WAIT_FIRST_S = 3.0  # a command silent this long says it still waits ...
WAIT_EVERY_S = 10.0  # ... and again this often


def enabled(settings: Settings | None = None) -> bool:
    """Bars only on a terminal and unless ``Settings.no_progress`` (MLREG_NO_PROGRESS) is on."""
    off = settings.no_progress if settings is not None else env_flag("MLREG_NO_PROGRESS")
    return sys.stderr.isatty() and not off


@contextmanager
def byte_progress(
    label: str, quiet: bool = False, settings: Settings | None = None
) -> Iterator[Callable[[int], None] | None]:
    """A callback taking bytes just sent, drawing a transfer bar (None when bars are off)."""
    if quiet or not enabled(settings):
        yield None
        return
    from rich.progress import (  # lazy: rich.progress ~80 ms, uploads only
        DownloadColumn,
        Progress,
        TransferSpeedColumn,
    )

    with Progress(
        *Progress.get_default_columns()[:1], DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as bar:
        task = bar.add_task(redact_uri(label), total=None)  # e.g. a store URI with its keys
        yield lambda n: bar.advance(task, n)


@contextmanager
def activity(quiet: bool = False, settings: Settings | None = None) -> Iterator[Callable[[str], None] | None]:
    """A callback taking what a long piece of work does now ("starting tritonserver", "quality"),
    drawn as one transient line on stderr: a spinner, the text and the seconds it has taken so far.
    On a terminal only: None with ``quiet`` (--json), off a TTY or with MLREG_NO_PROGRESS=1 (the
    command's own lines say what happened)."""
    if quiet or not enabled(settings):
        yield None
        return
    from rich.console import Console  # lazy: rich ~0.1 s, only where a line is drawn
    from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn  # lazy: ~80 ms

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    # stderr's lines (a promotion's stage lines) print above it; stdout is never re-routed to stderr
    with Progress(*columns, transient=True, console=Console(stderr=True), redirect_stdout=False) as bar:
        shown: list[TaskID] = []

        def tell(text: str) -> None:
            if shown:
                bar.remove_task(shown.pop())
            shown.append(bar.add_task(redact_uri(text), total=None))

        yield tell


@contextmanager
def waiting(label: str, deadline: str, quiet: bool = False) -> Iterator[None]:
    """While the block runs, a line on stderr after ``WAIT_FIRST_S`` and then every
    ``WAIT_EVERY_S`` ("{label}: still waiting after 3 s ({deadline})"), so a store or server that
    does not answer never looks like a hung mlreg; none with ``quiet`` (--json).  Lines, not a
    bar: they land in CI logs too."""
    if quiet:
        yield
        return
    done = threading.Event()
    began = time.monotonic()

    def tell() -> None:
        pause = WAIT_FIRST_S
        while not done.wait(pause):
            waited = time.monotonic() - began
            typer.echo(redact_uri(f"{label}: still waiting after {waited:.0f} s ({deadline})"), err=True)
            pause = WAIT_EVERY_S

    teller = threading.Thread(target=tell, name="waiting", daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()
        teller.join()
