"""Session fixtures shared by the unit, component and integration tests."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from registry.settings import QUIET_TENSORFLOW

if TYPE_CHECKING:
    from registry import template

for _key, _value in QUIET_TENSORFLOW.items():  # TensorFlow imported by tests stays quiet, as in the CLI
    os.environ.setdefault(_key, _value)
# Every local stack a test starts locks its control API (pipelines/triton/control_key.py) with this key, and
# every client the tests open (in process or a mlreg subprocess) sends it: one per worker process.
# tests/integration/test_security.py starts a stack without it (the key generated into MLREG_HOME).
os.environ.setdefault("MLREG_CONTROL_KEY", secrets.token_urlsafe(24))
ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "model_repository_template"
FAST_TIERS = (ROOT / "tests" / "unit", ROOT / "tests" / "component")  # tests/unit/conftest.py


# A skipped test proves nothing: the suite fails on any skip (everything a test needs is installed by
# the project's own files: .ci/system-deps.sh, the dev extra).  MLREG_ALLOW_SKIPS=1 lifts this for
# a developer's partial run.
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped or hasattr(report, "wasxfail"):  # an xfail (or an xpass) proves nothing either
        _SKIPPED.append(f"{report.nodeid}: {_reason(report)}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module skipped whole (``pytest.skip(allow_module_level=True)``) never reaches the test hooks."""
    if report.skipped:
        _SKIPPED.append(f"{report.nodeid}: {_reason(report)}")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if getattr(report, "wasxfail", None) is not None:
        return f"xfail: {report.wasxfail}"  # type: ignore[union-attr]
    return str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED and exitstatus == 0 and os.environ.get("MLREG_ALLOW_SKIPS") != "1":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    session.config.stash[PASSED] = session.exitstatus == 0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED and os.environ.get("MLREG_ALLOW_SKIPS") != "1":
        terminalreporter.section("unexpected skips (the suite fails on any skip)")
        for line in _SKIPPED:
            terminalreporter.write_line(line)


# A run of the fast tiers writes ~3,000 small throwaway files (stores, registries, scratch copies): on
# a tmpfs they cost a third of what they cost on a journaled disk.  ``pytest tests/unit`` (or
# tests/component, or both) puts them, and
# the temporary folders the code under test makes, on /dev/shm when it has room; MLREG_TEST_TMPFS=0
# or an explicit --basetemp keeps pytest's default.  The folder goes after a run that passed, and
# stays after one that failed (its path is in the failures), until a later run finds its process gone.
SHM = Path("/dev/shm")
SHM_NEEDED = 256 * 2**20
SHM_PREFIX = "mlreg-unit-"
TMPFS = pytest.StashKey[tuple[Path, str | None]]()
PASSED = pytest.StashKey[bool]()


def _fast_only(config: pytest.Config) -> bool:
    """Every path the run was given is in a fast tier (tests/unit, tests/component)."""
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args] or [Path.cwd()]
    return all(any(path == tier or tier in path.parents for tier in FAST_TIERS) for path in paths)


def _shm_room() -> bool:
    try:
        stat = os.statvfs(SHM)
    except OSError:
        return False
    return os.access(SHM, os.W_OK) and stat.f_bavail * stat.f_frsize >= SHM_NEEDED


