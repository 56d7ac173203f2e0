"""Progress bars: drawn only here, only in a terminal, never with MLREG_NO_PROGRESS=1."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def enabled() -> bool:
    return sys.stderr.isatty() and os.environ.get("MLREG_NO_PROGRESS", "") not in {"1", "true"}


@contextmanager
def byte_progress(label: str, quiet: bool = False) -> Iterator[Callable[[int], None] | None]:
    """A callback taking bytes just sent, drawing a transfer bar (None when bars are off)."""
    if quiet or not enabled():
        yield None
        return
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        *Progress.get_default_columns()[:1], DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda n: bar.advance(task, n)
