"""Unit fixtures: seconds, no TensorFlow, no export.

A unit test that needs a model repository gets ``standin_repository``: the template built by the
real ``registry.template.build`` (``--device cpu``) with each exporter replaced by a stand-in that
writes the config's tensors (tests/unit/standins.py).  Tests that need real exported bytes live in
tests/integration, where ``built_repository`` is.  Any unit test that imports TensorFlow fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, TEMPLATE
from tests.unit import standins

HERE = Path(__file__).resolve().parent
NOT_IN_UNIT_TESTS = ("tensorflow", "keras", "tf2onnx")
MOVE_IT = "a test that needs a real export belongs in tests/integration (built_repository)"


def _loaded() -> set[str]:
    return {name for name in NOT_IN_UNIT_TESTS if name in sys.modules}


@pytest.fixture(autouse=True, scope="session")
def _collected_without_tensorflow(request: pytest.FixtureRequest) -> None:
    """A unit-only run imported no TensorFlow while collecting (a module-level import)."""
    if all(HERE in Path(item.path).resolve().parents for item in request.session.items):
        assert not _loaded(), f"collecting the unit tests imported {sorted(_loaded())}: {MOVE_IT}"


@pytest.fixture(autouse=True)
def _no_tensorflow() -> Iterator[None]:
    """Each unit test leaves TensorFlow unimported (checked where it was not loaded before it)."""
    before = _loaded()
    yield
    if _loaded() - before:
        pytest.fail(f"this unit test imported {sorted(_loaded() - before)}: {MOVE_IT}", pytrace=False)


@pytest.fixture(scope="session")
def built_repository() -> Path:
    """Unit tests export nothing: the session's TensorFlow build is for tests/integration."""
    pytest.fail(f"unit tests use standin_repository, not built_repository: {MOVE_IT}", pytrace=False)


@pytest.fixture(scope="session")
def standin_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template as ``mlreg template build --device cpu`` writes it, stand-in artifacts inside."""
    from registry import template

    out = tmp_path_factory.mktemp("standin") / "repository"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(template, "run_exporter", standins.run_exporter)
        template.build(TEMPLATE, out, device="cpu")
    return out


# MLflow creates its database through its migrations (2-4 s): done once a run, in a process started
# as soon as the tests are collected; the tests that need it run last, so it runs beside the others
CREATE_EMPTY_REGISTRY = """
import sys
from registry.mlflow import MlflowRegistry
from registry.settings import Settings

MlflowRegistry(Settings.from_env(env={"MLREG_HOME": sys.argv[1]})).client.search_registered_models()
"""
EMPTY_REGISTRY = pytest.StashKey[tuple[subprocess.Popen[str], Path]]()


def _needs_registry(item: pytest.Item) -> bool:
    return "registry_home" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = [i for i in items if not _needs_registry(i)] + [i for i in items if _needs_registry(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(_needs_registry(item) for item in session.items):
        return
    home = Path(tempfile.mkdtemp(prefix="mlreg-empty-registry-"))
    process = subprocess.Popen(
        [sys.executable, "-c", CREATE_EMPTY_REGISTRY, str(home)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    session.config.stash[EMPTY_REGISTRY] = (process, home)


def pytest_unconfigure(config: pytest.Config) -> None:
    if EMPTY_REGISTRY in config.stash:
        process, home = config.stash[EMPTY_REGISTRY]
        process.kill()
        process.communicate()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def _empty_mlflow_db(request: pytest.FixtureRequest) -> Path:
    """An embedded registry's database as MLflow creates it, made once a run (see above)."""
    process, home = request.config.stash[EMPTY_REGISTRY]
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, f"creating an empty MLflow registry failed:\n{stderr}"
    return home / "mlflow.db"


@pytest.fixture
def registry_home(_empty_mlflow_db: Path, tmp_path: Path) -> Path:
    """``tmp_path/home``: an MLREG_HOME whose embedded registry exists and is empty (a copy of the
    session's, so no test pays MLflow's migrations again)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    shutil.copy2(_empty_mlflow_db, home / "mlflow.db")
    return home
