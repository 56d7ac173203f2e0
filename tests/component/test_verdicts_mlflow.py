"""Issue 49's first "Done when", on MLflow's side: each kind of failure -- golden outputs, perf, the
shadow replay, each bake check, memory headroom, the peak-batch request, the runtime gate -- is
read back from the run a real MLflow wrote (sqlite), through MLflow's own client: ``verdict.json``
among the run's artifacts holds the refusing record ``--json`` printed, figure for figure, and each
figure is a run metric (``verdict_<check>_<model>_value``, ``_threshold``, ``_sample``); the
record's result is ``fail`` and it names its fix.

The promotions are whole ones in the unit world, their runs recorded by ``record_promotion`` (the
failure path's record) into one real ``MlflowRegistry``: tests/unit/verdict_kinds.py, run beside
the suite (``BACKGROUND``, tests/component/conftest.py: a fast test never imports MLflow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.component.conftest import SCRATCH, Background, Finished
from tests.unit.verdict_kinds import BAKES, CAPTURED, FREE, GIB, KINDS, OBSERVED

ROOT = Path(__file__).resolve().parents[2]
BACKGROUND = {
    "kinds": Background(
        [sys.executable, "-m", "tests.unit.verdict_kinds"],
        cwd=SCRATCH,
        env={"PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""},
    )
}
FIGURES = ("value", "threshold", "sample")


@pytest.fixture
def recorded(background: Finished) -> dict[str, Any]:
    done = background("kinds")
    assert done.returncode == 0, done.stderr[-3000:]
    found = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    assert sorted(found) == sorted([*KINDS, OBSERVED])
    return found


def _record(kind: str, recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The refusing record of ``kind`` as --json printed it, the same in the run's verdict.json
    (read through MLflow), each of its figures a run metric; (record, document, run)."""
    assert "crash" not in recorded[kind], recorded[kind].get("crash")
    document, run = recorded[kind]["document"], recorded[kind]["run"]
    [found] = [v for v in document["verdicts"] if v["name"] == kind and v["refuses"]]
    assert "verdict.json" in run["artifacts"]
    assert found in run["verdict.json"]  # the record --json printed, figure for figure
    assert run["verdict.json"] == document["verdicts"]
    assert run["status"] == "FAILED"
    assert run["tags"]["result"] == document["outcome"] in ("refused", "rolled back")
    model = found["subject"].split(" ")[0]
    for figure in FIGURES:
        assert found[figure] is not None, f"{kind}: no {figure}"
        assert run["metrics"][f"verdict_{kind}_{model}_{figure}"] == pytest.approx(found[figure])
    assert (found["result"], found["observed"]) == ("fail", False)
    assert found["fix"]
    assert document["reason"].startswith(f"{kind} {found['subject']}: fail")  # the promotion's reason
    return found, document, run


def test_a_golden_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, _ = _record("golden", recorded)
    assert (found["value"], found["threshold"], found["sample"]) == (1.0, 0.0, 1)  # one output wrong
    assert found["fix"].startswith("fix the model")


def test_a_perf_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, run = _record("perf", recorded)
    assert found["value"] > found["threshold"] >= 1.25  # the p95 ratio above its limit
    assert found["sample"] >= 2 * 8  # both sides' latencies, the environment's 8 requests each
    assert run["metrics"]["verdict_perf_net_noise_floor"] == pytest.approx(found["noise_floor"])
    assert "slower" in found["why"]


def test_a_shadow_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, run = _record("shadow", recorded)
    assert (found["value"], found["sample"], found["noise_floor"]) == (float(CAPTURED), CAPTURED, 0.0)
    assert found["threshold"] == pytest.approx(0.4)  # max_divergence 0.5 % of 80 requests above the floor
    assert run["metrics"]["verdict_shadow_m_noise_floor"] == 0.0
    assert f"diverged from serving v1 on {CAPTURED} of {CAPTURED}" in found["why"]


# the bake's ratios from the stand-in counters' rates (tests/unit/verdict_kinds.py BAKES)
RATIOS = {"failure_ratio": 5 / 15, "latency_ratio": 3.0, "queue_ratio": 3.0, "probe_failure_ratio": 1.0}


@pytest.mark.parametrize("check", sorted(BAKES))
def test_each_bake_check_failure_is_read_back_from_the_mlflow_run(
    recorded: dict[str, Any], check: str
) -> None:
    found, document, _ = _record(f"bake.{check}", recorded)
    assert found["threshold"] == BAKES[check][1]
    if check == "requests":
        assert found["sample"] == found["value"] < found["threshold"]  # too few requests to judge
    else:
        assert found["value"] == pytest.approx(RATIOS[check])
        assert found["value"] > found["threshold"]
        assert found["sample"] > 0
    assert found["fix"].startswith("fix the model and register a new version")
    assert document["outcome"] == "rolled back"


def test_a_headroom_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, _ = _record("headroom", recorded)
    assert found["value"] == FREE  # the replica's free memory, from its gauges
    assert found["threshold"] == pytest.approx(2 * GIB * 1.2, abs=1)  # footprint x memory_margin
    assert (found["sample"], found["replicas"]) == (1, ["t0:8001"])
    assert "memory_margin" in found["fix"]


def test_a_peak_batch_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, _ = _record("peak_batch", recorded)
    assert (found["value"], found["threshold"], found["sample"]) == (0.0, 4.0, 1)
    assert "max_batch_size 4" in found["fix"]


def test_a_runtime_failure_is_read_back_from_the_mlflow_run(recorded: dict[str, Any]) -> None:
    found, _, run = _record("runtime", recorded)
    # the release's known hazards (one finding each), none allowed, every replica judged (preflight)
    assert (found["value"], found["threshold"], found["sample"]) == (float(len(found["findings"])), 0.0, 2)
    assert found["value"] >= 1
    assert found["replicas"] == ["t0:8001", "t1:8001"]
    assert "Triton >=" in found["fix"]
    assert run["metrics"]["verdict_runtime_hazards_value"] == found["value"]


def test_an_observed_shadow_replay_is_recorded_in_the_run_with_the_enforced_figures(
    recorded: dict[str, Any],
) -> None:
    """The shadow kind's candidate and captures, in an environment with ``observe = ["shadow"]``:
    promoted, and its run holds the record "observed: would have refused" with the figures the
    enforcing environment's run holds, as metrics too."""
    enforced, _, enforced_run = _record("shadow", recorded)
    assert "crash" not in recorded[OBSERVED], recorded[OBSERVED].get("crash")
    document, run = recorded[OBSERVED]["document"], recorded[OBSERVED]["run"]
    assert (document["outcome"], document["reason"], run["status"]) == ("promoted", "", "FINISHED")
    assert run["tags"]["result"] == "promoted"
    assert list(recorded[OBSERVED]["serving"].values()) == [{"2": "READY"}] * 2  # both replicas serve v2
    assert recorded[OBSERVED]["alias"] == "2"  # the environment's alias moved
    [noted] = [v for v in run["verdict.json"] if v["name"] == "shadow"]
    assert run["verdict.json"] == document["verdicts"]
    assert (noted["result"], noted["observed"], noted["refuses"]) == ("fail", True, False)
    assert noted["note"] == "observed: would have refused"
    marks = ("observed", "refuses", "note")
    assert {k: v for k, v in noted.items() if k not in marks} == {
        k: v for k, v in enforced.items() if k not in marks
    }
    for figure in (*FIGURES, "noise_floor"):
        key = f"verdict_shadow_m_{figure}"
        assert run["metrics"][key] == enforced_run["metrics"][key] == pytest.approx(noted[figure])
