"""The MLflow UI tells the promotion (issue 48, item 6): a promotion run and the versions it moved
or tried link each other (``registry.mlflow.story``), the run lasts as long as the promotion, and a
version that failed validation says so and offers no promote command.

The registry is written by MLflow itself, beside the run (``BACKGROUND``): two template versions
registered by ``register_version``, one promotion that succeeded (its run started 42 s before the
record stage) and one the gate refused, both recorded by ``record_promotion``.  The test reads what
MLflow wrote from the embedded registry's file (sqlite), without importing MLflow.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from registry.lineage import GitState, Lineage, describe
from registry.mlflow.story import KEPT, SECTION, promotion_line, with_promotion
from tests.component.conftest import SCRATCH, Background, Finished

ROOT = Path(__file__).resolve().parents[2]
MODEL, OTHER = "table_data_preprocess", "image_preprocess"
MADE_BY_MLFLOW = r"""
import json, sys, time
from pathlib import Path
from pipelines.core.plan import Plan
from pipelines.core.reports import PromotionResult, StageRecord
from pipelines.promote.environments import Environment
from pipelines.promote.record import RecordWrites, record_promotion
from registry.mlflow import MlflowRegistry
from registry.settings import PROMOTIONS_EXPERIMENT, Settings

template, home = Path(sys.argv[1]), Path.cwd() / "home"
registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(home)}))
for model in ("table_data_preprocess", "image_preprocess"):
    registry.register_version(model, template / model / "1", template / model / "config.pbtxt")
env = Environment("local", "file:///nowhere", ("127.0.0.1:8001",), "production", gpu=False)
began = time.time() - 42.0
ok = PromotionResult(Plan(env, env.targets, "table_data_preprocess", "1"), started=began)
ok.stages.append(StageRecord("deploy", "ok", 40.0, "deployed"))
writes = RecordWrites(registry.models, "production", "promoted_local")
writes.deployed.append(("table_data_preprocess", "1"))
record_promotion(registry, ok, env, PROMOTIONS_EXPERIMENT, writes)
refused = PromotionResult(
    Plan(env, env.targets, "image_preprocess", "1"),
    error="gate: shadow replay refused image_preprocess v1",
    started=time.time() - 7.0,
)
refused.verdicts = [{"name": "shadow", "subject": "image_preprocess v1", "result": "fail",
                     "value": 0.31, "threshold": 0.05, "sample": 200}]
record_promotion(registry, refused, env, PROMOTIONS_EXPERIMENT)
print(json.dumps({"home": str(home), "ok": ok.run_id, "refused": refused.run_id, "began": began,
                  "experiment": registry.runs.experiment_id(PROMOTIONS_EXPERIMENT)}))
