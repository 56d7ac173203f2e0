"""Each kind of failing verdict of issue 49 item 1 -- golden outputs, perf, the shadow replay, each
bake check, memory headroom, the peak-batch request, the runtime gate -- provoked in a whole
promotion of the unit world (tests/unit/worlds.py: the real engine, a real local store, fake
Tritons), whose run is written by MLflow itself: the promotion's registry keeps model versions,
aliases and tags in the registry port's fake (registering the eight versions these promotions need
through MLflow costs ~6 s each here, and the run is what is read back) and sends every write of the
run -- ``start_run``, ``log``, ``log_artifacts``, ``finish_run``, ``link_promotion`` -- to a real
``MlflowRegistry`` on sqlite, the calls ``record_promotion`` makes on every exit.

A unit test never imports MLflow (tests/unit/conftest.py): this module imports it only when run as
a script, beside the suite (tests/component/test_verdicts_mlflow.py ``BACKGROUND``)::

    python -m tests.unit.verdict_kinds

prints one JSON object: per kind, the ``--json`` document ``mlreg promote --json`` printed and the
run as MLflow's own client (``MlflowClient``) reads it back -- status, tags, every
``verdict_*`` metric, and ``verdict.json`` downloaded from the run's artifacts; and the same for
the shadow kind's candidate and captures promoted in an environment observing shadow (``OBSERVED``:
promoted, its record "observed: would have refused").
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from mlreg.cli import promote_render
from mlreg.cli.sink import Output
from pipelines.checks.capture import Shadow
from pipelines.checks.perf import PerfSettings
from pipelines.checks.runtime import RuntimeSettings
from pipelines.core.context import Deployer, Options
from pipelines.core.policy import Check, Policy
from pipelines.core.reports import PromotionFailed
from pipelines.guards import headroom
from pipelines.guards.headroom import FOOTPRINT_KIND_TAG, FOOTPRINT_TAG
from pipelines.promote import runner
from pipelines.promote.environments import Environment
from pipelines.promote.runner import Promotion
from pipelines.rollout.staged import Staged
from pipelines.triton import metrics
from registry.errors import TritonError
from tests.fakes import FakeRegistry, FakeRuns
from tests.unit.trace_files import CONFIG as TRACED
from tests.unit.trace_files import write_honest
from tests.unit.worlds import MEMBER, World

REPLICAS = tuple(f"t{i}:8001" for i in range(4))
BATCHING = MEMBER.replace("max_batch_size: 0", "max_batch_size: 4")
MIB, GIB = 2**20, 2**30
FREE = 1524 * MIB  # each replica's free host memory, as its gauges say
CAPTURED = 80  # production requests the shadow replay judges

# per scrape (cumulative): net v2's success, failure, duration, queue (us); net v1: 10, 0, 1000, 1000
BAKES = {
    "requests": ((1, 0, 100, 0), 10.0),
    "failure_ratio": ((10, 5, 1500, 0), 0.01),
    "latency_ratio": ((10, 0, 3000, 0), 2.0),
    "queue_ratio": ((10, 0, 1000, 30000), 2.0),
    "probe_failure_ratio": ((10, 0, 1000, 0), 0.01),
}
KINDS = ("golden", "perf", "shadow", *(f"bake.{c}" for c in BAKES), "headroom", "peak_batch", "runtime")
OBSERVED = "shadow observed"  # the shadow kind again, in an environment with observe = ["shadow"]


class RunsOfMlflow(FakeRuns):
    """Every write of a run made by ``mlflow`` (a real ``MlflowRegistry``)."""

    def __init__(self, registry: FakeRegistry, mlflow: Any) -> None:
        super().__init__(registry)
        self.mlflow = mlflow

    def experiment_id(self, name: str = "x") -> str:
        return str(self.mlflow.runs.experiment_id(name))

    def start_run(
        self, experiment: str, name: str, tags: dict[str, str], start_time: float | None = None
    ) -> str:
        return str(self.mlflow.runs.start_run(experiment, name, tags, start_time))

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.mlflow.runs.log(run_id, params, metrics)

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        self.mlflow.runs.log_artifacts(run_id, folder, path)

    def finish_run(self, run_id: str, ok: bool) -> None:
        self.mlflow.runs.finish_run(run_id, ok)

    def link_promotion(
        self,
        run_id: str,
        experiment: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        self.mlflow.runs.link_promotion(run_id, experiment, env, outcome, versions, error)


class RunsInMlflow(FakeRegistry):
    """The fake's versions, aliases and tags; every write of a run made by ``mlflow`` (a real
    ``MlflowRegistry``: ``runs``): the promotion's record is MLflow's own."""

    def __init__(self, world: World, mlflow: Any) -> None:
        super().__init__(world.registry.root, world.events)
        self.tags, self.alias_map = world.registry.tags, world.registry.alias_map
        self.mlflow = mlflow
        self.runs = RunsOfMlflow(self, mlflow)


@dataclass
class Case:
    """One promotion to refuse: ``model`` v2 in ``world`` with ``options``; ``deployer`` replaces
    the environment's (the bakes' stand-in counters)."""

    world: World
    model: str = "net"
    options: Options = dataclasses.field(default_factory=Options)
    deployer: Deployer | None = None


# -- the worlds -----------------------------------------------------------------------------------


def deployed(world: World, member: str = MEMBER) -> World:
    """``ens`` v1 serving (over ``pre`` v1 and ``net`` v1); ``net`` v2 registered."""
    world.promote("ens", "1")
    world.registry.add("net", "2", member.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def _wrap_infer(world: World, wrap: Callable[[Any], Callable[..., Any]]) -> None:
    """Every replica's ``infer`` replaced by ``wrap(its infer)``: a model's answers as a test needs them."""
    for url in world.env.targets:
        target = world.fleet.connect(url)
        target.infer = wrap(target.infer)  # type: ignore[method-assign]


def golden(tmp: Path) -> Case:
    world = deployed(World(tmp))
    world.fleet.nan_answers.add(("net", "2"))  # the candidate answers NaN on the golden inputs
    return Case(world)


def perf(tmp: Path) -> Case:
    world = deployed(World(tmp))
    world.env = dataclasses.replace(world.env, perf=PerfSettings(requests=8, seconds=0.2))

    def slower(infer: Any) -> Callable[..., Any]:
        def answer(model: str, inputs: Any, outputs: list[str], version: str = "") -> Any:
            if version == "2":  # the candidate takes 8 ms where the serving version takes none
                time.sleep(0.008)
            return infer(model, inputs, outputs, version)

        return answer

    _wrap_infer(world, slower)
    return Case(world)


def shadow(tmp: Path, observe: tuple[str, ...] = ()) -> Case:
    """``m`` answers sum(x) in production (80 captured requests, in the ``shadow`` kind's folder:
    an environment ``observe`` -ing shadow replays the very captures the enforcing one did); its v2
    answers 5 x that."""
    world = World(tmp)
    world.registry.add("m", "1", TRACED)
    world.promote("m", "1")
    world.registry.add("m", "2", TRACED)
    captures = tmp.parent / "shadow" / "traces"
    if not captures.exists():
        write_honest(captures, CAPTURED)
    world.env = dataclasses.replace(
        world.env, shadow=Shadow(captures=str(captures), count=500), observe=observe
    )

    def scaled(infer: Any) -> Callable[..., Any]:
        def answer(model: str, inputs: Any, outputs: list[str], version: str = "") -> Any:
            if not model.startswith("m"):
                return infer(model, inputs, outputs, version)
            scale = 5.0 if version == "2" else 1.0
            return {"Y": (np.asarray(inputs["X"]).sum(axis=1, keepdims=True) * scale).astype(np.float32)}

        return answer

    _wrap_infer(world, scaled)
    world.events.clear()
    return Case(world, "m")


def _counters(new: tuple[int, int, int, int]) -> Callable[[str], metrics.Snapshot]:
    """Triton's counters as each scrape reads them (the fake Tritons serve no /metrics): growing
    per scrape, net v2 at ``new``'s rates."""
    ticks = itertools.count(1)

    def scrape(url: str) -> metrics.Snapshot:
        t = next(ticks)
        s, f, d, q = new
        return {
            ("net", "2"): metrics.Counters(s * t, f * t, d * t, q * t),
            ("net", "1"): metrics.Counters(10 * t, 0, 1000 * t, 1000 * t),
        }

    return scrape


