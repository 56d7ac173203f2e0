"""One managed-process type for the servers mlreg starts: tritonserver, moto_server, mlflow server.

A ``ManagedProcess`` is an argv, a health check (an HTTP URL answering 200), a log file, a word
of its command line that recognises it later (a reused pid does not count) and a stop policy.
``start`` runs it detached in its own session (process group), so it outlives the command that
started it and stopping the group stops its workers too, and returns once it is healthy;
``stop`` sends SIGTERM, SIGKILLs the group after a grace period; ``save``/``running`` keep its
state file, so a later command finds it.  ``poll_until`` is the one wait loop; process state comes
from ``psutil``, never from parsing ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from pipelines.triton.control_key import HEADER
from registry.errors import StackError

log = logging.getLogger(__name__)
T = TypeVar("T")
KILL_WAIT_S = 5.0


def poll_until(check: Callable[[], T], timeout: float, interval: float = 0.1) -> T:
    """Call ``check`` until it returns something truthy or ``timeout`` seconds passed; its last answer.

    ``check`` may raise to stop early (a process that exited while starting, say).
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer or time.monotonic() >= deadline:
            return answer
        time.sleep(interval)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
    except psutil.Error:
        return True


def process_runs(pid: int, marker: str) -> bool:
    """True while ``pid`` runs and ``marker`` is a word of its command line (not a recycled pid)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}:
                return False
            return any(marker in part for part in process.cmdline())
    except psutil.Error:
        return False


START_SLACK_S = 1.0  # psutil's create_time and time.time() read the same clock; rounding aside


def process_is(pid: int, executable: str, started_by: float | None) -> bool:
    """True while ``pid`` runs the program named ``executable`` (its argv[0]'s exact file name,
    not a word anywhere in its command line: ``tail -f .../tritonserver.log`` is not one) and,
    with ``started_by`` (the time its start was recorded), was created no later than that: a
    recycled pid is created after the recorded process ended, so after ``started_by`` (issue 45
    review, F7)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}:
                return False
            argv = process.cmdline()
            if not argv or Path(argv[0]).name != executable:
                return False
            return started_by is None or process.create_time() <= started_by + START_SLACK_S
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    """True while any process of process group ``pgid`` runs."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def redacted(argv: list[str]) -> list[str]:
    """``argv`` fit for a log: the value of a ``<header>=<key>`` restriction (Triton's control
    key, pipelines/triton/control_key.py) replaced."""
    return [re.sub(rf"({re.escape(HEADER)}=)\S+", r"\1<redacted>", arg) for arg in argv]


@dataclass
class ManagedProcess:
    """A server process mlreg starts, waits for, finds again and stops."""

    name: str  # in messages: "tritonserver", "moto_server", "mlflow server"
    argv: list[str]
    health_url: str  # answers 200 once the server serves
    log_path: Path
    marker: str  # a word of its command line (recognises it by pid later)
    env: Mapping[str, str] | None = None
    start_timeout: float = 60.0
    stop_grace: float = 10.0
    term_group: bool = True  # SIGTERM the whole group (False: the leader only; it stops its children)
    health_interval: float = 0.1
    on_exit: Callable[[str], None] | None = field(default=None, repr=False)  # sees the log tail

    def start(self) -> subprocess.Popen[bytes]:
        """Run the server detached; return once it is healthy (StackError if it exits or times out)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s", " ".join(redacted(self.argv)))
        with self.log_path.open("wb") as log_file:
            process = subprocess.Popen(
                self.argv,
                env=None if self.env is None else dict(self.env),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if poll_until(lambda: self._healthy(process), self.start_timeout, self.health_interval):
            return process
        self.stop(process.pid, process)
        raise StackError(
            f"{self.name} did not answer within {self.start_timeout:.0f}s",
            fix=f"read its log: {self.log_path}",
        )

    def _healthy(self, process: subprocess.Popen[bytes]) -> bool:
        if process.poll() is not None:
            text = tail(self.log_path)
            if self.on_exit is not None:
                self.on_exit(text)
            raise StackError(
                f"{self.name} exited with code {process.returncode} while starting:\n{text}",
                fix=f"read its whole log: {self.log_path}",
            )
        return http_ok(self.health_url, timeout=2.0)

    def stop(self, pid: int, process: subprocess.Popen[bytes] | None = None) -> bool:
        """SIGTERM, then SIGKILL the process group after ``stop_grace`` s; True if it had to be killed."""
        return stop_process(
            pid, process, grace=self.stop_grace, term_group=self.term_group, marker=self.marker
        )

    def save(self, state_file: Path, pid: int, **extra: object) -> dict[str, object]:
        """Record the running server (pid, marker, log, what else later commands need)."""
        state = {"pid": pid, "marker": self.marker, "log_path": str(self.log_path), **extra}
        write_state(state_file, state)
        return state


def write_state(state_file: Path, state: Mapping[str, Any]) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(state), indent=2))
    tmp.replace(state_file)


