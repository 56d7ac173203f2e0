"""Warm-ups: an import started in a thread while the command does other work, settled before exit.

A promotion imports MLflow and opens its client (``registry.mlflow.connection``), and the quality
gate imports great_expectations (``pipelines.checks.golden``), in daemon threads while it plans.
A command can end before they do -- a promotion refused by another's lock, say.  Python then runs
its exit handlers while daemon threads still run, and ``weakref.finalize``'s handler iterates its
registry as a warm-up adds to it (SQLAlchemy's engine, MLflow's store): "Exception ignored in
atexit callback ... RuntimeError: dictionary changed size during iteration" on the user's
terminal (seen in the suite, a refused promotion's stderr).  ``settle`` at the end of the command
waits for them, bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SETTLE_S = 15.0  # MLflow's import and client, great_expectations' import: 2-5 s each here

_started: list[threading.Thread] = []
_lock = threading.Lock()


def start(target: Callable[[], object], name: str) -> threading.Thread:
    """``target`` in a daemon thread named ``name``, which ``settle`` waits for."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _started[:] = [t for t in _started if t.is_alive()]
        _started.append(thread)
    thread.start()
    return thread


def settle(timeout: float = SETTLE_S) -> list[str]:
    """Wait for every warm-up still running, ``timeout`` seconds in all; the names of those that
    did not end within it."""
    deadline = time.monotonic() + timeout
    with _lock:
        running = [t for t in _started if t.is_alive()]
    for thread in running:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in running if t.is_alive()]
