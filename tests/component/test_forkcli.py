"""The integration tests' fork server (tests/integration/forkcli.py) makes a real process of each
request: its exit status, a signal's negative returncode, the request's environment and cwd, fds
passed from the test.  A server that imports nothing and a probe module run as ``python -m probe``
keep this under a second (the integration suite's server imports MLflow and mlreg, and runs
``python -m mlreg``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import forkcli

PROBE = """
import os, signal, sys, threading, time
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "message":
    sys.exit("refused: a message")
if what == "raise":
    raise RuntimeError("boom")
if what == "where":
    print(os.getcwd(), os.environ.get("PROBE"), os.environ.get("NOT_SENT"), sys.argv[0], sys.path[:2])
    print(os.getsid(0) == os.getpid(), signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    term, pipe = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGPIPE)
    print(term == signal.SIG_DFL, pipe == signal.SIG_IGN)
    sys.stderr.write("to stderr\\n")
if what == "thread":  # a non-daemon thread is joined before the exit, as at interpreter exit
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
if what == "sleep":
    print("sleeping", flush=True)
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("forkcli")
    (folder / "probe.py").write_text(PROBE)
    started = forkcli.ForkServer(preload=())
    path = started.path_for(os.environ)
    assert path is not None
    yield path, folder
    started.stop()


def probe(server: tuple[str, Path], *args: str, **kwargs: object) -> forkcli.ForkedProcess:
    path, folder = server
    env = kwargs.pop(
        "env", {"PATH": os.environ.get("PATH", ""), "PROBE": "from the request", "PYTHONPATH": "lib"}
    )
    argv = [sys.executable, "-m", "probe", *args]
    return forkcli.ForkedProcess(path, argv, env, str(folder), module="probe", **kwargs)  # type: ignore[arg-type]


def test_the_exit_code_and_the_request_s_environment_cwd_and_session(server: tuple[str, Path]) -> None:
    with probe(server, "exit", "3") as process:
        assert process.wait(timeout=30) == 3
        assert process.pid != os.getpid()
    with probe(server, "where", start_new_session=True, interruptible=True) as process:
        out, err = process.communicate(timeout=30)
    folder = str(server[1])
    assert process.returncode == 0, err
    assert out.splitlines() == [
        # NOT_SENT: os.environ replaced; sys.path: the cwd (``-m``), then PYTHONPATH's entries
        f"{folder} from the request None {folder}/probe.py {[folder, f'{folder}/lib']}",
        "True True",  # a session of its own; SIGINT -> KeyboardInterrupt
        "True True",  # SIGTERM default, SIGPIPE ignored, as a fresh interpreter has them
    ]
    assert err == "to stderr\n"


def test_exits_as_the_interpreter_would(server: tuple[str, Path]) -> None:
    with probe(server, "message") as process:
        _, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (1, "refused: a message\n")
    with probe(server, "raise") as process:
        _, err = process.communicate(timeout=30)
    assert process.returncode == 1
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith("RuntimeError: boom\n")
    with probe(server, "thread") as process:
        out, _ = process.communicate(timeout=30)
    assert (process.returncode, out) == (0, "thread done\n")


def test_a_signal_is_a_negative_returncode(server: tuple[str, Path]) -> None:
    for send, expected in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)):
        with probe(server, "sleep", interruptible=True) as process:
            assert process.stdout is not None
            assert process.stdout.readline() == "sleeping\n"
            assert process.poll() is None
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
            process.send_signal(send)  # SIGINT: an uncaught KeyboardInterrupt ends it by SIGINT
            _, err = process.communicate(timeout=30)
        assert process.returncode == expected, err
    process.kill()  # ended and reported: nothing is sent
    assert process.returncode == expected


def test_an_fd_passed_as_stdout(server: tuple[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with target.open("w") as file:
        with probe(server, "where", stdout=file.fileno(), stderr=subprocess.DEVNULL) as process:
            assert process.stdout is None
            assert process.communicate(timeout=30) == (None, None)
    assert process.returncode == 0
    assert target.read_text().startswith(f"{server[1]} from the request None")


def test_an_import_time_variable_of_another_value_is_not_forked() -> None:
    server = {"PATH": "/bin", "PYTHONPATH": "/a"}
    assert forkcli.same_imports({**server, "MLREG_HOME": "/x", "PYTHONFAULTHANDLER": "1"}, server)
    assert not forkcli.same_imports({**server, "PYTHONHASHSEED": "7"}, server)
    assert not forkcli.same_imports({**server, "TYPER_USE_RICH": "0"}, server)
    assert forkcli.same_imports({**server, "PYTHONPATH": f"{forkcli.ROOT}:/a"}, server)  # the checkout
    assert not forkcli.same_imports({**server, "PYTHONPATH": "/b:/a"}, server)
    assert not forkcli.same_imports({"PATH": "/bin"}, server)
