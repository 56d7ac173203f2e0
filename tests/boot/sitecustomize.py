"""Test sessions only: a new, empty sqlite MLflow database starts as a copy of one MLflow migrated.

MLflow builds a new sqlite database by running its ~60 alembic migrations: 1.8 s of CPU each time
(3.2 s for the first in a process), measured on this machine's 2 cores.  The suite makes such a
database in over a hundred places (every test's embedded registry, every ``mlflow server`` it
starts), in the pytest workers and in their subprocesses.  Here, MLflow's ``_initialize_tables`` on
an *empty sqlite file* copies a template instead (sqlite's online backup, 0.07 s): the template is
what MLflow's own ``_initialize_tables`` made of an empty file, once per machine and MLflow version,
so the database a test sees is the one MLflow would have made.  Anything else (a database that
holds a table, another backend, an in-memory one) runs MLflow's own code, untouched.

tests/conftest.py puts this folder first on ``PYTHONPATH`` (so every Python process a test starts
imports this ``sitecustomize`` at start-up) and installs the hook in the pytest process itself.
``MLREG_TEST_FRESH_MLFLOW_DB=1`` turns it off: the tests that claim a first day on a fresh machine
(tests/integration/test_tutorial.py) set it, so MLflow's real migrations stay in the suite.

It imports nothing heavy: the hook waits for ``mlflow.store.db.utils`` to be imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from typing import Any

TARGET = "mlflow.store.db.utils"
OFF = "MLREG_TEST_FRESH_MLFLOW_DB"


def _template(utils: Any, original: Any) -> str:
    """The migrated template's path: made by MLflow's own ``_initialize_tables`` of an empty file,
    written beside and moved in place (two processes making it at once each move a whole one)."""
    import mlflow
    import sqlalchemy

    head = utils._get_latest_schema_revision()
    path = os.path.join(tempfile.gettempdir(), f"mlreg-tests-mlflow-{mlflow.__version__}-{head}.db")
    if os.path.isfile(path):
        return path
    fd, partial = tempfile.mkstemp(prefix="mlreg-tests-mlflow-", suffix=".partial.db")
    os.close(fd)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
        try:
            original(engine)
        finally:
            engine.dispose()
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


def _empty_sqlite_file(engine: Any) -> bool:
    import sqlalchemy

    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False
    return not sqlalchemy.inspect(engine).get_table_names()


def _patch(utils: Any) -> None:
    original = utils._initialize_tables
    if getattr(original, "mlreg_template", False):
        return

    def _initialize_tables(engine: Any) -> None:
        if os.environ.get(OFF) == "1" or not _empty_sqlite_file(engine):
            original(engine)
            return
        import sqlite3

        template = _template(utils, original)
        raw = engine.raw_connection()
        try:
            source = sqlite3.connect(f"file:{template}?mode=ro", uri=True)
            try:
                source.backup(raw.driver_connection)
            finally:
                source.close()
        finally:
            raw.close()
        utils._logger.info("Creating initial MLflow database tables... (a copy of %s)", template)

    _initialize_tables.mlreg_template = True  # type: ignore[attr-defined]
    utils._initialize_tables = _initialize_tables


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """The hook, in this process: now if MLflow's module is already imported, else on its import."""
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
