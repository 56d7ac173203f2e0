"""Issue 49 item 1 and 5: one verdict per promotion, on every exit.  Each kind of failure -- golden
outputs, perf, the runtime gate, each bake check, memory headroom, the peak-batch request -- is read
back from what the user gets: the ``--json`` document (``mlreg.cli.promote_render.promotion``, as
``mlreg promote --json`` prints it) and the promotion's run (``verdict.json`` and one metric per
figure, as ``record_promotion`` logs them through the registry port): value, threshold, sample size,
result and fix, the same in both; the first enforced refusal is the promotion's ``reason``.  A
refusal before anything changed and a real SIGTERM inside the promotion leave ``verdict.json`` too;
an abort records its time to safe (detection -> every replica back).

The world of tests/unit/worlds.py: a real local store, fake Tritons, the registry port's fake
(a fast test never imports MLflow: tests/unit/conftest.py); the bake reads Triton's counters from a
stand-in ``scrape`` (the fake Tritons serve no /metrics), the headroom guard real HTTP pages.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.cli import promote_render, report
from mlreg.cli.markdown import cell
from mlreg.cli.signals import sigterm_raises
from mlreg.cli.sink import Output
from mlreg.cli.verdict_lines import figure
from pipelines.checks.capture import Shadow
from pipelines.checks.perf import PerfSettings
from pipelines.checks.runtime import RuntimeSettings
from pipelines.core.check import Verdict
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.policy import Check, Policy
from pipelines.core.reports import PromotionFailed, PromotionResult
from pipelines.guards import headroom
from pipelines.guards.headroom import FOOTPRINT_KIND_TAG, FOOTPRINT_TAG
from pipelines.promote import runner, verdicts
from pipelines.promote.environments import Environment
from pipelines.promote.runner import Promotion
from pipelines.rollout.staged import Staged
from pipelines.triton import metrics
from registry.errors import TritonError
from tests.fakes import Call, FakeTarget
from tests.unit.trace_files import CONFIG as TRACED
from tests.unit.trace_files import write_honest
from tests.unit.worlds import MEMBER, World

REPLICAS = tuple(f"t{i}:8001" for i in range(4))
BATCHING = MEMBER.replace("max_batch_size: 0", "max_batch_size: 4")


def _deployed(world: World, member: str = MEMBER) -> World:
    world.promote("ens", "1")
    world.registry.add("net", "2", member.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    world.fleet.loads = 0
    return world


def _refused(
    world: World, capsys: pytest.CaptureFixture[str], options: Options | None = None, model: str = "net"
) -> tuple[PromotionFailed, dict[str, Any], dict[str, Any]]:
    """``model`` v2 promoted as ``mlreg promote --json`` does it, refused: the error, the JSON
    document printed, and the run the attempt was recorded as."""
    capsys.readouterr()
    promotion = Promotion(
        world.settings, world.env, world.registry, options or Options(), connect=world.fleet.connect
    )
    with pytest.raises(PromotionFailed) as info:
        promote_render.promotion(Output(True), lambda: promotion.run(model, "2"))
    document = json.loads(capsys.readouterr().out)
    return info.value, document, world.registry.recorded[-1]


def _record(name: str, document: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The refusing record ``name`` in --json, the same in the run's verdict.json, its figures in
    the run's metrics, and its line the promotion's reason."""
    [found] = [v for v in document["verdicts"] if v["name"] == name and v["result"] == "fail"]
    kept = json.loads(run["artifacts"]["verdict.json"])
    assert found in kept  # verdict.json holds the record --json printed, figure for figure
    assert kept == document["verdicts"]
    assert run["ok"] is False
    assert run["tags"]["result"] in ("refused", "rolled back")
    model = found["subject"].split(" ")[0]
    for what in ("value", "threshold", "sample"):
        if found[what] is not None:
            assert run["metrics"][f"verdict_{name}_{model}_{what}"] == pytest.approx(found[what])
    assert found["refuses"] is True
    assert found["fix"]
    assert document["reason"] == verdicts_line(found)  # the first enforced refusal
    assert document["reason"].startswith(f"{name} {found['subject']}: fail")
    return found


