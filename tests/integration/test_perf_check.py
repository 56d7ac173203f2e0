"""The canary's performance check and the bake's list of checks, on two real tritonservers (issue 25).

Two replicas read one local repository; the ``perf`` environment has a canary and one more wave.
Light python-backend models (no TensorFlow): ``scorer`` (answers after ``DELAY`` seconds) behind
the ensemble ``scoring``, and ``queued`` (a batching model) for the bake's queue-time check.
In file order: a first deployment records the candidate's figures without judging; a candidate
3x slower than the serving version but answering identically is refused before any other replica
moves; an equal candidate passes the check 5 times out of 5 while two processes load both cores,
then promotes; a candidate that makes requests wait in Triton's queue trips the bake's
``queue_ratio`` check (a ``[bake] checks`` list) and is rolled back (the check passing a good
version on real Triton: test_fleet.py's roll-out under traffic).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mlreg.cli.report import render
from pipelines.checks.perf import PerfSettings, check, measure
from pipelines.core.context import Options
from pipelines.core.plan import desired_config
from pipelines.core.reports import PromotionFailed, PromotionResult, QualityStageReport
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.triton.control import TritonControl
from registry.contracts.config import config_json
from registry.mlflow import MlflowRegistry
from tests.integration.fleetstack import ENSEMBLE_CONFIG, FleetStack, scorer
from tests.integration.stacks import SCORER_CONFIG, stack_settings, tritons, unloaded_on
from tests.integration.traffic import Traffic

pytestmark = pytest.mark.integration

SERVING_DELAY = 0.02  # seconds per request: far above the noise of a python stub's own time
QUEUED_CONFIG = """name: "queued"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# the candidate holds every request up to 0.3 s in the queue, waiting for a batch that never fills
QUEUED_SLOW_CONFIG = QUEUED_CONFIG + "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetStack]:
    root = tmp_path_factory.mktemp("perf-check")
    settings, _ = stack_settings(root)
    store = root / "repository"
    store.mkdir()
    with tritons(settings, root, [store] * 2, name="replica") as servers:
        (root / "work").mkdir()
        stack = FleetStack(settings, MlflowRegistry(settings), str(store), [], root / "work", root, servers)
        stack.urls[:] = [info.grpc_url for info, _ in servers]
        targets = ", ".join(f'"{url}"' for url in stack.urls)
        metrics = ", ".join(f'"{info.grpc_url}" = "{info.metrics_url}"' for info, _ in servers)
        common = f'store = "{store}"\ntargets = [{targets}]\ngpu = false\ncanary = 1\nwaves = [100]\n'
        (root / "mlreg.toml").write_text(
            f'[environments.perf]\n{common}alias = "perf"\nmetrics = {{ {metrics} }}\n'
            "perf_requests = 24\n"
            f'[environments.queue]\n{common}alias = "queue"\nbake_seconds = 3\nmetrics = {{ {metrics} }}\n'
            '[environments.queue.bake]\nchecks = [{ metric = "requests", min = 3 }, '
            '{ metric = "queue_ratio", max = 3.0 }]\n'
        )
        yield stack


def promote(pair: FleetStack, model: str, version: str, env: str = "perf", **options: Any) -> PromotionResult:
    """A real promotion WITH the quality gate (FleetStack.promote skips it)."""
    return Promotion(pair.settings, environment(pair.settings, env), pair.registry, Options(**options)).run(
        model, version
    )


def perf_of(result: PromotionResult) -> list[dict[str, Any]]:
    [report] = [s.report for s in result.stages if isinstance(s.report, QualityStageReport)]
    assert isinstance(report, QualityStageReport)
    return report.perf


def test_a_first_deployment_records_the_candidates_figures_without_judging(pair: FleetStack) -> None:
    assert pair.register("scorer", SCORER_CONFIG, scorer("v1", delay=SERVING_DELAY)) == "1"
    assert pair.register("scoring", ENSEMBLE_CONFIG, None, members={"scorer": "1"}) == "1"
    result = promote(pair, "scoring", "1")
    assert result.ok
    [perf] = perf_of(result)
    assert (perf["model"], perf["serving"], perf["ok"]) == ("scorer", None, True)
    assert perf["verdict"] == "first deployment: recorded, not judged"
    assert perf["candidate"]["version"] == "1"
    assert perf["candidate"]["requests"] >= 8
    assert perf["candidate"]["p50_ms"] >= SERVING_DELAY * 1000  # it measured the model's own sleep
    # Triton 2.51 exports no load duration: mlreg's wall time around the load, inside the gate's own
    gate = next(s for s in result.stages if s.stage == "quality")
    assert perf["triton"]["load_seconds_from"] == "mlreg's wall time around the load"
    assert 0 < perf["triton"]["load_seconds"] < gate.seconds
    assert perf["triton"]["candidate"]["compute_us_per_request"] >= SERVING_DELAY * 1e6 * 0.9
    run = pair.registry.connection.client.get_run(
        result.run_id
    )  # the figures as metrics of the promotion's run
    assert run.data.metrics["perf_scorer_candidate_p95_ms"] == perf["candidate"]["p95_ms"]
    for url in pair.urls:
        assert pair.ready(url, "scorer") == ["1"], url