def _staged_env(world: World, checks: tuple[Check, ...] | None, probe_rate: float) -> None:
    extra = {"checks": checks} if checks else {}
    policy = Policy(canary=1, waves=(50.0, 100.0), bake_seconds=0.3, probe_rate=probe_rate, **extra)
    world.env = Environment("test", str(world.store_root), REPLICAS, "test", gpu=False, policy=policy)


def bake(check: str) -> Callable[[Path], Case]:
    """A staged roll-out whose first bake trips ``check``."""

    def made(tmp: Path) -> Case:
        world = World(tmp)
        _staged_env(world, (Check("queue_ratio", max=2.0),) if check == "queue_ratio" else None, 0.0)
        world = deployed(world)
        new, _ = BAKES[check]
        if check == "probe_failure_ratio":  # the new version fails every request mlreg's probes send
            _staged_env(world, None, 40.0)

            def failing(infer: Any) -> Callable[..., Any]:
                def answer(model: str, inputs: Any, outputs: list[str], version: str = "") -> Any:
                    if (model, version) == ("net", "2"):
                        raise TritonError(f"{model} v2 failed")
                    return infer(model, inputs, outputs, version)

                return answer

            _wrap_infer(world, failing)
        assert world.env.policy is not None
        deployer = Staged(world.env.policy, scrape=_counters(new))
        return Case(world, options=Options(skip_quality=True), deployer=deployer)

    return made


