"""A second reviewer's mutant of ``mlreg stack down`` (issue 46, tests/mutants/reviewer2.toml,
``rv2-stack-down-group-members-only``): a python stub is the server's only when it is in the
server's process group *and* its shared-memory region carries the server's prefix.  Every test of
tests/component/test_stack_down.py puts the stranger in the group under another prefix; none puts one
under the server's own prefix outside its group, so the group half of the proof could go unseen.

Real processes, as in test_stack_down.py: a "tritonserver" (a Python interpreter reached through a
link of that name) started in its own session with one stub in its group, and a stub of the same
prefix started in a session of its own.  What this test kills at the end it finds itself (the
leader's children and its own Popen), never through the code under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pipelines.devstack import local_triton
from pipelines.devstack.local_triton import STUB_NAME

STUB = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a stub busy in a warmup: only SIGKILL stops it
open(sys.argv[2], "w").close()
time.sleep(60)
"""
# "tritonserver": its stub is started by a keeper in its group that waits on it, so the stub
# SIGKILLed after the server died is reaped at once (reparented to a slow init, its zombie would
# hold stop_server's wait for a second or more)
LEADER = """
import subprocess, sys, time
python, stub, script, prefix, ready = sys.argv[1:6]
keeper = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"
subprocess.Popen([python, "-c", keeper, stub, script, f"{prefix}uuid0", f"{ready}.0"])
time.sleep(60)
"""


class Started:
    """The server, its stub and the outsider; ``kill`` ends each of them, found without mlreg."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = f"mlreg_{os.getpid()}_{int(time.time() * 1000) % 100000}_"
        stub = tmp_path / STUB_NAME
        stub.symlink_to(sys.executable)
        (tmp_path / "stub.py").write_text(STUB)
        (tmp_path / "leader.py").write_text(LEADER)
        server = tmp_path / "tritonserver"
        server.symlink_to(sys.executable)
        ready = tmp_path / "ready"
        self.started_at = time.time()
        self.leader = subprocess.Popen(
            [
                str(server),
                str(tmp_path / "leader.py"),
                sys.executable,
                str(stub),
                str(tmp_path / "stub.py"),
                self.prefix,
                str(ready),
            ],
            start_new_session=True,
        )
        self.outsider = subprocess.Popen(  # the server's own prefix, but another session's group
            [str(stub), str(tmp_path / "stub.py"), f"{self.prefix}uuid9", f"{ready}.9"],
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready.{i}").exists() for i in ("0", "9")):
            assert time.monotonic() < deadline, "the stand-in stubs did not start"
            time.sleep(0.02)
        self.stubs = psutil.Process(self.leader.pid).children(recursive=True)

    def kill(self) -> None:
        for proc in [*self.stubs, self.leader, self.outsider]:
            try:
                proc.kill()
            except (psutil.Error, ProcessLookupError):
                pass
        for popen in (self.leader, self.outsider):
            popen.wait(10)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    made = Started(tmp_path)
    try:
        yield made
    finally:
        made.kill()


def _runs(proc: psutil.Process | subprocess.Popen[bytes]) -> bool:
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is None
    try:
        return proc.status() not in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
    except psutil.Error:
        return False


def test_a_stub_of_the_servers_prefix_outside_its_group_is_never_signalled(started: Started) -> None:
    [stub] = [p for p in started.stubs if p.cmdline()[2:3] == [f"{started.prefix}uuid0"]]
    os.kill(started.leader.pid, signal.SIGKILL)  # the server gone, its stub not
    started.leader.wait(10)
    stop = local_triton.stop_server(
        started.leader.pid, started.prefix, grace=0.5, started_at=started.started_at
    )
    assert len(stop.members) == 1  # only the stub in its group (its keeper is no stub)
    assert not _runs(stub)
    time.sleep(0.1)
    assert _runs(started.outsider)  # same prefix, another group: not proven ours, never signalled