def _remove_abandoned() -> None:
    for folder in SHM.glob(f"{SHM_PREFIX}*"):
        pid = folder.name.removeprefix(SHM_PREFIX).split("-")[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, OSError):
            continue


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if (
        config.option.basetemp is not None
        or os.environ.get("MLREG_TEST_TMPFS", "1") == "0"
        or hasattr(config, "workerinput")  # an xdist worker: its controller chose
        or not _fast_only(config)
        or not _shm_room()
    ):
        return
    _remove_abandoned()
    root = Path(tempfile.mkdtemp(dir=SHM, prefix=f"{SHM_PREFIX}{os.getpid()}-"))
    (root / "tmp").mkdir()
    config.option.basetemp = str(root / "pytest")
    config.stash[TMPFS] = (root, os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = str(root / "tmp")
    tempfile.tempdir = None  # read TMPDIR again


def _leave_tmpfs(config: pytest.Config) -> None:
    if TMPFS not in config.stash:
        return
    root, tmpdir = config.stash[TMPFS]
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None
    if config.stash.get(PASSED, False):
        shutil.rmtree(root, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    _leave_tmpfs(config)


# -- pytest-xdist (make test: two workers, a module per worker at a time) -------------------------

# Modules sharing one session stack run on one worker: test_browser.py looks at the MLflow UI of
# test_mlflow_native.py's stack (built once per process: ~40 s more on another worker); test_wheel.py
# serves the wheel of test_release.py's act run (tests/act/release.py; another worker would wait);
# test_serving.py and test_store_cli.py use the session's tritonserver with the whole ensemble
# loaded (tests/integration/conftest.py ``triton``: ~20 s to start, once per worker); the modules
# of the session's ``mlflow_server`` (tests/conftest.py) start it once.
SAME_WORKER = {
    "tests/integration/test_serving.py": "tests/integration/test_store_cli.py",
    "tests/integration/test_browser.py": "tests/integration/test_mlflow_native.py",
    "tests/integration/test_relay.py": "tests/integration/test_mlflow_native.py",  # its stack, its Triton
    # the session's ``mlflow_server`` (one start: ~15 s of CPU for the server and its uvicorn worker)
    "tests/integration/test_nvidia_plugin.py": "tests/integration/test_mlflow_native.py",
    "tests/integration/test_registry.py": "tests/integration/test_mlflow_native.py",
    "tests/integration/test_wheel.py": "tests/integration/test_release.py",
}
# The order modules are handed out in: the longest first (a greedy longest-first schedule: the
# critical path is the worker that ends last, and a long module handed out late decides it), by the
# seconds each took in a clean-clone run on CI's two workers (MODULE_SECONDS, refreshed by
# ``benchmarks/suite.py --full new --update-seconds``).  A module the table does not know yet (a new
# one) is estimated from its number of tests.  pytest-xdist's own order (most tests first) put the
# unit modules first and integration modules of one test and a minute or more last.
MODULE_SECONDS = ROOT / "tests" / "module_seconds.json"
NEW_TEST_SECONDS = {"tests/integration/": 10.0, "tests/component/": 1.0, "tests/unit/": 0.01}


def expected_seconds(scope: str, tests: int, table: dict[str, float]) -> float:
    """What the work unit ``scope`` (a module, or a SAME_WORKER group under its module) is expected
    to take: its modules' seconds in ``table``, else ``tests`` times a new test's seconds."""
    members = [scope, *(module for module, group in SAME_WORKER.items() if group == scope)]
    known = [table[module] for module in members if module in table]
    if known:
        return sum(known)
    per_test = next((s for prefix, s in NEW_TEST_SECONDS.items() if scope.startswith(prefix)), 1.0)
    return tests * per_test


def module_seconds() -> dict[str, float]:
    """MODULE_SECONDS' table (module -> seconds); empty when it is missing or unreadable (the
    order then follows the number of tests)."""
    try:
        table = json.loads(MODULE_SECONDS.read_text())["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, int | float)}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the modules of SAME_WORKER grouped as one, handed out longest first
    (``expected_seconds``), and a worker given its next module only once it is on its current
    one's last test (pytest-xdist: its last two), so a long module goes to the worker that frees
    first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleGroups(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SAME_WORKER.get(module, module)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is complete before the first module is handed out
                self.ordered = True
                table = module_seconds()
                order = sorted(
                    self.workqueue,
                    key=lambda scope: -expected_seconds(scope, len(self.workqueue[scope]), table),
                )
                for scope in order:
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # pytest-xdist's own, with 1 where it has 2: a worker holds its last test until it
            # knows the next (the module's teardown depends on it), so 1 is the least that runs
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return ModuleGroups(config, log)


def failing_python_model(reason: str) -> str:
    """A python-backend model.py whose ``initialize`` raises: a model that cannot load, for real."""
    return f'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("{reason}")

    def execute(self, requests):
        return []
'''


@contextlib.contextmanager
def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder made once per test run, however many pytest-xdist workers ask: ``(folder, first)``,
    the first asker (under a lock the others wait on) makes its content."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # one process: a folder of its own
        yield tmp_path_factory.mktemp(name), True
        return
    root = tmp_path_factory.getbasetemp().parent  # the run's folder, the workers' common parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / f"{name}.done"
        folder = root / name
        folder.mkdir(exist_ok=True)
        yield folder, not done.exists()
        done.touch()


@pytest.fixture(scope="session")
def template_build(tmp_path_factory: pytest.TempPathFactory) -> template.BuildResult:
    """The template built once per test run (configs, python models, exported artifacts): the run's
    one export.  Stacks register it as ``mlreg export`` would (tests/integration/stacks.py)."""
    from registry import template

    with once_per_run(tmp_path_factory, "repository") as (out, first):
        record = out.parent / f"{out.name}.json"
        if first:
            build = template.build(TEMPLATE, out, device="cpu", force=True)
            record.write_text(json.dumps(dataclasses.asdict(build), default=str))
            return build
        saved = json.loads(record.read_text())
        return template.BuildResult(**{**saved, "out": out})


@pytest.fixture(scope="session")
def standin_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template as ``mlreg template build --device cpu`` writes it, stand-in artifacts inside
    (tests/unit/standins.py): the fast tiers' model repository (one definition, for both)."""
    from registry import template
    from tests.unit import standins

    out = tmp_path_factory.mktemp("standin") / "repository"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(template, "run_exporter", standins.run_exporter)
        template.build(TEMPLATE, out, device="cpu")
    return out


@pytest.fixture(scope="session")
def built_repository(template_build: template.BuildResult) -> Path:
    """The session's built template, for this CPU (KIND_GPU instance groups rewritten as KIND_CPU)."""
    return template_build.out


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A real S3-compatible server process (moto_server) on 127.0.0.1, once per session; its
    credentials in the environment while it runs (the ones this set are removed again)."""
    from pipelines.devstack import local_s3

    added = [key for key in local_s3.CREDENTIALS if key not in os.environ]
    for key in added:
        os.environ[key] = local_s3.CREDENTIALS[key]
    try:
        server, process = local_s3.start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
        try:
            yield server
        finally:
            local_s3.stop_s3(server.pid, process)
    finally:
        for key in added:
            os.environ.pop(key, None)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` (sqlite, --workers 1, --serve-artifacts), once per session."""
    from pipelines.devstack import local_mlflow

    root = tmp_path_factory.mktemp("mlflow-server")
    server, process = local_mlflow.start_mlflow(
        f"sqlite:///{root / 'mlflow.db'}", root / "artifacts", root / "mlflow.log", serve_artifacts=True
    )
    try:
        yield server
    finally:
        local_mlflow.stop_mlflow(server.pid, process)
