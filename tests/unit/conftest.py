"""Unit fixtures: in this process, seconds for the whole tier, no TensorFlow, no MLflow import.

The suite's fast tiers (README.md, "The test suite"):

- tests/unit (this folder): a test runs in the pytest process and starts no other (``_no_process``
  fails one that does); the whole folder runs in under 10 s (``make unit``, benchmarks/suite.py).
- tests/component: tests that start local processes (the CLI, the registries MLflow makes, the checks
  of ``BACKGROUND``, real signals) or wait for seconds (deadlines, retries, the code base's own parse).
  Its conftest.py re-uses this one's fixtures and adds those processes.

A unit test that needs a model repository gets ``standin_repository`` (tests/conftest.py): the
template built by the real ``registry.template.build`` (``--device cpu``) with each exporter
replaced by a stand-in that writes the config's tensors (tests/unit/standins.py).  Tests that need
real exported bytes live in tests/integration, where ``built_repository`` is.  A test of either
fast tier that imports TensorFlow fails, and so does one that imports MLflow.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_TIERS

NOT_IN_UNIT_TESTS = ("tensorflow", "keras", "tf2onnx")
MOVE_IT = "a test that needs a real export belongs in tests/integration (built_repository)"
NOT_MLFLOW = (
    "MLflow's import alone takes 1.5 s: a fast test reads the embedded registry through "
    "registry.mlflow.sqlite, from registry_home or registry_state (tests/component, made by MLflow "
    "beside the run); a test that writes through MLflow belongs in tests/integration"
)
NO_PROCESS = (
    "a unit test runs in the pytest process and starts none: one that starts a process belongs in "
    "tests/component (tests/unit/conftest.py)"
)
# What starts a process from Python: subprocess (its _execute_child), the fork_exec under it and
# under multiprocessing's spawn and forkserver contexts, os.fork (multiprocessing's fork context,
# os.spawn*, pty.fork), os.forkpty, os.posix_spawn*, os.system, and the os.exec* that would replace
# the pytest process itself.  Each is replaced for the test by a refusal that records it.  The
# session's servers (tests/conftest.py) are refused as fixtures: they are set up before any test's
# own fixtures, so the refusals could not see them start.
PROCESS_STARTS: tuple[tuple[Any, str, str], ...] = (
    (subprocess.Popen, "_execute_child", "subprocess.Popen._execute_child"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
    (os, "execv", "os.execv"),
    (os, "execve", "os.execve"),
)
SERVERS = (
    "a unit test starts no server: a test with the session's {} belongs in tests/component or "
    "tests/integration"
)


def _loaded() -> set[str]:
    return {name for name in NOT_IN_UNIT_TESTS if name in sys.modules}


@pytest.fixture(autouse=True, scope="session")
def _collected_without_tensorflow(request: pytest.FixtureRequest) -> None:
    """A run of the fast tiers only imported no TensorFlow while collecting (a module-level import)."""
    paths = [Path(item.path).resolve() for item in request.session.items]
    if all(any(tier in path.parents for tier in FAST_TIERS) for path in paths):
        assert not _loaded(), f"collecting the fast tests imported {sorted(_loaded())}: {MOVE_IT}"


@pytest.fixture(autouse=True)
def _no_tensorflow() -> Iterator[None]:
    """Each fast test leaves TensorFlow and MLflow unimported (checked where they were not loaded
    before it)."""
    before = _loaded()
    mlflow_before = "mlflow" in sys.modules
    yield
    if _loaded() - before:
        pytest.fail(f"this test imported {sorted(_loaded() - before)}: {MOVE_IT}", pytrace=False)
    if "mlflow" in sys.modules and not mlflow_before:
        pytest.fail(f"this test imported mlflow: {NOT_MLFLOW}", pytrace=False)


class ProcessRefused(OSError):
    """What a unit test's attempt to start a process raises (an OSError, as a failed start is)."""


def refusing_processes(patch: pytest.MonkeyPatch) -> list[str]:
    """Replace each of PROCESS_STARTS with a refusal (ProcessRefused, nothing started) for as long
    as ``patch`` holds; the list returned names each start refused, in order."""
    refused: list[str] = []

    def refusal(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            refused.append(name)
            raise ProcessRefused(f"{name}: {NO_PROCESS}")

        return refuse

    for owner, attribute, name in PROCESS_STARTS:
        if hasattr(owner, attribute):
            patch.setattr(owner, attribute, refusal(name))
    return refused


@contextlib.contextmanager
def no_process() -> Iterator[list[str]]:
    """Inside: every process start refused (``refusing_processes``); on leaving, a failure naming
    each start refused, even where the code under test caught the error."""
    with pytest.MonkeyPatch.context() as patch:
        refused = refusing_processes(patch)
        yield refused
    if refused:
        pytest.fail(f"this test tried to start a process ({', '.join(refused)}): {NO_PROCESS}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_process() -> Iterator[None]:
    """A unit test starts no process (``no_process``)."""
    with no_process():
        yield


@pytest.fixture(scope="session")
def built_repository() -> Path:
    """Fast tests export nothing: the session's TensorFlow build is for tests/integration."""
    pytest.fail(f"fast tests use standin_repository, not built_repository: {MOVE_IT}", pytrace=False)


@pytest.fixture(scope="session")
def s3_server() -> None:
    """Refused in a unit test (``SERVERS``)."""
    pytest.fail(SERVERS.format("moto_server (s3_server)"), pytrace=False)


@pytest.fixture(scope="session")
def mlflow_server() -> None:
    """Refused in a unit test (``SERVERS``)."""
    pytest.fail(SERVERS.format("`mlflow server` (mlflow_server)"), pytrace=False)


@pytest.fixture(scope="session")
def template_build() -> None:
    """Refused in a unit test: the session's export (TensorFlow) is for tests/integration."""
    pytest.fail(f"a unit test exports nothing (template_build): {MOVE_IT}", pytrace=False)
