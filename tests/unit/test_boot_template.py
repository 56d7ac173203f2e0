"""The suite's start-up hook (tests/boot/sitecustomize.py) gives a test the database MLflow makes.

A new, empty sqlite MLflow database starts, in every process a test starts, as a copy of a template
that MLflow's own migrations made; this checks, in one such process (``BACKGROUND``: a unit test
never imports MLflow), that the copy is what the migrations make of an empty file -- the same
tables, columns, indexes and constraints (sqlite_master, in any order: MLflow's migrations create
some indexes in an order that varies), the same alembic revision, the same rows in every table --
and that the copy, not the migrations, made it (the hook's log line), while
``MLREG_TEST_FRESH_MLFLOW_DB=1`` runs the migrations (no such line).
"""

from __future__ import annotations

import json
import sys

from tests.conftest import PYTHONPATH
from tests.unit.conftest import SCRATCH, Background, Finished

COMPARE = """
import json, logging, os, sqlite3
from mlflow.tracking import MlflowClient

said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("mlflow.store.db.utils").addHandler(Keep())
logging.getLogger("mlflow.store.db.utils").setLevel(logging.INFO)

def make(name):
    said.clear()
    client = MlflowClient(tracking_uri=f"sqlite:///{name}", registry_uri=f"sqlite:///{name}")
    client.search_registered_models()
    client.search_experiments()
    return [m for m in said if "database tables" in m]

def state(name):
    with sqlite3.connect(name) as db:
        schema = sorted(tuple(r) for r in db.execute("select type, name, tbl_name, sql from sqlite_master"))
        tables = [r[1] for r in schema if r[0] == "table"]
        rows = {t: db.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}
        revision = db.execute("select version_num from alembic_version").fetchall()
    return {"schema": schema, "rows": rows, "revision": revision}

copied_log = make("copied.db")
os.environ["MLREG_TEST_FRESH_MLFLOW_DB"] = "1"
migrated_log = make("migrated.db")
print(json.dumps({"copied": state("copied.db"), "migrated": state("migrated.db"),
                  "copied_log": copied_log, "migrated_log": migrated_log}))
"""
BACKGROUND = {
    "compare": Background([sys.executable, "-c", COMPARE], cwd=SCRATCH, env={"PYTHONPATH": PYTHONPATH})
}


def test_a_copied_database_is_the_one_mlflows_migrations_make(background: Finished) -> None:
    done = background("compare")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    copied, migrated = found["copied"], found["migrated"]
    assert len(copied["schema"]) > 50  # MLflow's tables and indexes, not an empty file
    assert copied["schema"] == migrated["schema"]
    assert copied["revision"] == migrated["revision"] != []
    assert copied["rows"] == migrated["rows"]
    assert any("a copy of" in line for line in found["copied_log"]), found["copied_log"]  # the hook made it
    assert found["migrated_log"], "MLflow's migrations said nothing"
    assert not any("a copy of" in line for line in found["migrated_log"])  # MLREG_TEST_FRESH_MLFLOW_DB=1
