"""The managed-process type on real processes: start, health check, state file, stop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.devstack import processes
from pipelines.devstack.local_triton import free_port
from registry.errors import StackError

# an HTTP server that shrugs off SIGTERM: only the SIGKILL after the grace period stops it
STUBBORN = """
import http.server, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=int(sys.argv[1]), bind="127.0.0.1")
"""


def http_server(tmp_path: Path, port: int, **options: object) -> processes.ManagedProcess:
    return processes.ManagedProcess(
        name="http.server",
        argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        health_url=f"http://127.0.0.1:{port}/",
        log_path=tmp_path / "logs" / "http.log",
        marker="http.server",
        start_timeout=30,
        health_interval=0.02,
        **options,  # type: ignore[arg-type]
    )


def test_a_started_server_answers_is_found_by_its_state_file_and_stops(tmp_path: Path) -> None:
    port = free_port()
    managed = http_server(tmp_path, port)
    process = managed.start()
    try:
        assert processes.http_ok(f"http://127.0.0.1:{port}/")
        state = managed.save(tmp_path / "state.json", process.pid, port=port)
        assert processes.running(tmp_path / "state.json", "http.server") == state
        assert processes.process_runs(process.pid, "http.server")
        assert not processes.process_runs(process.pid, "tritonserver")  # another server's marker
    finally:
        killed = managed.stop(process.pid, process)
    assert killed is False  # SIGTERM was enough
    assert process.returncode is not None
    assert processes.process_gone(process.pid)
    assert processes.running(tmp_path / "state.json", "http.server") is None
    assert not (tmp_path / "state.json").exists()  # the stale record is removed


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    port = free_port()
    managed = processes.ManagedProcess(
        name="stubborn",
        argv=[sys.executable, "-c", STUBBORN, str(port)],
        health_url=f"http://127.0.0.1:{port}/",
        log_path=tmp_path / "stubborn.log",
        marker="SIG_IGN",
        start_timeout=30,
        health_interval=0.02,
        stop_grace=0.2,
    )
    process = managed.start()
    # stopped from "another command": no Popen, found by pid and marker only
    assert processes.stop_process(process.pid, grace=0.2, marker="SIG_IGN") is True
    process.wait(timeout=5)
    assert process.returncode == -9


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    managed = processes.ManagedProcess(
        name="broken server",
        argv=[sys.executable, "-c", "import sys; print('cannot bind: no such port'); sys.exit(3)"],
        health_url=f"http://127.0.0.1:{free_port()}/",
        log_path=tmp_path / "broken.log",
        marker="cannot bind",
    )
    with pytest.raises(StackError, match=r"broken server exited with code 3 while starting:\ncannot bind"):
        managed.start()


def test_stop_leaves_a_recycled_pid_alone(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert processes.stop_process(other.pid, grace=0.1, marker="moto_server") is False
        assert other.poll() is None  # not the server the state file named: not signalled
    finally:
        other.kill()
        other.wait()


def test_poll_until_returns_the_first_truthy_answer_or_the_last_one() -> None:
    answers = iter([0, "", "ready", "later"])
    assert processes.poll_until(lambda: next(answers), timeout=10, interval=0) == "ready"
    assert processes.poll_until(lambda: None, timeout=0, interval=0) is None