def _markdown(document: dict[str, Any], found: dict[str, Any]) -> None:
    """``mlreg report --markdown`` of the --json document: the record's row (name | measured |
    value | threshold | sample | result | fix), the reason, and the time to safe."""
    lines = report.render(document)
    figures = [
        figure(found["value"]),
        figure(found["threshold"]),
        str(found["sample"]),
        "fail",
        cell(found["fix"]),
    ]
    row = (
        "| "
        + " | ".join([cell(found["name"]), cell(f"{found['subject']}: {found['measured']}"), *figures])
        + " |"
    )
    assert row in lines
    assert f"**Reason:** {cell(document['reason'])}" in lines
    assert any(line.startswith("Time to safe: every replica back") for line in lines)


def verdicts_line(found: dict[str, Any]) -> str:
    names = {f.name for f in dataclasses.fields(Verdict)}
    given = {k: v for k, v in found.items() if k in names}
    return Verdict(
        **given | {"replicas": tuple(given["replicas"]), "findings": tuple(given["findings"])}
    ).line()


# -- the gate's checks --------------------------------------------------------------------------


def test_golden_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = _deployed(World(tmp_path))
    world.fleet.nan_answers.add(("net", "2"))  # the candidate answers NaN on the golden inputs
    error, document, run = _refused(world, capsys)
    found = _record("golden", document, run)
    assert (found["value"], found["threshold"], found["sample"]) == (1.0, 0.0, 1)  # one output wrong
    assert "expect_column_values_to_not_be_null" in found["why"]
    assert found["fix"].startswith("fix the model")
    # the runtime gate ran before it, noted (observed): recorded, never the reason
    [runtime] = [v for v in document["verdicts"] if v["name"] == "runtime"]
    assert runtime["observed"] is True
    assert runtime["refuses"] is False
    assert [v["result"] for v in document["verdicts"] if v["name"] in ("shadow", "perf")] == ["skipped"] * 2
    assert document["outcome"] == "refused"
    assert "nothing was changed" in error.message
    assert serving_versions(world.config("net") or "") == ["1"]  # the store's config: net v1 serves


def test_perf_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = _deployed(World(tmp_path))
    world.env = dataclasses.replace(world.env, perf=PerfSettings(requests=8, seconds=0.2))
    answer = world.fleet.answer

    def slower(model: str, version: str) -> float:
        if version == "2":  # the candidate takes 8 ms where the serving version takes none
            time.sleep(0.008)
        return answer(model, version)

    for target in world.fleet.targets.values():
        target.answer = slower
    world.fleet.answer = slower  # type: ignore[method-assign]
    _, document, run = _refused(world, capsys)
    found = _record("perf", document, run)
    assert found["value"] > found["threshold"] >= 1.25  # the p95 ratio above its limit
    assert found["sample"] >= 2 * 4  # both sides' latencies, at least the floor's requests
    assert found["noise_floor"] is None or found["noise_floor"] >= 0
    assert "slower" in found["why"]


def test_runtime_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = _deployed(World(tmp_path))
    world.env = dataclasses.replace(world.env, checks=(("runtime", RuntimeSettings(policy="refuse")),))
    _, document, run = _refused(world, capsys)
    [found] = [v for v in document["verdicts"] if v["name"] == "runtime" and v["refuses"]]
    kept = json.loads(run["artifacts"]["verdict.json"])
    assert found in kept
    assert kept == document["verdicts"]
    assert "2.51.0" in found["why"]
    assert "Triton >=" in found["fix"]
    assert found["replicas"] == ["t0:8001", "t1:8001"]  # the preflight: every replica, before any load
    assert document["reason"] == verdicts_line(found)
    # the release's known hazards counted (one finding each), none allowed; both replicas judged
    assert (found["value"], found["threshold"], found["sample"]) == (float(len(found["findings"])), 0.0, 2)
    assert found["value"] >= 1
    assert [v["name"] for v in document["verdicts"] if v["name"] == "golden"] == []  # no gate ran


