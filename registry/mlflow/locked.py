"""The embedded registry's database held by another process, recognised in one place.

sqlite answers "database is locked" once its busy wait ran out: another connection holds a write
(or ``BEGIN EXCLUSIVE``) transaction on ``mlflow.db`` -- a second mlreg, an ``mlflow ui``, a
``sqlite3`` shell left in a transaction.  mlreg waits for it a bounded time (``lock_wait``), then
says which file, who holds it when that can be told cheaply (the process with a write lock on it,
else the processes that have it open), and what to do: wait for it or stop it.
"""

from __future__ import annotations

import os
from pathlib import Path

from registry.disk import chain
from registry.errors import RegistryError
from registry.settings import Settings

DATABASE_LOCKED = "DATABASE_LOCKED"  # the error's code
LOCK_WAIT = 5.0  # seconds, at most: MLREG_MLFLOW_TIMEOUT shortens it
LOCKED_TEXTS = ("database is locked", "database table is locked")
SHOWN_HOLDERS = 3
SHOWN_COMMAND = 80  # characters of a holder's command line
PROC_LOCKS = "/proc/locks"


def lock_wait(settings: Settings) -> float:
    """How long one read or write waits for a locked embedded database: a few seconds (a
    concurrent mlreg's write takes milliseconds), shorter when MLREG_MLFLOW_TIMEOUT is."""
    return max(0.0, min(settings.mlflow_timeout, LOCK_WAIT))


def is_locked(exc: BaseException) -> bool:
    """sqlite's busy error anywhere in the chain, however MLflow or SQLAlchemy wrapped it."""
    return any(text in str(link).lower() for link in chain(exc) for text in LOCKED_TEXTS)


def holders(db: Path) -> str:
    """Who holds ``db``: the processes with a write lock on it (sqlite locks with ``fcntl``; Linux
    lists them in /proc/locks), else those that have it open (psutil, as far as it may look) --
    this process aside; "" when none is found."""
    mine = os.getpid()
    if locking := [pid for pid in _lock_pids(db) if pid != mine]:
        return f"held by {_listed(locking)}"
    if opened := [pid for pid in _open_pids(db) if pid != mine]:
        return f"open in {_listed(opened)}"
    return ""


def _listed(pids: list[int]) -> str:
    """'pid 12 (sqlite3 mlflow.db)', the first few."""
    return ", ".join(_described(pid) for pid in pids[:SHOWN_HOLDERS])


def _lock_pids(db: Path) -> list[int]:
    try:
        stat = db.stat()
        lines = Path(PROC_LOCKS).read_text().splitlines()
    except OSError:
        return []
    where = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    # "1: POSIX  ADVISORY  WRITE 1254 fe:00:2162739 1073741824 1073742335" (a waiter's has "->")
    found = {
        int(fields[4])
        for fields in (line.split() for line in lines)
        if len(fields) >= 6 and fields[3] == "WRITE" and fields[5] == where and fields[4].isdigit()
    }
    return sorted(found)


def _open_pids(db: Path) -> list[int]:
    import psutil  # lazy: psutil ~40 ms, only when a failure looks for the lock holder

    found = []
    for process in psutil.process_iter():
        try:
            if any(Path(f.path) == db for f in process.open_files()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def _described(pid: int) -> str:
    import psutil  # lazy: psutil ~40 ms, only when a failure looks for the lock holder

    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return f"pid {pid}"
    command = " ".join(" ".join([Path(argv[0]).name, *argv[1:]]).split()) if argv else ""
    shown = command if len(command) <= SHOWN_COMMAND else command[: SHOWN_COMMAND - 3] + "..."
    return f"pid {pid} ({shown})" if shown else f"pid {pid}"


def locked_error(db: Path, what: str, waited: float | None) -> RegistryError:
    """``what`` found ``db`` locked (after ``waited`` seconds; None: as long as MLflow waits; 0:
    at once, since an earlier call waited)."""
    held = holders(db)
    by = f" ({held})" if held else ""
    after = f" after {waited:g} s" if waited else ""
    return RegistryError(
        f"the embedded MLflow registry {db} is locked by another process{by}: {what} failed{after}",
        fix="wait until that process ends its transaction, or stop it; then run the command again",
        path=str(db),
        code=DATABASE_LOCKED,
    )
