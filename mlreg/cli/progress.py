"""Progress bars: drawn only here, only in a terminal, never with MLREG_NO_PROGRESS=1."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from registry.settings import Settings, env_flag


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
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        *Progress.get_default_columns()[:1], DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda n: bar.advance(task, n)