@contextlib.contextmanager
def gauges() -> Iterator[Callable[[str], str]]:
    """Each replica's Triton memory gauges over real HTTP: 8 GiB, 1,524 MiB free."""
    body = f"nv_cpu_memory_total_bytes {8 * GIB}\nnv_cpu_memory_used_bytes {8 * GIB - FREE}\n".encode()

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
    try:
        yield lambda url: f"http://127.0.0.1:{server.server_address[1]}/{url.split(':')[0]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def memory(served: Callable[[str], str]) -> Callable[[Path], Case]:
    """``net`` v2's recorded footprint (2 GiB, x memory_margin 1.2) beyond every replica's free memory."""

    def made(tmp: Path) -> Case:
        world = deployed(World(tmp))
        urls = tuple((u, served(u)) for u in world.env.targets)
        world.env = dataclasses.replace(world.env, metrics_urls=urls)
        world.registry.tags[("net", "2")] |= {FOOTPRINT_TAG: str(2 * GIB), FOOTPRINT_KIND_TAG: "host"}
        return Case(world, options=Options(skip_quality=True))

    return made


def peak_batch(tmp: Path) -> Case:
    """``solo`` (max_batch_size 4): its v2 fails a full batch."""
    world = World(tmp)
    world.registry.add("solo", "1", BATCHING.format(name="solo", src="IN", dst="OUT"))
    world.promote("solo", "1")
    world.registry.add("solo", "2", BATCHING.format(name="solo", src="IN", dst="OUT"))

    def at_peak(infer: Any) -> Callable[..., Any]:
        def answer(model: str, inputs: Any, outputs: list[str], version: str = "") -> Any:
            # a fault a stand-in cannot reach otherwise: the model fails only at a full batch
            if (model, version) == ("solo", "2") and next(iter(inputs.values())).shape[0] > 1:
                raise TritonError("Failed to process the request(s) for model 'solo', batch of 4")
            return infer(model, inputs, outputs, version)

        return answer

    _wrap_infer(world, at_peak)
    world.events.clear()
    return Case(world, "solo", Options(skip_quality=True))