def running(state_file: Path, marker: str) -> dict[str, Any] | None:
    """The recorded server if its process still runs (and is still that server); a stale record
    is removed."""
    try:
        state = json.loads(state_file.read_text())
        alive = process_runs(int(state["pid"]), str(state.get("marker", marker)))
    except (OSError, ValueError, KeyError, TypeError):
        alive = False
    if not alive:
        state_file.unlink(missing_ok=True)
        return None
    return dict(state)


def _gone(pid: int, process: subprocess.Popen[bytes] | None) -> bool:
    return process.poll() is not None if process is not None else process_gone(pid)


def stop_process(
    pid: int,
    process: subprocess.Popen[bytes] | None = None,
    *,
    grace: float = 10.0,
    term_group: bool = True,
    marker: str | None = None,
) -> bool:
    """SIGTERM ``pid`` (or its group), SIGKILL the group after ``grace`` s; True if it was killed.

    With ``marker``, a pid that no longer runs that server (recycled) is left alone.
    """
    if marker is not None and process is None and not process_runs(pid, marker):
        return False
    killed = False
    try:
        (os.killpg if term_group else os.kill)(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    if not poll_until(lambda: _gone(pid, process), grace, 0.05):
        killed = True
        log.warning("pid %d did not stop within %.0fs; killing its process group", pid, grace)
    if killed or group_alive(pid):  # its workers (python stubs, gunicorn) go with it
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        poll_until(lambda: _gone(pid, process), KILL_WAIT_S, 0.05)
    return killed


@dataclass
class GroupStop:
    """What stopping one server's process group did: whether its leader (the server) ran, the
    other processes of the group that were stopped (``members``: their names, e.g. the python
    stubs a tritonserver started, which ignore SIGTERM and outlive it), whether SIGKILL was needed,
    and the pids still alive after the bound (never expected; named, not waited for)."""

    leader: bool = False
    members: list[str] = field(default_factory=list)
    killed: bool = False
    left: list[int] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return self.leader or bool(self.members)


def group_members(pgid: int, belongs: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """The live processes of process group ``pgid`` (its leader excluded) that ``belongs`` proves
    ours -- a process group outlives its leader, and its id could in principle meet a stranger's."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == pgid or os.getpgid(proc.pid) != pgid:
                continue
            if proc.status() not in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD} and belongs(proc):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def stop_group(
    pid: int,
    belongs: Callable[[psutil.Process], bool],
    process: subprocess.Popen[bytes] | None = None,
    *,
    grace: float = 10.0,
    marker: str | None = None,
    started_at: float | None = None,
) -> GroupStop:
    """Stop the server ``pid`` and every process of its group ``belongs`` proves ours, whether the
    server still runs or died before them: SIGTERM to the server (it stops its workers itself),
    SIGKILL to the group after ``grace`` s, and to each member left, waited for ``KILL_WAIT_S``.
    Without ``process``, the leader is ours only when it runs the ``marker`` program, created by
    ``started_at`` (:func:`process_is`); else it is left alone (its members are still judged by
    ``belongs``)."""
    if process is not None:
        running = process.poll() is None
    else:
        running = marker is None or process_is(pid, marker, started_at)
    members = group_members(pid, belongs)
    result = GroupStop(leader=running, members=[_name(m) for m in members])
    if running:
        result.killed = stop_process(pid, process, grace=grace, term_group=False, marker=None)
    alive = [m for m in members if _runs(m)]
    for member in alive:  # left by a server that died (or survived its group's SIGKILL race)
        result.killed = True
        with contextlib.suppress(psutil.Error, OSError):
            member.kill()
    _, still = psutil.wait_procs(alive, timeout=KILL_WAIT_S) if alive else ([], [])
    result.left = [m.pid for m in still if _runs(m)]
    return result


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"


def _runs(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() not in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
    except psutil.Error:
        return False
