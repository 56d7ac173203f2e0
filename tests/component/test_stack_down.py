"""Issue 45 item 2: ``mlreg stack down`` stops every process of a replica's group and says so.

Real processes, a stand-in for tritonserver's: a leader started in its own session (as
``ManagedProcess`` starts tritonserver) whose command line carries the word ``tritonserver``, and
two "python stubs" -- a Python interpreter reached through a link named
``triton_python_backend_stub``, its third argument a shared-memory region under the server's
prefix, as the real stub's is (seen on 2.51: ``<stub> <model.py> <prefix><uuid> ...``) -- that
ignore SIGTERM, as the real stubs of a hung warmup did.  A real tritonserver is not started here:
what is checked is which processes get which signal, which needs no Triton (the real server's
stop is covered by tests/integration/test_stack_cli.py).
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

from mlreg.cli.main import app
from pipelines.devstack import local_triton, processes
from pipelines.devstack.local_triton import STUB_NAME, ServerInfo, save_info
from tests.cli import CliRunner

STUB = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a stub busy in a warmup: only SIGKILL stops it
open(sys.argv[2], "w").close()
time.sleep(120)
"""
# "tritonserver": exits on SIGTERM (it would stop its stubs; these ignore it), starts the stubs
LEADER = """
import subprocess, sys, time
stub, script, prefix, ready, stranger = sys.argv[1:6]
for index in range(2):
    subprocess.Popen([stub, script, f"{prefix}uuid{index}", f"{ready}.{index}"])
subprocess.Popen([stub, script, "mlreg_someone_else_1", f"{ready}.x"])  # not ours: another prefix
time.sleep(120)
"""


class Group:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.prefix = f"mlreg_{os.getpid()}_{int(time.time() * 1000) % 100000}_"
        self.stub = tmp_path / STUB_NAME
        self.stub.symlink_to(sys.executable)
        (tmp_path / "stub.py").write_text(STUB)
        (tmp_path / "leader.py").write_text(LEADER)
        server = tmp_path / "tritonserver"  # argv[0]'s file name is what mlreg recognises the server by
        server.symlink_to(sys.executable)
        argv = [str(server), str(tmp_path / "leader.py"), str(self.stub), str(tmp_path / "stub.py")]
        argv += [self.prefix, str(tmp_path / "ready"), "tritonserver"]
        self.leader = subprocess.Popen(argv, start_new_session=True)
        self.started_at = time.time()  # recorded after the start, as _launch records it
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready.{i}").exists() for i in ("0", "1", "x")):
            assert time.monotonic() < deadline, "the stand-in stubs did not start"
            time.sleep(0.05)
        # found without the code under test: the teardown kills these (a mutant of group_members
        # with a filter that always agrees must not make it kill every process of the machine)
        self.members = psutil.Process(self.leader.pid).children(recursive=True)

    def info(self) -> ServerInfo:
        return ServerInfo(
            self.leader.pid, 1, 2, 3, "repo", str(self.root / "log"), self.prefix, self.started_at
        )

    def alive(self) -> dict[str, bool]:
        return {m.cmdline()[2] if m.is_running() else str(m.pid): _runs(m) for m in self.members}