def test_a_candidate_three_times_slower_is_refused_before_any_other_replica_moves(pair: FleetStack) -> None:
    assert pair.register("scorer", SCORER_CONFIG, scorer("v2", delay=3 * SERVING_DELAY)) == "2"
    before = pair.state()
    with pytest.raises(PromotionFailed) as info:
        promote(pair, "scorer", "2")
    message = info.value.message
    found = re.search(r"scorer v2 p95 ([\d.]+) ms vs v1 ([\d.]+) ms \(x([\d.]+), limit x([\d.]+)\)", message)
    assert found, message  # the report shows both latencies and the limit
    candidate_ms, serving_ms, ratio, limit = map(float, found.groups())
    assert candidate_ms > serving_ms
    assert ratio > limit >= 1.25
    assert "performance check failed" in message
    for url in pair.urls:  # the canary put back
        assert pair.ready(url, "scorer") == ["1"], url
        assert pair.pinned(url) == 1, url
    # the store's objects, the aliases, each replica's whole index and pins as they were, but for the
    # canary's index listing v2, loaded and given back (the positive control of "never loaded there":
    # the other replica's index does not list it)
    assert pair.state() == unloaded_on(before, pair.urls[0], "scorer", "2")
    assert "2" not in pair.serving(pair.urls[1], "scorer")
    assert before["aliases"]["scorer"]["perf"] == "1"


def test_an_equal_candidate_passes_five_of_five_on_a_busy_machine_then_promotes(pair: FleetStack) -> None:
    """Load: two processes spinning on the machine's two cores through the five checks and the
    promotion (the check's interleaving weighs on both versions alike).  The five checks ask the
    candidate under a private name, loaded from its own files, as the gate does across runtimes."""
    source = scorer("v3", delay=SERVING_DELAY)
    assert pair.register("scorer", SCORER_CONFIG, source) == "3"
    canary, private = pair.urls[0], "scorer__equal"
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with TritonControl(canary) as triton:
            text = desired_config(SCORER_CONFIG, ["3"], gpu=False)
            triton.load(
                private, config=config_json(text, private), files={"file:3/model.py": source.encode()}
            )
            triton.wait_ready(private, "3")
            verdicts = []
            for _ in range(5):  # judged as the gate judges: measured once more when the first run fails
                result = check(
                    lambda: measure(
                        lambda: TritonControl(canary),
                        "scorer",
                        (private, "3"),
                        "1",
                        {"X": np.zeros(4, dtype=np.float32)},
                        ["Y"],
                        PerfSettings(requests=24),
                    )
                )
                verdicts.append((result.ok, result.line()))
            triton.unload(private)
        assert all(ok for ok, _ in verdicts), verdicts
        result = promote(pair, "scorer", "3")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert result.ok
    [perf] = perf_of(result)
    assert (perf["ok"], perf["serving"]["version"], perf["candidate"]["version"]) == (True, "1", "3")
    markdown = "\n".join(render(json.loads(json.dumps(result.to_dict(), default=str))))  # the PR summary
    assert "Performance check on the canary" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| scorer | v3: p50 "))
    assert f"v1: p50 {perf['serving']['p50_ms']:.1f} ms" in row
    # on a loaded machine the check may measure twice (a first run over its limit, then a pass)
    verdict_cell = row.rstrip(" |").rsplit("|", 1)[1].strip()
    assert re.fullmatch(r"ok( on a second run \(first: slower by [\d.]+ ms at p95\))?", verdict_cell), row
    for url in pair.urls:
        assert pair.ready(url, "scorer") == ["3"], url
    assert pair.registry.models.aliases("scorer")["perf"] == "3"


def test_a_candidate_that_makes_requests_wait_in_the_queue_trips_the_bakes_queue_check(
    pair: FleetStack,
) -> None:
    assert pair.register("queued", QUEUED_CONFIG, scorer("q1")) == "1"
    assert promote(pair, "queued", "1", env="queue", skip_perf=True).ok
    assert pair.register("queued", QUEUED_SLOW_CONFIG, scorer("q2")) == "2"
    before = pair.state()

    def request(triton: TritonControl, rng: np.random.Generator) -> object:
        return triton.infer("queued", {"X": rng.random((1, 4)).astype(np.float32)}, ["Y"])

    with pytest.raises(PromotionFailed) as info:  # no perf check: the bake's own list catches it
        with Traffic(pair.urls, request):
            promote(pair, "queued", "2", env="queue", skip_perf=True)
    message = info.value.message
    assert "tripped on queued v2 (queue_ratio)" in message, message
    found = re.search(r"mean queue time (\d+) us against (\d+) us", message)
    assert found, message
    assert int(found.group(1)) > 100_000, message  # ~0.3 s held, against ~0
    assert message.count("queue_ratio <= 3") == 1
    for url in pair.urls:
        assert pair.ready(url, "queued") == ["1"], url
    assert pair.state() == unloaded_on(before, pair.urls[0], "queued", "2")  # only the canary had it
    assert pair.registry.models.aliases("queued")["queue"] == "1"