def runtime(tmp: Path) -> Case:
    """Every replica runs Triton 2.51.0 (the fakes' ServerMetadata): known hazards, refused."""
    world = deployed(World(tmp))
    world.env = dataclasses.replace(world.env, checks=(("runtime", RuntimeSettings(policy="refuse")),))
    return Case(world)


# -- the promotion, and its run read back through MLflow's client ---------------------------------


def promote(case: Case, mlflow: Any, refused: bool = True) -> dict[str, Any]:
    """``case`` promoted as ``mlreg promote --json`` does it (``refused``: as it must end), its run
    recorded in ``mlflow``: the document printed, the error, and the run as MLflow's client reads
    it back."""
    registry = RunsInMlflow(case.world, mlflow)
    promotion = Promotion(
        case.world.settings, case.world.env, registry, case.options, connect=case.world.fleet.connect
    )
    printed, out, error = io.StringIO(), Output(True), ""
    chosen = runner.choose_deployer
    if case.deployer is not None:
        runner.choose_deployer = lambda env: case.deployer  # type: ignore[assignment,return-value]
    try:
        with contextlib.redirect_stdout(printed):
            result = promote_render.promotion(out, lambda: promotion.run(case.model, "2"))
            promote_render.render(out, result, case.world.env.alias)
    except PromotionFailed as exc:
        error, run_id = exc.message, exc.result.run_id
    else:
        run_id = result.run_id
    finally:
        runner.choose_deployer = chosen
    if bool(error) is not refused:
        must = "refused" if refused else "promoted"
        raise AssertionError(f"{case.model} v2: {error or 'promoted'}, where it must be {must}")
    serving = {url: t.model_states().get(case.model) for url, t in case.world.fleet.targets.items()}
    return {
        "document": json.loads(printed.getvalue()),
        "error": error,
        "run": read_run(mlflow, run_id),
        "serving": serving,  # each replica's versions of the model after the promotion
        "alias": case.world.registry.models.aliases(case.model).get(case.world.env.alias),
    }


def read_run(mlflow: Any, run_id: str) -> dict[str, Any]:
    """The run ``run_id`` as MLflow's own client (``MlflowClient``) returns it."""
    client = mlflow.connection.client
    run = client.get_run(run_id)
    artifacts = sorted(a.path for a in client.list_artifacts(run_id))
    kept = None
    if "verdict.json" in artifacts:
        with tempfile.TemporaryDirectory() as tmp:
            kept = json.loads(Path(client.download_artifacts(run_id, "verdict.json", tmp)).read_text())
    return {
        "id": run_id,
        "status": run.info.status,
        "tags": dict(run.data.tags),
        "metrics": {k: v for k, v in run.data.metrics.items() if k.startswith("verdict_")},
        "artifacts": artifacts,
        "verdict.json": kept,
    }


def main() -> None:
    from registry.mlflow import MlflowRegistry
    from registry.settings import Settings

    home = Path.cwd() / "home"
    mlflow = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(home)}))
    headroom.METRICS_INTERVAL = 0.05  # the guard's gauge polling: no need to wait between reads
    found: dict[str, Any] = {}
    with gauges() as served:
        makers: dict[str, Callable[[Path], Case]] = {
            "golden": golden,
            "perf": perf,
            "shadow": shadow,
            **{f"bake.{c}": bake(c) for c in BAKES},
            "headroom": memory(served),
            "peak_batch": peak_batch,
            "runtime": runtime,
        }
        for kind in KINDS:
            folder = Path.cwd() / kind
            folder.mkdir()
            try:
                found[kind] = promote(makers[kind](folder), mlflow)
            except Exception:  # one kind's failure is reported with its traceback; the others still run
                found[kind] = {"crash": traceback.format_exc()}
        try:  # the shadow kind's candidate and captures, in an environment observing shadow: promoted
            (Path.cwd() / OBSERVED).mkdir()
            found[OBSERVED] = promote(shadow(Path.cwd() / OBSERVED, ("shadow",)), mlflow, refused=False)
        except Exception:
            found[OBSERVED] = {"crash": traceback.format_exc()}
    sys.stdout.write(json.dumps(found, default=str) + "\n")


if __name__ == "__main__":
    main()
