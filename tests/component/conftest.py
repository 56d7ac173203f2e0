"""Component fixtures: the fast tests that start local processes or wait for seconds.

A test here runs in the pytest process with real local processes beside it: the CLI forked from a
server that imported MLflow (``mlreg_cli``), the registries MLflow itself made for this run
(``registry_state``, ``registry_home``), a module's checks in fresh interpreters (``BACKGROUND``,
``background``), real signals and deadlines.  Each process is started as soon as the tests that
need it are collected, and those tests run last, so the processes run beside the others.  The
unit tier's rules hold here too (tests/unit/conftest.py: no TensorFlow, no MLflow imported in this
process; ``standin_repository``, tests/conftest.py, for a model repository); only starting processes
is allowed.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import ROOT
from tests.unit.conftest import (  # noqa: F401 -- the unit tier's fixtures, for this folder too
    _collected_without_tensorflow,
    _no_tensorflow,
    built_repository,
)

# MLflow creates its database through its migrations (2-4 s) and its import alone takes 1.5 s: the
# registries the unit tests read are made once a run, by MLflow itself, in a process started as soon
# as the tests are collected; the tests that need them run last, so it runs beside the others
CREATE_REGISTRIES = """
import shutil, sys
from pathlib import Path
from registry.mlflow import MlflowRegistry
from registry.settings import Settings

root = Path(sys.argv[1])
registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(root / "work")}))
def keep(state):
    (root / state).mkdir()
    shutil.copy2(root / "work" / "mlflow.db", root / state / "mlflow.db")