def test_shadow_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``m`` answers sum(x) in production (80 captured requests); its v2 answers 5 x that."""
    world = World(tmp_path)
    world.registry.add("m", "1", TRACED)
    world.promote("m", "1")
    world.registry.add("m", "2", TRACED)
    write_honest(tmp_path / "traces", 80)
    world.env = dataclasses.replace(world.env, shadow=Shadow(captures=str(tmp_path / "traces"), count=500))
    for url in world.env.targets:
        target = world.fleet.connect(url)
        infer = target.infer

        def scaled(model: str, inputs: Any, outputs: list[str], version: str = "", _i: Any = infer) -> Any:
            if not model.startswith("m"):
                return _i(model, inputs, outputs, version)
            scale = 5.0 if version == "2" else 1.0
            return {"Y": (np.asarray(inputs["X"]).sum(axis=1, keepdims=True) * scale).astype(np.float32)}

        target.infer = scaled  # type: ignore[method-assign]
    _, document, run = _refused(world, capsys, model="m")
    found = _record("shadow", document, run)
    assert (found["value"], found["sample"], found["noise_floor"]) == (
        80.0,
        80,
        0.0,
    )  # every request diverged
    assert found["threshold"] == pytest.approx(0.4)  # max_divergence 0.5 % of 80 requests above the floor
    assert "diverged from serving v1 on 80 of 80" in found["why"]
    assert document["outcome"] == "refused"


# -- the bake's checks --------------------------------------------------------------------------

# per scrape (cumulative): net v2's success, failure, duration, queue (us); net v1: 10, 0, 1000, 1000
BAKES = {
    "requests": ((1, 0, 100, 0), 10.0),
    "failure_ratio": ((10, 5, 1500, 0), 0.01),
    "latency_ratio": ((10, 0, 3000, 0), 2.0),
    "queue_ratio": ((10, 0, 1000, 30000), 2.0),
    "probe_failure_ratio": ((10, 0, 1000, 0), 0.01),
}


def _staged(world: World, checks: tuple[Check, ...] | None, probe_rate: float) -> None:
    extra = {"checks": checks} if checks else {}
    policy = Policy(canary=1, waves=(50.0, 100.0), bake_seconds=0.3, probe_rate=probe_rate, **extra)
    world.env = Environment("test", str(world.store_root), REPLICAS, "test", gpu=False, policy=policy)


def _counters(new: tuple[int, int, int, int]) -> Callable[[str], metrics.Snapshot]:
    """Triton's counters as each scrape reads them: growing per scrape, net v2 at ``new``'s rates."""
    ticks = itertools.count(1)

    def scrape(url: str) -> metrics.Snapshot:
        t = next(ticks)
        s, f, d, q = new
        return {
            ("net", "2"): metrics.Counters(s * t, f * t, d * t, q * t),
            ("net", "1"): metrics.Counters(10 * t, 0, 1000 * t, 1000 * t),
        }

    return scrape


def _failing_v2(world: World) -> None:
    """The new version fails every request mlreg's probes send it (their counters, not Triton's)."""
    for url in REPLICAS:
        target = world.fleet.connect(url)
        infer = target.infer

        def failing(model: str, inputs: Any, outputs: list[str], version: str = "", _i: Any = infer) -> Any:
            if (model, version) == ("net", "2"):
                raise TritonError(f"{model} v2 failed")
            return _i(model, inputs, outputs, version)

        target.infer = failing  # type: ignore[method-assign]


@pytest.mark.parametrize("check", sorted(BAKES))
def test_each_bake_check_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    world = World(tmp_path)
    _staged(world, (Check("queue_ratio", max=2.0),) if check == "queue_ratio" else None, 0.0)
    world = _deployed(world)
    new, limit = BAKES[check]
    if check == "probe_failure_ratio":
        _staged(world, None, 40.0)
        _failing_v2(world)
    monkeypatch.setattr(runner, "choose_deployer", lambda env: Staged(env.policy, scrape=_counters(new)))
    error, document, run = _refused(world, capsys, Options(skip_quality=True))
    found = _record(f"bake.{check}", document, run)
    assert found["threshold"] == limit
    assert found["value"] is not None
    assert found["value"] < limit if check == "requests" else found["value"] > limit
    assert found["sample"] == found["value"] if check == "requests" else found["sample"] > 0
    assert found["window"].startswith("bake 1 of the roll-out (0.3 s)")
    assert found["fix"].startswith("fix the model and register a new version")
    assert f"({check})" in error.message  # the bake's own error names the same check
    # an abort: the time to safe, detection -> every touched replica back
    assert document["outcome"] == "rolled back"
    safe = document["time_to_safe"]
    assert 0 <= safe["whole_fleet_seconds"] < 60  # from detection: the rollback of one replica
    assert safe["not_back"] == []
    assert set(safe["replicas"]) == {"t0:8001"}
    assert safe["whole_fleet_seconds"] == max(safe["replicas"].values()) >= safe["p95_replica_seconds"] >= 0
    _markdown(document, found)
    [record] = [v for v in document["verdicts"] if v["name"] == "time_to_safe"]
    assert (record["result"], record["value"], record["sample"]) == ("pass", safe["whole_fleet_seconds"], 1)
    assert all(t.model_states()["net"] == {"1": "READY"} for t in world.fleet.targets.values())


# -- the load guards --------------------------------------------------------------------------

MIB, GIB = 2**20, 2**30
HOST = """nv_cpu_memory_total_bytes {total}
nv_cpu_memory_used_bytes {used}
"""


@pytest.fixture
def gauges() -> Iterator[Callable[[str], str]]:
    """Each replica's Triton memory gauges over real HTTP: 8 GiB, 7 GiB - 500 MiB used (1,524 MiB free)."""
    body = HOST.format(total=8 * GIB, used=7 * GIB - 500 * MIB).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield lambda url: f"http://127.0.0.1:{server.server_address[1]}/{url.split(':')[0]}/metrics"
    server.shutdown()
    server.server_close()


