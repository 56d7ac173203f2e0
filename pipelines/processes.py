"""Helper processes of the local stack (moto_server, mlflow server): wait for them, stop them.

Each runs in its own session (process group), so stopping one stops its workers too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.local_triton import tail
from registry.errors import StackError


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in {"Z", "X"}


def wait_answering(
    process: subprocess.Popen[bytes],
    answers: Callable[[], bool],
    what: str,
    log_path: Path,
    timeout: float,
    interval: float = 0.1,
) -> bool:
    """Poll ``answers()`` until True; False after ``timeout``; StackError if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(
                f"{what} exited with code {process.returncode}:\n{tail(log_path)}",
                fix=f"read its log: {log_path}",
            )
        if answers():
            return True
        time.sleep(interval)
    return False


def stop_group(pid: int, process: subprocess.Popen[bytes] | None = None, grace: float = 10.0) -> bool:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; True if it was killed."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if (process.poll() is not None) if process is not None else process_gone(pid):
            return False
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    if process is not None:
        process.wait(timeout=5)
    return True