def _runs(proc: psutil.Process) -> bool:
    try:
        return proc.status() not in {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
    except psutil.Error:
        return False


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    made = Group(tmp_path)
    yield made
    for member in made.members:  # only what this test started
        if _runs(member):
            member.kill()
    if made.leader.poll() is None:
        made.leader.kill()
    made.leader.wait(10)


def test_stack_down_stops_the_server_and_its_stubs_that_ignore_sigterm(group: Group, tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_info(group.info(), home / "stack" / "triton.json")
    result = CliRunner().invoke(app, ["stack", "down"], env={"MLREG_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert f"stopped replica-0: tritonserver (pid {group.leader.pid}) and 2 python stubs" in result.output
    assert group.leader.poll() is not None
    # the whole group went (the server was alive: its group is ours, the stranger's stub included)
    assert not any(_runs(m) for m in group.members)
    assert not (home / "stack" / "triton.json").exists()


def test_stubs_outliving_a_killed_server_are_stopped_and_a_strangers_are_left(
    group: Group, tmp_path: Path
) -> None:
    os.kill(group.leader.pid, signal.SIGKILL)  # the server gone, its stubs not (the case)
    group.leader.wait(10)
    ours = [m for m in group.members if m.cmdline()[2].startswith(group.prefix)]
    [stranger] = [m for m in group.members if m not in ours]
    home = tmp_path / "home"
    save_info(group.info(), home / "stack" / "replica-1" / "triton.json")
    [stopped] = local_triton_stop(home)
    assert stopped.describe() == (
        f"stopped replica-1: 2 python stubs left by tritonserver (pid {group.leader.pid}), which had "
        "already exited (SIGKILL was needed)"
    )
    assert stopped.to_dict()["python_stubs"] == 2
    assert not any(_runs(m) for m in ours)
    assert _runs(stranger)  # not proven ours (another server's prefix): never signalled


def local_triton_stop(home: Path) -> list:  # type: ignore[type-arg]
    from pipelines.devstack.stack import stop_stack
    from registry.settings import Settings

    return stop_stack(Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]}))


def test_a_stub_is_ours_only_by_its_name_and_the_servers_own_region_prefix() -> None:
    prefix = "mlreg_1_2_"
    assert local_triton.is_stub_of([f"/b/python/{STUB_NAME}", "/r/m/1/model.py", f"{prefix}u", "1"], prefix)
    assert not local_triton.is_stub_of([f"/b/python/{STUB_NAME}", "/r/m/1/model.py", "mlreg_1_3_u"], prefix)
    assert not local_triton.is_stub_of(["/usr/bin/python3", "x.py", f"{prefix}u"], prefix)
    assert not local_triton.is_stub_of([f"/b/{STUB_NAME}", "x.py", f"{prefix}u"], "")


# -- issue 45 review, F7: the leader is ours by its program's exact name and its start time --------


def _stranger(argv: list[str]) -> subprocess.Popen[bytes]:
    """A process of someone else's, in its own session (a group leader, as a recycled pid may be)."""
    return subprocess.Popen(argv, start_new_session=True)


@pytest.mark.parametrize("kind", ["tail-of-a-log-named-tritonserver", "a-tritonserver-started-after-ours"])
def test_a_recycled_pid_is_never_signalled(tmp_path: Path, kind: str) -> None:
    """The recorded pid now belongs to a stranger: before, any process whose command line held the
    word 'tritonserver' (``tail -f .../tritonserver.log``) was SIGTERMed, and its whole group
    SIGKILLed.  Now the leader must run the program named tritonserver (argv[0]'s file name) and
    have been created by the recorded start; otherwise it is left alone."""
    log_file = tmp_path / "tritonserver.log"
    log_file.write_text("")
    recorded = time.time()
    if kind.startswith("tail"):
        stranger = _stranger(["tail", "-f", str(log_file)])
    else:  # a real tritonserver's name, created after the recorded start: the pid was recycled
        time.sleep(START_LAG)
        server = tmp_path / "tritonserver"
        server.symlink_to(sys.executable)
        stranger = _stranger([str(server), "-c", "import time; time.sleep(120)"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(stranger.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop = local_triton.stop_server(stranger.pid, "mlreg_1_8000_", grace=0.5, started_at=recorded)
        assert (stop.leader, stop.members, stop.killed) == (False, [], False)
        time.sleep(0.2)
        assert stranger.poll() is None  # alive: never signalled
    finally:
        stranger.kill()
        stranger.wait(10)


START_LAG = processes.START_SLACK_S + 0.3


def test_the_server_itself_is_recognised_by_name_and_start(group: Group) -> None:
    """The positive control: the recorded leader (argv[0] named tritonserver, created before its
    recorded start) is ours; recorded as started long before it ran, it is not."""
    assert processes.process_is(group.leader.pid, "tritonserver", group.started_at)
    assert not processes.process_is(group.leader.pid, "tritonserver", group.started_at - 3600)
    assert not processes.process_is(group.leader.pid, "triton", group.started_at)  # exact, not a part