def test_a_headroom_refusal_before_any_change_is_recorded_in_json_and_the_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    gauges: Callable[[str], str],
) -> None:
    monkeypatch.setattr(headroom, "METRICS_INTERVAL", 0.05)
    world = _deployed(World(tmp_path))
    world.env = dataclasses.replace(world.env, metrics_urls=tuple((u, gauges(u)) for u in world.env.targets))
    world.registry.tags[("net", "2")] |= {FOOTPRINT_TAG: str(2 * GIB), FOOTPRINT_KIND_TAG: "host"}
    error, document, run = _refused(world, capsys, Options(skip_quality=True))
    found = _record("headroom", document, run)
    assert found["value"] == 1524 * MIB  # free on the first replica
    assert found["threshold"] == pytest.approx(2 * GIB * 1.2, abs=1)  # footprint x memory_margin
    assert (found["sample"], found["replicas"]) == (1, ["t0:8001"])
    assert "memory_margin" in found["fix"]
    assert "not enough memory" in found["why"]
    # refused before any load was sent: the store's config written before it is put back
    assert world.loads() == []
    assert serving_versions(world.config("net") or "") == ["1"]
    assert document["time_to_safe"]["replicas"] == {}
    assert error.result.run_id == "run-2"


def test_a_refusal_before_any_change_leaves_verdict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan's contract check refuses net v2 (it batches, the ensemble over it does not) in
    validate, before any live stage: nothing changed, and the attempt's verdict is recorded."""
    world = _deployed(World(tmp_path), BATCHING)
    error, document, run = _refused(world, capsys, Options(skip_quality=True))
    assert document["outcome"] == "refused"
    assert "nothing was changed" in error.message
    assert document["reason"] == "contract check failed:"  # no check refused: the error's first line
    assert document["time_to_safe"] is None
    assert world.loads() == []
    kept = json.loads(run["artifacts"]["verdict.json"])
    assert kept == document["verdicts"]
    assert not any(v["refuses"] for v in kept)


def _solo(world: World) -> World:
    """``solo``: a model of its own that batches (max_batch_size 4), v1 serving, v2 registered."""
    world.registry.add("solo", "1", BATCHING.format(name="solo", src="IN", dst="OUT"))
    world.promote("solo", "1")
    world.registry.add("solo", "2", BATCHING.format(name="solo", src="IN", dst="OUT"))
    world.events.clear()
    return world


def test_a_peak_batch_failure_is_recorded_in_json_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = _solo(World(tmp_path))
    for url in world.env.targets:
        target = world.fleet.connect(url)
        infer = target.infer

        def at_peak(model: str, inputs: Any, outputs: list[str], version: str = "", _i: Any = infer) -> Any:
            # a fault a stand-in cannot reach otherwise: the model fails only at a full batch
            if (model, version) == ("solo", "2") and next(iter(inputs.values())).shape[0] > 1:
                raise TritonError("Failed to process the request(s) for model 'solo', batch of 4")
            return _i(model, inputs, outputs, version)

        target.infer = at_peak  # type: ignore[method-assign]
    error, document, run = _refused(world, capsys, Options(skip_quality=True), model="solo")
    found = _record("peak_batch", document, run)
    assert (found["value"], found["threshold"], found["sample"]) == (0.0, 4.0, 1)
    assert "max_batch_size 4" in found["fix"]
    assert "batch of 4" in found["why"]
    assert document["outcome"] == "rolled back"
    assert document["time_to_safe"]["not_back"] == []
    assert "fails at its peak batch of 4" in error.message
    assert all(t.model_states()["solo"] == {"1": "READY"} for t in world.fleet.targets.values())


