"""The MLflow adapter package ``registry.mlflow``: light to import, never the real ``mlflow``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.mlflow.environ import MlflowEnviron
from tests.component.conftest import SCRATCH, Background, Finished

ROOT = Path(__file__).resolve().parents[2]
IMPORT_ONLY = """
import sys
from registry.mlflow import MlflowRegistry
from registry.mlflow import queries, rest, sqlite
from registry.register import register
print("mlflow" in sys.modules, MlflowRegistry.__module__)
"""
# find_spec resolves ``import mlflow`` as the import would (sys.modules, then sys.path) without
# running MLflow's 1-3 s import
REAL_MLFLOW = """
import importlib.util
import registry.mlflow.registry
print(importlib.util.find_spec("mlflow").origin)
"""


# fresh interpreters, run beside the suite (tests/component/conftest.py)
BACKGROUND = {
    "import only": Background([sys.executable, "-c", IMPORT_ONLY]),
    **{
        where: Background(
            [sys.executable, "-c", REAL_MLFLOW],
            cwd=None if where == "checkout" else SCRATCH,
            env={"PYTHONPATH": str(ROOT)},
        )
        for where in ("checkout", "elsewhere")
    },
}


def test_importing_the_adapter_does_not_import_mlflow(background: Finished) -> None:
    proc = background("import only")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False registry.mlflow.registry"


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_subpackage_never_stands_in_for_the_real_mlflow(where: str, background: Finished) -> None:
    """Imports are absolute: ``import mlflow`` after the adapter is the installed package (a Python
    started *inside* registry/ would find registry/mlflow first, as for any folder on sys.path);
    "elsewhere" runs in a new empty folder outside the checkout."""
    proc = background(where)
    assert proc.returncode == 0, proc.stderr
    assert "site-packages" in proc.stdout
    assert str(ROOT / "registry") not in proc.stdout


def test_the_environment_is_set_for_the_block_and_restored_by_the_last_one_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLREG_TEST_KEPT", "user")
    monkeypatch.delenv("MLREG_TEST_SET", raising=False)
    monkeypatch.delenv("MLREG_TEST_DEFAULT", raising=False)
    environ = MlflowEnviron()
    values = {"MLREG_TEST_SET": "1", "MLREG_TEST_KEPT": "mlreg"}
    entered, leave = threading.Event(), threading.Event()

    def other_thread() -> None:
        with environ.scope(values, {"MLREG_TEST_DEFAULT": "d"}):
            entered.set()
            leave.wait(5)

    with environ.scope(values, {"MLREG_TEST_DEFAULT": "d"}):
        assert (os.environ["MLREG_TEST_SET"], os.environ["MLREG_TEST_KEPT"]) == ("1", "mlreg")
        assert os.environ["MLREG_TEST_DEFAULT"] == "d"
        thread = threading.Thread(target=other_thread)
        thread.start()
        entered.wait(5)
    assert os.environ["MLREG_TEST_SET"] == "1"  # the other thread is still inside
    leave.set()
    thread.join(5)
    assert "MLREG_TEST_SET" not in os.environ
    assert "MLREG_TEST_DEFAULT" not in os.environ
    assert os.environ["MLREG_TEST_KEPT"] == "user"


def test_a_default_never_replaces_what_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLREG_TEST_DEFAULT", "false")
    with MlflowEnviron().scope({}, {"MLREG_TEST_DEFAULT": "true"}):
        assert os.environ["MLREG_TEST_DEFAULT"] == "false"
    assert os.environ["MLREG_TEST_DEFAULT"] == "false"


def test_a_password_in_the_tracking_uri_never_reaches_an_error_message() -> None:
    from registry.settings import redact_uri

    assert redact_uri("postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow") == (
        "postgresql+psycopg2://mlflow:***@db:5432/mlflow"
    )
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"  # a port is no password
    assert redact_uri("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"


VERSION_TAGS = """
import sys
from registry.errors import RegistryError
from registry.mlflow import MlflowRegistry
from registry.settings import Settings

env = {"MLFLOW_TRACKING_URI": sys.argv[1], "MLREG_HOME": sys.argv[2]}
registry = MlflowRegistry(Settings.from_env(env=env))
print(registry.models.version_tags("scorer", "1"))
try:
    registry.models.version_tags("scorer", "99")
except RegistryError as exc:
    print(exc.message, "|", exc.fix)