"""
BACKGROUND = {
    "story": Background(
        [sys.executable, "-c", MADE_BY_MLFLOW, str(ROOT / "model_repository_template")],
        cwd=SCRATCH,
        env={"PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""},
    )
}


@pytest.fixture
def made(background: Finished) -> dict[str, Any]:
    proc = background("story")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    found["db"] = sqlite3.connect(Path(found["home"]) / "mlflow.db")
    return found


def _run(db: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    start, end, status = db.execute(
        "SELECT start_time, end_time, status FROM runs WHERE run_uuid = ?", (run_id,)
    ).fetchone()
    tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
    metrics = dict(db.execute("SELECT key, value FROM metrics WHERE run_uuid = ?", (run_id,)).fetchall())
    return {"start": start, "end": end, "status": status, "tags": tags, "metrics": metrics}


def _version(db: sqlite3.Connection, model: str, version: str) -> tuple[str, dict[str, str]]:
    (description,) = db.execute(
        "SELECT description FROM model_versions WHERE name = ? AND version = ?", (model, int(version))
    ).fetchone()
    tags = db.execute(
        "SELECT key, value FROM model_version_tags WHERE name = ? AND version = ?", (model, int(version))
    ).fetchall()
    return description or "", dict(tags)


def test_the_promotion_run_starts_when_the_promotion_began_not_at_its_record(made: dict[str, Any]) -> None:
    run = _run(made["db"], made["ok"])
    assert run["start"] == int(made["began"] * 1000)
    assert run["end"] - run["start"] >= 42_000  # the promotion's length, not the record stage's
    assert run["status"] == "FINISHED"


def test_the_run_links_the_versions_it_moved_and_its_verdict(made: dict[str, Any]) -> None:
    run, exp = _run(made["db"], made["ok"]), made["experiment"]
    note = run["tags"]["mlflow.note.content"]
    assert note.startswith(f"**promoted**: promotion of {MODEL} v1 to `local`")
    assert f"[{MODEL} v1](#/models/{MODEL}/versions/1)" in note
    assert f"[verdict.json](#/experiments/{exp}/runs/{made['ok']}/artifacts/verdict.json)" in note
    assert run["tags"]["mlreg_versions"] == f"{MODEL}/1"


def test_the_version_page_links_each_promotion_run_and_keeps_what_register_wrote(
    made: dict[str, Any],
) -> None:
    description, tags = _version(made["db"], MODEL, "1")
    before, _, section = description.partition(f"\n\n{SECTION}\n")
    assert "**Lineage**" in before
    assert "Promote with `mlreg promote" in before
    [line] = section.splitlines()
    exp, run = made["experiment"], made["ok"]
    assert "`local`: **promoted**" in line
    assert f"[run {run[:8]}](#/experiments/{exp}/runs/{run})" in line
    assert f"[verdict](#/experiments/{exp}/runs/{run}/artifacts/verdict.json)" in line
    assert tags["promotion_run_local"] == run  # the run the deployment tags name is the one linked


def test_a_refused_run_and_its_version_say_refused_with_the_reason_and_the_figures(
    made: dict[str, Any],
) -> None:
    run, exp = _run(made["db"], made["refused"]), made["experiment"]
    note = run["tags"]["mlflow.note.content"]
    assert note.startswith(f"**refused**: promotion of {OTHER} v1 to `local`")
    assert f"#/models/{OTHER}/versions/1" in note
    assert "Why: gate: shadow replay refused image_preprocess v1" in note
    assert run["status"] == "FAILED"
    assert 7_000 <= run["end"] - run["start"] < 600_000
    description, tags = _version(made["db"], OTHER, "1")
    assert f"`local`: **refused** — [run {made['refused'][:8]}](#/experiments/{exp}/runs/" in description
    assert "promoted_local" not in tags
    assert "promotion_run_local" not in tags
    assert run["metrics"]["verdict_shadow_image_preprocess_value"] == pytest.approx(0.31)


def test_the_promotions_section_is_added_once_and_keeps_the_newest_lines() -> None:
    body = "**m** — python\n\nPromote with `mlreg promote m --version <this version>`."
    text = body
    for n in range(KEPT + 5):
        text = with_promotion(
            text, promotion_line("0", f"run{n:05d}xx", "local", "promoted", "2026-12-06T09:00:00Z")
        )
    assert text.startswith(body + f"\n\n{SECTION}\n")
    assert text.count(SECTION) == 1
    lines = text.partition(f"\n\n{SECTION}\n")[2].splitlines()
    assert len(lines) == KEPT
    assert "run00005" in lines[0]
    assert f"run{KEPT + 4:05d}" in lines[-1]
    assert "**unknown**" in promotion_line("0", "r", "local", "<img src=x>", "2026-12-06T09:00:00Z")


def test_a_version_that_failed_validation_is_marked_and_offers_no_promote_command() -> None:
    contract = {"platform": "python", "max_batch_size": 0, "inputs": [], "outputs": []}
    lineage = Lineage("m", GitState("abc", False), "d1", "d2", "python", "python", validation="failed")
    failed = describe(lineage, contract, ["input 'x' has no dims"])
    assert failed.startswith("⛔ **FAILED VALIDATION: this version cannot be promoted.**")
    assert "mlreg promote" not in failed
    assert "- input 'x' has no dims" in failed
    lineage.validation = "passed"
    passed = describe(lineage, contract, [])
    assert "FAILED" not in passed
    assert "Promote with `mlreg promote m --version <this version>`." in passed