def test_a_promotion_that_passes_records_every_verdict_and_no_reason(tmp_path: Path) -> None:
    world = _solo(World(tmp_path))
    result = world.promote("solo", "2")
    document = result.to_dict()
    assert document["reason"] == ""
    assert document["time_to_safe"] is None
    [peak] = [v for v in document["verdicts"] if v["name"] == "peak_batch"]
    assert (peak["result"], peak["sample"], sorted(peak["replicas"])) == ("pass", 2, ["t0:8001", "t1:8001"])
    assert (peak["value"], peak["threshold"]) == (4.0, 4.0)
    assert json.loads(world.registry.recorded[-1]["artifacts"]["verdict.json"]) == document["verdicts"]


# -- signals --------------------------------------------------------------------------------------


@pytest.fixture
def unraised() -> Iterator[list[int]]:
    seen: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: seen.append(signum)) for sig in (1, 3, 15)}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_real_sigterm_inside_the_promotion_leaves_verdict_json_with_its_time_to_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unraised: list[int]
) -> None:
    world = _deployed(World(tmp_path))
    handle = world.fleet.handle

    def signalling(target: FakeTarget, call: Call) -> None:
        handle(target, call)
        if call.method == "load" and world.fleet.loads == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    for target in world.fleet.targets.values():
        target.handler = signalling
    with sigterm_raises():
        error, document, run = _refused(world, capsys, Options(skip_quality=True))
    assert error.exit_code == 143
    assert unraised == []
    assert document["reason"] == "interrupted (SIGTERM)"  # no check refused: the error's first line
    kept = json.loads(run["artifacts"]["verdict.json"])
    assert kept == document["verdicts"]
    [safe] = [v for v in kept if v["name"] == "time_to_safe"]
    assert safe["result"] == "pass"
    assert set(safe["replicas"]) == set(document["time_to_safe"]["replicas"])
    assert safe["sample"] == len(safe["replicas"]) >= 1
    assert all(t.model_states()["net"] == {"1": "READY"} for t in world.fleet.targets.values())


# -- the record's parts -----------------------------------------------------------------------


def test_time_to_safe_is_detection_to_each_replica_back_and_names_one_not_back() -> None:
    found = verdicts.time_to_safe(100.0, ["a", "b", "c"], {"a": 101.0, "b": 103.5, "c": 99.0})
    assert found["replicas"] == {"a": 1.0, "b": 3.5}  # c's restore finished before: not this one's
    assert found["not_back"] == ["c"]
    assert found["whole_fleet_seconds"] is None
    every = verdicts.time_to_safe(
        100.0, [f"r{i}" for i in range(20)], {f"r{i}": 100.0 + i for i in range(20)}
    )
    assert (every["p95_replica_seconds"], every["whole_fleet_seconds"]) == (18.0, 19.0)


def test_completing_the_verdict_twice_adds_nothing_twice(tmp_path: Path) -> None:
    world = _solo(World(tmp_path))
    result: PromotionResult = world.promote("solo", "2")
    once = list(result.verdicts)
    verdicts.complete(result)
    verdicts.complete(result)
    assert result.verdicts == once
    assert np.isfinite([v["value"] for v in once if v["value"] is not None]).all()


def test_analysis_check_prints_each_bake_check_as_the_promotions_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``mlreg analysis check``: each bake check in the verdict's shape, the same records a
    promotion's bake keeps (``bake.Analysis.verdicts``)."""
    from mlreg.cli.analysis import _human
    from pipelines.checks import bake

    old, new = metrics.Counters(100, 0, 10_000), metrics.Counters(40, 20, 6_000)
    policy = Policy()
    checks = [bake._check(c, old, new) for c in policy.checks]
    analysis = bake.Analysis(
        "prod", "net", "2", ["1"], ["t0:8001"], 0.0, False, "failure_ratio", "x", checks, new
    )
    _human(Output(), analysis)
    out = capsys.readouterr().out
    [failed] = [v for v in analysis.verdicts() if v.result == "fail"]
    assert failed.name == "bake.failure_ratio"
    assert failed.value == pytest.approx(1 / 3)
    row = next(line for line in out.splitlines() if line.startswith("bake.failure_ratio"))
    for text in (f"{failed.value:g}", f"{failed.threshold:g}", "60", "fail", failed.fix):
        assert text in row
