"""What runs after the ``record`` stage: best effort, bounded, and never a false failure.

Once ``record`` has moved the alias the promotion *has happened*: a CI retry or a rollback acting
on a non-zero exit would act on a false failure.  So every later step (``retain``: the versions
beyond the window archived, under ``RETAIN_S``; then capture armed again, the captured files pruned)
runs here:

- in a worker thread, under one deadline (``AFTER_RECORD_S``): a replica or an S3 prefix that
  freezes costs at most that long, then the step is left behind (a daemon thread: it never holds
  the process) and named -- "capture arming did not finish within 30 s (at R)";
- with SIGINT, SIGTERM, SIGHUP and SIGQUIT *noted* instead of raised while it runs (main thread
  only): a signal ends the wait at once and the promotion returns its real outcome, exit 0, with
  the note "promoted; capture arming interrupted on R".

Nothing here changes what serves: a step left behind only leaves capture off on a replica (the
next replay has less to read), files unpruned (the next promotion prunes them) or a version not yet
archived (a move cut short is finished by the next promotion or ``mlreg store gc``: retention.py).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

AFTER_RECORD_S = 30.0  # capture arming and pruning together
RETAIN_S = 300.0  # retention after record: it copies versions to the archive (an S3 copy of GBs)
POLL_S = 0.05  # how often the waiting main thread looks at the worker and the signals
NOTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Progress:
    """Where the after-record step is: the replica or location it is reaching now."""

    def __init__(self) -> None:
        self.at = ""

    def __call__(self, where: str) -> None:
        self.at = where


def best_effort(
    what: str, step: Callable[[Progress], list[str]], deadline_s: float = AFTER_RECORD_S
) -> list[str]:
    """``step``'s notes; or, when it failed, outlived ``deadline_s`` or a signal came, one note
    saying so (and where it was).  Never raises for the step's sake."""
    return bounded(what, step, deadline_s)[0]


def bounded(
    what: str, step: Callable[[Progress], list[str]], deadline_s: float = AFTER_RECORD_S
) -> tuple[list[str], str]:
    """``best_effort``'s notes, and the name of the signal that ended the wait ("" when none came):
    the caller skips what is left after a signal."""
    progress = Progress()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["notes"] = step(progress)
        except Exception as exc:  # best effort: named, never a failure of what was promoted
            outcome["error"] = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"

    worker = threading.Thread(target=work, name=f"after-record {what}", daemon=True)
    with _SignalsNoted() as signals:
        worker.start()
        ends = time.monotonic() + deadline_s
        while worker.is_alive() and not signals and time.monotonic() < ends:
            worker.join(POLL_S)
    where = f" on {progress.at}" if progress.at else ""
    if signals:
        return [f"promoted; {what} interrupted{where} ({signals[0]})"], signals[0]
    if worker.is_alive():
        return [f"promoted; {what} did not finish within {deadline_s:g} s{where}: left behind"], ""
    if "error" in outcome:
        return [f"promoted; {what} failed{where}: {outcome['error']}"], ""
    notes = outcome.get("notes")
    return (list(notes) if isinstance(notes, list) else []), ""


class _SignalsNoted:
    """SIGINT/SIGTERM/SIGHUP/SIGQUIT recorded (their names, in order) instead of raised, in the main
    thread; elsewhere (a thread can install no handler) nothing changes."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.previous: dict[int, object] = {}

    def __enter__(self) -> list[str]:
        if threading.current_thread() is threading.main_thread():
            for sig in NOTED:
                self.previous[sig] = signal.signal(sig, self._note)
        return self.seen

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.seen.append(signal.Signals(signum).name)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned
