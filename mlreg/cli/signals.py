"""SIGTERM, SIGHUP (a closed terminal or SSH session) and SIGQUIT raise ``Terminated`` where the
command is, as SIGINT raises ``KeyboardInterrupt``: a promotion puts back what it changed before
the process exits 143, 129 or 131 (``mlreg.cli.failures.report`` picks the code)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from registry.errors import Terminated


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


RAISED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
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