print("mlflow" in sys.modules)
"""


def test_an_unregistered_version_is_answered_from_the_embedded_database_without_mlflow(
    tmp_path: Path,
) -> None:
    """A promotion asks for the digest of every version it may go back to; a folder nobody
    registered (written into the store by hand) is "not registered", read from the database, not
    after MLflow's 3-5 s import."""
    import contextlib
    import sqlite3

    db = tmp_path / "mlflow.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:  # closed, and committed
        conn.execute(
            "CREATE TABLE model_versions (name TEXT, version INTEGER, source TEXT, run_id TEXT, "
            "storage_location TEXT, creation_time BIGINT, current_stage TEXT)"  # MLflow's columns read
        )
        conn.execute("CREATE TABLE model_version_tags (name TEXT, version INTEGER, key TEXT, value TEXT)")
        conn.execute(
            "INSERT INTO model_versions VALUES ('scorer', 1, 'file:///nowhere', 'r1', '', 0, 'None')"
        )
        conn.execute("INSERT INTO model_version_tags VALUES ('scorer', 1, 'artifact_digest', 'sha256:ab')")
    proc = subprocess.run(
        [sys.executable, "-c", VERSION_TAGS, f"sqlite:///{db}", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tags, refusal, imported = proc.stdout.strip().splitlines()
    assert tags == "{'artifact_digest': 'sha256:ab'}"
    assert "scorer v99 is not a registered version" in refusal
    assert "mlreg versions MODEL" in refusal
    assert imported == "False"


def test_the_embedded_registry_s_models_and_aliases_are_read_as_mlflow_wrote_them(
    registry_state: Callable[[str], Path], tmp_path: Path
) -> None:
    """``mlreg versions`` and a promotion's alias reads use the database MLflow itself wrote
    (conftest's states: model ``a`` v1, then its alias ``production``)."""
    from registry.mlflow import sqlite

    def uri(state: str) -> str:
        return f"sqlite:///{registry_state(state) / 'mlflow.db'}"

    held = sqlite.registered_model(uri("a_v1_production"), "a")
    assert held is not None
    assert held.aliases == {"production": "1"}
    [(version, created, tags)] = held.versions
    assert (version, tags) == ("1", {})
    assert created > 0
    assert sqlite.alias_holders(uri("a_v1_production"), "production") == {"a": "1"}
    assert sqlite.alias_holders(uri("a_v1"), "production") == {}
    assert sqlite.registered_model(uri("a_v1"), "b") is None
    assert sqlite.model_absent(uri("a_v1"), "b")
    assert not sqlite.model_absent(uri("a_v1"), "a")
    assert sqlite.model_absent(f"sqlite:///{tmp_path / 'none-yet' / 'mlflow.db'}", "a")  # nothing registered
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database")
    assert sqlite.registered_model(f"sqlite:///{garbage}", "a") is None  # ask MLflow instead
    assert not sqlite.model_absent(f"sqlite:///{garbage}", "a")


def test_removing_a_runs_local_artifacts_removes_the_folders_mlflow_made_for_them(tmp_path: Path) -> None:
    """A discarded run's ``<root>/<run>/artifacts`` and its logged model's ``<root>/models/<id>/artifacts``
    go with the folders above them once empty (issue 38 item 11: two were left), up to the
    registry's artifact root, which stays; a folder still holding something stays too."""
    from registry.disk import remove_local

    root = tmp_path / "artifacts"
    for folder in ("r1/artifacts/model/1", "models/m-1/artifacts/a/1", "models/m-2/artifacts"):
        (root / folder).mkdir(parents=True)
    (root / "r1/artifacts/model/1/weights.bin").write_bytes(b"w")
    (root / "models/m-2/artifacts/MLmodel").write_text("kept")
    remove_local((root / "r1/artifacts").as_uri(), root)
    remove_local(str(root / "models/m-1/artifacts"), root)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == [
        "models",
        "models/m-2",
        "models/m-2/artifacts",
        "models/m-2/artifacts/MLmodel",
    ]
    remove_local((root / "models/m-2/artifacts").as_uri(), root)
    assert list(root.iterdir()) == []  # the root itself stays
    elsewhere = tmp_path / "elsewhere" / "r2" / "artifacts"
    elsewhere.mkdir(parents=True)
    remove_local(elsewhere.as_uri(), root)  # not under the root: only the folder named goes
    assert (tmp_path / "elsewhere" / "r2").is_dir()
    remove_local("s3://bucket/r3/artifacts", root)  # remote: left alone