registry.connection.client.search_registered_models()
keep("empty")
registry.connection.client.create_registered_model("a")
registry.connection.client.create_model_version("a", source=str(root / "work"))
keep("a_v1")
registry.models.set_alias("a", "production", "1")
keep("a_v1_production")
"""
REGISTRY_STATES = ("empty", "a_v1", "a_v1_production")
REGISTRY_FIXTURES = {"registry_home", "registry_state"}

# The CLI with MLflow imported, for the few unit tests whose command writes through MLflow (register):
# one interpreter, started as soon as the tests are collected, imports MLflow and the CLI beside the
# run (~1.5-3 s, no test waits on it); each ``mlreg_cli`` call is a child forked from it -- a fresh
# process with the imports done, nothing run before it -- whose MLREG_HOME, cwd and output are its own.
CLI_SERVER = """
import json, os, sys, time
import mlflow, mlflow.tracking  # noqa: F401 -- paid once, before any request
from mlflow.store.model_registry import sqlalchemy_store  # noqa: F401
from mlflow.store.tracking import sqlalchemy_store as tracking_store  # noqa: F401
from typer.testing import CliRunner
from mlreg.cli.main import app
import registry.mlflow  # noqa: F401
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.update(request["set"])
        for name in request["unset"]:
            os.environ.pop(name, None)
        os.chdir(request["cwd"])
        try:
            runs = [CliRunner().invoke(app, argv) for argv in request["argvs"]]
            found = [{"exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr} for r in runs]
            with open(request["out"], "w") as out:
                json.dump(found, out)
        except BaseException:
            import traceback
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    deadline, status = time.monotonic() + 300, None
    while status is None and time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        status = code if done else time.sleep(0.005)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print(json.dumps("timeout" if status is None else status), flush=True)
"""
CLI_FIXTURE = "mlreg_cli"
CliRuns = Callable[..., list[dict[str, Any]]]  # the ``mlreg_cli`` fixture


class Background(NamedTuple):
    """A check's subprocess, known before any test runs: a module's ``BACKGROUND`` maps a name to
    one.  ``cwd`` None is the checkout; ``SCRATCH``, a new empty folder outside it."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None


SCRATCH = "scratch"
Finished = Callable[[str], subprocess.CompletedProcess[str]]  # the ``background`` fixture
BACKGROUND = pytest.StashKey[dict[str, subprocess.Popen[str]]]()
BACKGROUND_ROOT = pytest.StashKey[Path]()
CLI_READY = pytest.StashKey[bool]()
DEFERRED = pytest.StashKey[dict[str, list[pytest.Item]]]()  # an xdist worker's modules not started


def _needs_registry(item: pytest.Item) -> bool:
    return bool(REGISTRY_FIXTURES & set(getattr(item, "fixturenames", ())))


def _runs_last(item: pytest.Item) -> bool:
    """Waits on a process started at collection (a registry, a background check, the CLI with
    MLflow imported): run it last."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return _needs_registry(item) or bool({"background", CLI_FIXTURE} & fixtures)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = [i for i in items if not _runs_last(i)] + [i for i in items if _runs_last(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start, beside the run, what the selected tests will wait on (see CREATE_REGISTRIES and
    ``background``).  A pytest-xdist worker collects every test but runs only the modules it is
    handed: it starts a module's needs when that module's first test is set up (each started once
    per worker), so two workers never both pay what only one of them runs."""
    if session.config.option.collectonly:  # nothing runs: nothing to start
        return
    root = Path(tempfile.mkdtemp(prefix="mlreg-unit-background-"))
    session.config.stash[BACKGROUND_ROOT] = root
    session.config.stash[BACKGROUND] = {}
    if hasattr(session.config, "workerinput"):
        by_module: dict[str, list[pytest.Item]] = {}
        for item in session.items:
            by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        session.config.stash[DEFERRED] = by_module
        return
    _start_needs(session.config, session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a pytest-xdist worker: the needs of ``item``'s module, started with its first test."""
    deferred = item.config.stash.get(DEFERRED, None)
    if deferred is not None:
        _start_needs(item.config, deferred.pop(item.nodeid.split("::", 1)[0], []))


def _start_needs(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start what ``items`` will wait on that is not started yet: the registries, the CLI server,
    their modules' BACKGROUND commands."""
    root, started = config.stash[BACKGROUND_ROOT], config.stash[BACKGROUND]
    if "registries" not in started and any(_needs_registry(item) for item in items):
        started["registries"] = _start([sys.executable, "-c", CREATE_REGISTRIES, str(root / "registries")])
    if CLI_FIXTURE not in started and any(CLI_FIXTURE in getattr(item, "fixturenames", ()) for item in items):
        started[CLI_FIXTURE] = subprocess.Popen(
            [sys.executable, "-c", CLI_SERVER],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    modules = {item.module for item in items if isinstance(item, pytest.Function)}
    for module in sorted(modules, key=lambda m: m.__name__):
        for name, command in getattr(module, "BACKGROUND", {}).items():
            if f"{module.__name__}:{name}" in started:
                continue
            cwd = ROOT if command.cwd is None else Path(tempfile.mkdtemp(dir=root, prefix=f"{name}-"))
            env = {**os.environ, **command.env} if command.env else None
            started[f"{module.__name__}:{name}"] = _start(command.argv, cwd, env)


def _start(argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    for process in config.stash.get(BACKGROUND, {}).values():
        if process.returncode is None:
            process.kill()
            process.communicate(timeout=30)
    if BACKGROUND_ROOT in config.stash:
        shutil.rmtree(config.stash[BACKGROUND_ROOT], ignore_errors=True)


_FINISHED: dict[str, subprocess.CompletedProcess[str]] = {}


def _finished(config: pytest.Config, key: str) -> subprocess.CompletedProcess[str]:
    if key not in _FINISHED:
        process = config.stash[BACKGROUND][key]
        out, err = process.communicate(timeout=300)
        _FINISHED[key] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return _FINISHED[key]


@pytest.fixture
def background(request: pytest.FixtureRequest) -> Finished:
    """``name`` -> the finished subprocess ``BACKGROUND[name]`` of the test's module: started when the
    tests were collected, it ran beside the others (a fresh interpreter costs 0.1-0.3 s)."""
    module = request.module.__name__
    return lambda name: _finished(request.config, f"{module}:{name}")


@pytest.fixture(scope="session")
def _registries(request: pytest.FixtureRequest) -> Path:
    """The embedded registries MLflow made for this run (see above): one folder a state."""
    made = _finished(request.config, "registries")
    assert made.returncode == 0, f"creating the unit tests' MLflow registries failed:\n{made.stderr}"
    return request.config.stash[BACKGROUND_ROOT] / "registries"


@pytest.fixture
def registry_state(_registries: Path, tmp_path: Path) -> Callable[[str], Path]:
    """``state`` -> a fresh MLREG_HOME (``tmp_path/state``) holding a copy of that registry: ``empty``;
    ``a_v1`` (model ``a``, version 1); ``a_v1_production`` (its alias ``production`` on version 1)."""

    def home(state: str) -> Path:
        assert state in REGISTRY_STATES, f"no registry state {state!r}: one of {REGISTRY_STATES}"
        folder = tmp_path / state
        folder.mkdir(exist_ok=True)
        shutil.copy2(_registries / state / "mlflow.db", folder / "mlflow.db")
        return folder

    return home


@pytest.fixture
def registry_home(registry_state: Callable[[str], Path], tmp_path: Path) -> Path:
    """``tmp_path/home``: an MLREG_HOME whose embedded registry exists and is empty (a copy of the
    run's, so no test pays MLflow's import and migrations)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    shutil.copy2(registry_state("empty") / "mlflow.db", home / "mlflow.db")
    return home


def _answer(process: subprocess.Popen[str], seconds: float) -> str:
    """The server's next line, waited for at most ``seconds``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    assert ready, f"the CLI server (pid {process.pid}) did not answer within {seconds:.0f} s"
    return process.stdout.readline()


@pytest.fixture
def mlreg_cli(request: pytest.FixtureRequest, tmp_path: Path) -> CliRuns:
    """``(home, *argvs)`` -> each argv run through the CLI (CliRunner) with MLREG_HOME=home and no
    MLFLOW_TRACKING_URI, all in one child process of CLI_SERVER (MLflow imported there, never in
    this process): each run's ``exit_code``, ``stdout`` and ``stderr``."""
    process = request.config.stash[BACKGROUND][CLI_FIXTURE]
    if not request.config.stash.get(CLI_READY, False):
        line = _answer(process, 300)
        assert line == "ready\n", f"the CLI server did not start: {line!r} (exit {process.poll()})"
        request.config.stash[CLI_READY] = True

    def runs(home: Path, *argvs: list[str]) -> list[dict[str, Any]]:
        assert process.stdin is not None
        out = tmp_path / f"cli-{len(list(tmp_path.glob('cli-*.json')))}.json"
        log = out.with_suffix(".log")
        asked = {"set": {"MLREG_HOME": str(home)}, "unset": ["MLFLOW_TRACKING_URI"], "cwd": str(ROOT)}
        process.stdin.write(json.dumps({**asked, "argvs": argvs, "out": str(out), "log": str(log)}) + "\n")
        process.stdin.flush()
        status = json.loads(_answer(process, 330))
        assert status == 0, f"the CLI child ended with {status}: {log.read_text()}"
        assert out.is_file(), f"the CLI child wrote no answer: {log.read_text()}"
        found: list[dict[str, Any]] = json.loads(out.read_text())
        return found

    return runs
