"""The shadow replay's performance targets (issue 35), each beside its baseline, in one run.

Real tritonservers (the nvidia-pytriton wheel's 2.51, capture through Triton's trace extension) and
``classifier``, the python model of tests/integration/test_shadow.py (``[1, 4]`` in, ``[1, 3]``
scores out, top-1 compared; its planted variant flips the answer where input 3 is above 0.97, on
about 3 % of random requests).  Three parts, in this order:

1. **cost on production** -- one server holding ``classifier`` v1; a steady client loop (batch 1,
   closed loop, pinned to v1) in interleaved blocks (ABAB..., ``--blocks`` of ``--requests`` each
   side, after a warm-up block): capture **off** (``trace_level OFF``) vs capture **on** at the
   default rate (``Shadow()``: one request in 1000, ``trace_count`` 1000000 so it never runs out);
   client-side p95 (and p50) of each side pooled over its blocks, and the ratio (target <= 1.05x).  For
   information, a third side interleaved with them: every request captured (rate 1, what the
   integration tests use).  Then the same comparison **paired**, which a busy machine's load swings
   (they last longer than a request) cannot tilt: two identical models on the same server
   (``twin_a``, ``twin_b``), one capturing at rate 1000 and one not, asked in turn request by request,
   their roles swapped every 1000 pairs (2 x ``--blocks`` stints, ``--requests`` / 2 pairs each).
2. **detection** -- the same server with v1 (serving), v2 (planted) and v3 (identical, another
   comment) loaded by one config naming the three versions; the replay driven **directly** through
   ``replay_step`` (what the quality gate calls; not a full promotion).  Each of ``--runs`` runs:
   trace files deleted, capture armed again (rate 1, count 500), 500 requests of a client loop with
   a new seed to v1, then the replay of those captures to v2 (must be refused) and to v3 (must pass).
   **Two processes spin on the cores** (``python -c "while True: pass"``) for every run.  Reported:
   planted divergences detected X/N (target >= 95 %), false refusals of the identical candidate
   Y/N (target 0), and the mean of the requests judged and of the planted share.
3. **cost on the promotion** -- a second server and an MLflow registry as tests/integration's
   ``Shadows`` builds them (environment ``shadow``: ``rate = 1``, ``count = 500``), an unpinned client
   loop (``Clients``, ~300 requests/s) running throughout; ``--rounds`` rounds, each promoting a new
   identical candidate ``Promotion(...).run`` (``Options(skip_perf=True)``) once with the shadow
   replay of the 500 captures of the serving version and once with ``skip_shadow=True``, in
   alternating order; before each promotion the benchmark waits for 500 captures of the version
   serving then.  Reported: median promotion seconds each way, the difference (target: the replay
   adds <= 3 s), the replay's own ``result.shadow[0]["seconds"]`` (median), the difference stage by
   stage (``result.stages``: the replay is in ``quality``, its table and plot in ``record``), and
   what one reading of the captures folder takes with the files there (``read_captures`` parses
   every trace file under it, whatever model or version they hold: that grows with the folder).

Figures on stdout, one a line (``<label>  <number> <unit>``); per-block and per-run values on stderr.

    timeout 900 .venv/bin/python benchmarks/shadow.py [--runs 20] [--blocks 6] [--requests 2000]
    .venv/bin/python benchmarks/shadow.py --quick      # a smoke run: 3 runs, 2 blocks, 1 round
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLREG_CONTROL_KEY", "mlreg-benchmark-shadow-" + os.urandom(8).hex())

from pipelines.checks.capture import OFF, Shadow, purge  # noqa: E402
from pipelines.checks.replay import ShadowResult  # noqa: E402
from pipelines.checks.shadow import replay_step  # noqa: E402
from pipelines.core.plan import Role, Step  # noqa: E402
from pipelines.devstack import local_triton  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402

# tests/integration's model and helpers, imported by name: a mypy run on this file would otherwise
# follow them into mlreg/, whose ``from registry import`` it resolves to benchmarks/registry.py
SHADOW_TESTS: Any = importlib.import_module("tests.integration.test_shadow")
STACKS: Any = importlib.import_module("tests.integration.stacks")
CLASSIFIER: str = SHADOW_TESTS.CLASSIFIER
CLASSIFIER_CONFIG: str = SHADOW_TESTS.CLASSIFIER_CONFIG
Clients = SHADOW_TESTS.Clients
stack_settings = STACKS.stack_settings

MODEL = "classifier"
CAPTURED = 500  # requests captured per run (trace_count), replayed to each candidate
THREE = CLASSIFIER_CONFIG + "version_policy { specific { versions: [ 1, 2, 3 ] } }\n"
TWINS = ("twin_a", "twin_b")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def trace_files(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def wait_files(folder: Path, least: int, timeout: float = 60.0) -> int:
    """Triton writes one file per trace (log_frequency 1) once the request is done: wait for them."""
    deadline = time.monotonic() + timeout
    while (found := trace_files(folder)) < least and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


class Client:
    """A client as production has them: gRPC, batch 1, request ids ``c<n>``, seeded random inputs;
    ``version`` pins it (the detection server holds three versions of the model)."""

    def __init__(self, url: str, version: str = "1", model: str = MODEL) -> None:
        import tritonclient.grpc as grpcclient

        self.grpc, self.version, self.model = grpcclient, version, model
        self.client = grpcclient.InferenceServerClient(url)
        self.sent = 0
        self.inputs: list[np.ndarray] = []  # what the last ``send`` sent

    def send(self, count: int, rng: np.random.Generator) -> list[float]:
        """``count`` requests one after the other; each one's latency in ms."""
        times, self.inputs = [], []
        for _ in range(count):
            x = rng.random((1, 4), dtype=np.float32)
            self.inputs.append(x)
            tensor = self.grpc.InferInput("X", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            began = time.perf_counter()
            self.client.infer(self.model, [tensor], model_version=self.version, request_id=f"c{self.sent}")
            times.append((time.perf_counter() - began) * 1000)
            self.sent += 1
        return times

    def close(self) -> None:
        self.client.close()


@contextmanager
def server(root: Path, name: str) -> Iterator[tuple[str, Path]]:
    """A tritonserver on its own store (``root/<name>-store``); its gRPC URL and its traces folder."""
    settings, _ = stack_settings(root)
    store = root / f"{name}-store"
    store.mkdir(parents=True, exist_ok=True)
    key = os.environ["MLREG_CONTROL_KEY"]
    state = root / name
    info, process = local_triton.start_server(store, state, settings.backends_source, control_key=key)
    try:
        yield info.grpc_url, state / local_triton.TRACES
    finally:
        local_triton.stop_pid(info.pid, info.shm_prefix, process=process)


@contextmanager
def spinners(count: int) -> Iterator[None]:
    """``count`` processes spinning on the cores, each killed (by its pid) on the way out."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def repository(root: Path) -> None:
    """``classifier`` v1 (serving), v2 (planted) and v3 (identical, another comment) in one folder;
    ``twin_a`` and ``twin_b``: v1's code under two other names (the paired latency measurement)."""
    store = root / "detect-store"
    sources = {
        "1": CLASSIFIER.format(planted=False),
        "2": CLASSIFIER.format(planted=True),
        "3": f"# identical\n{CLASSIFIER.format(planted=False)}",
    }
    for version, source in sources.items():
        (store / MODEL / version).mkdir(parents=True)
        (store / MODEL / version / "model.py").write_text(source)
    (store / MODEL / "config.pbtxt").write_text(THREE)
    for twin in TWINS:
        (store / twin / "1").mkdir(parents=True)
        (store / twin / "1" / "model.py").write_text(sources["1"])
        (store / twin / "config.pbtxt").write_text(CLASSIFIER_CONFIG.replace(f'"{MODEL}"', f'"{twin}"'))


def p95(times: list[float]) -> float:
    return float(np.percentile(times, 95))


# -- 1. cost on production ----------------------------------------------------------------------------


def production_cost(url: str, traces: Path, blocks: int, requests: int) -> dict[str, Any]:
    sides = {
        "off": dict(OFF),
        "on": Shadow(count=1_000_000).trace_settings(),
        "rate1": Shadow(rate=1, count=1_000_000).trace_settings(),
    }
    times: dict[str, list[float]] = {side: [] for side in sides}
    client, rng = Client(url), np.random.default_rng(35)
    try:
        with TritonControl(url) as triton:
            triton.trace_settings(MODEL, OFF)
            client.send(requests // 2, rng)  # warm-up, not counted
            for block in range(blocks):
                order = list(sides) if block % 2 == 0 else list(reversed(sides))
                for side in order:
                    triton.trace_settings(MODEL, sides[side])
                    got = client.send(requests, rng)
                    times[side] += got
                    say(f"block {block} {side:>5}: p50 {np.median(got):.3f} ms, p95 {p95(got):.3f} ms")
            triton.trace_settings(MODEL, OFF)
    finally:
        client.close()
    files = trace_files(traces)
    purge(str(traces))
    return {
        "p95": {side: p95(t) for side, t in times.items()},
        "p50": {side: float(np.median(t)) for side, t in times.items()},
        "files": files,
    }


def paired_cost(url: str, traces: Path, stints: int, pairs: int) -> dict[str, float]:
    """Capture off vs on (rate 1000) alternating request by request between two identical models of
    the same server: a swing of the machine's load weighs on both alike.  ``stints`` stints of
    ``pairs`` pairs, the twins swapping roles each stint (so neither twin's own speed, nor which is
    asked first, weighs on one side); a stint of 1000 requests or more captures one in 1000."""
    on = Shadow(count=1_000_000).trace_settings()
    times: dict[str, list[float]] = {"off": [], "on": []}
    rng = np.random.default_rng(36)
    clients = [Client(url, "1", twin) for twin in TWINS]
    try:
        with TritonControl(url) as triton:
            for client in clients:
                client.send(200, rng)  # warm-up, not counted
            for stint in range(stints):
                capturing, quiet = clients if stint % 2 == 0 else clients[::-1]
                triton.trace_settings(capturing.model, on)
                triton.trace_settings(quiet.model, OFF)
                got: dict[str, list[float]] = {"off": [], "on": []}
                for pair in range(pairs):
                    first, second = ("on", "off") if pair % 2 == 0 else ("off", "on")
                    got[first] += (capturing if first == "on" else quiet).send(1, rng)
                    got[second] += (capturing if second == "on" else quiet).send(1, rng)
                for side in got:
                    times[side] += got[side]
                say(
                    f"paired stint {stint} ({capturing.model} on): p95 off {p95(got['off']):.3f} ms, "
                    f"on {p95(got['on']):.3f} ms"
                )
            for twin in TWINS:
                triton.trace_settings(twin, OFF)
    finally:
        for client in clients:
            client.close()
    purge(str(traces))
    return {
        **{side: p95(t) for side, t in times.items()},
        **{f"{side}_p50": float(np.median(t)) for side, t in times.items()},
    }


# -- 2. detection -------------------------------------------------------------------------------------


def detection(url: str, traces: Path, runs: int) -> dict[str, Any]:
    shadow = Shadow(rate=1, count=CAPTURED, captures=str(traces))
    detected = refused = 0
    judged: list[int] = []
    planted: list[float] = []
    seconds: list[float] = []
    client = Client(url)
    with TritonControl(url) as serving, TritonControl(url) as candidate, spinners(2):
        for run in range(runs):
            purge(str(traces))
            serving.trace_settings(MODEL, shadow.trace_settings())  # armed again: trace_count restarts
            client.send(CAPTURED, np.random.default_rng(1000 + run))  # a new seed each run
            found = wait_files(traces, CAPTURED)
            share = float(np.mean([x[0, 3] > 0.97 for x in client.inputs]))
            results: list[ShadowResult] = []
            for version in ("2", "3"):
                step = Step(MODEL, version, Role.MODEL, None, CLASSIFIER_CONFIG, CLASSIFIER_CONFIG, ["1"])
                result, _ = replay_step(step, "1", (candidate.infer, MODEL), serving.infer, shadow)
                results.append(result)
            bad, same = results
            detected += not bad.ok and bad.diverged > 0
            refused += not same.ok
            judged += [bad.judged, same.judged]
            planted.append(share)
            seconds += [bad.seconds, same.seconds]
            say(f"run {run}: {found} files, planted {share:.1%}; v2 {bad.line()}; v3 {same.line()}")
            if same.ok is False:
                say(f"  FALSE REFUSAL of v3: {same.verdict}; first: {same.first[:2]}")
            if bad.ok:
                say(f"  MISSED the planted v2: {bad.verdict}")
    client.close()
    serving_off(url)
    purge(str(traces))
    return {
        "runs": runs,
        "detected": detected,
        "false_refusals": refused,
        "judged": statistics.mean(judged),
        "planted": statistics.mean(planted),
        "replay_s": statistics.median(seconds),
    }


def serving_off(url: str) -> None:
    with TritonControl(url) as triton:
        triton.trace_settings(MODEL, OFF)


# -- 3. cost on the promotion -------------------------------------------------------------------------


def promotion_cost(root: Path, rounds: int) -> dict[str, Any]:
    from pipelines.core.context import Options
    from pipelines.promote.environments import environment
    from pipelines.promote.runner import Promotion
    from registry.mlflow import MlflowRegistry

    register_model = STACKS.register_model
    root.mkdir()
    settings, _ = stack_settings(root)
    with server(root, "replica") as (url, traces):
        (root / "mlreg.toml").write_text(
            f'[environments.shadow]\nstore = "{root / "replica-store"}"\ntargets = ["{url}"]\ngpu = false\n'
            f'[environments.shadow.shadow]\nrate = 1\ncount = {CAPTURED}\ncaptures = "{traces}"\n'
        )
        registry = MlflowRegistry(settings)
        made = iter(range(1_000_000))

        def register(tag: str) -> str:
            source = f"# {tag}\n{CLASSIFIER.format(planted=False)}"
            folder = root / "work" / f"{MODEL}-{next(made)}"
            return register_model(registry, folder, MODEL, CLASSIFIER_CONFIG, {"model.py": source})

        def promote(version: str, skip: bool) -> tuple[float, dict[str, Any], dict[str, float]]:
            options = Options(skip_perf=True, skip_shadow=skip)
            began = time.perf_counter()
            result = Promotion(settings, environment(settings, "shadow"), registry, options).run(
                MODEL, version
            )
            stages = {s.stage: s.seconds for s in result.stages}
            return time.perf_counter() - began, result.shadow[0], stages

        serving = register("first")
        promote(serving, skip=False)  # nothing serves yet: no replay
        since = time.time()
        seconds: dict[str, list[float]] = {"shadow": [], "skip": []}
        replay_s: list[float] = []
        judged: list[int] = []
        reads: list[float] = []
        per_stage: dict[str, dict[str, list[float]]] = {"shadow": {}, "skip": {}}
        last_files = 0
        with Clients([url], MODEL, rate=300, seed=35) as clients:
            for round_ in range(rounds):
                for variant in ("shadow", "skip") if round_ % 2 == 0 else ("skip", "shadow"):
                    waited, read_s = wait_captures(traces, since, CAPTURED, serving)
                    reads.append(read_s)
                    last_files = files = trace_files(traces)
                    candidate = register(f"identical {round_} {variant}")
                    took, shadow, stages = promote(candidate, skip=variant == "skip")
                    for stage, spent in stages.items():
                        per_stage[variant].setdefault(stage, []).append(spent)
                    since, serving = time.time(), candidate
                    seconds[variant].append(took)
                    if variant == "shadow":
                        replay_s.append(float(shadow["seconds"]))
                        judged.append(int(shadow["judged"]))
                        if not shadow["ok"]:
                            say(f"  FALSE REFUSAL in a promotion: {shadow['line']}")
                    say(
                        f"round {round_} {variant:>6}: {took:.2f} s (waited {waited:.1f} s for captures, "
                        f"{files} files read in {read_s:.2f} s); {shadow.get('line') or shadow['verdict']}"
                    )
                    say("  stages: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        failed = len(clients.failed)
    return {
        "shadow_s": statistics.median(seconds["shadow"]),
        "skip_s": statistics.median(seconds["skip"]),
        "replay_s": statistics.median(replay_s),
        "judged": statistics.mean(judged),
        "read_s": statistics.median(reads),
        "files": last_files,
        "stages": {
            stage: statistics.median(spent) - statistics.median(per_stage["skip"].get(stage, [0.0]))
            for stage, spent in per_stage["shadow"].items()
        },
        "client_failures": failed,
    }


def wait_captures(
    traces: Path, since: float, least: int, version: str, timeout: float = 120
) -> tuple[float, float]:
    """Seconds waited until ``least`` requests of ``version`` are captured (files counted cheaply,
    then read once to be sure), and what that reading of every trace file took."""
    from pipelines.checks.capture import read_captures

    began = time.monotonic()

    def newer() -> int:
        return sum(1 for p in traces.iterdir() if p.is_file() and p.stat().st_mtime >= since - 1)

    while time.monotonic() - began < timeout:
        if newer() >= least:
            reading = time.perf_counter()
            found = read_captures(str(traces), MODEL, version, 10_000).requests
            read_s = time.perf_counter() - reading
            if sum(not r.request_id.startswith("mlreg-") for r in found) >= least:
                return time.monotonic() - began, read_s
        time.sleep(0.2)
    raise RuntimeError(f"fewer than {least} captures of {MODEL} v{version} after {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="detection runs (default 20)")
    parser.add_argument("--blocks", type=int, default=6, help="latency blocks each side (default 6)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per block (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="promotion rounds each way (default 3)")
    parser.add_argument("--quick", action="store_true", help="3 runs, 2 blocks of 500, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.blocks, args.requests, args.rounds = 3, 2, 500, 1
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-shadow-"))
    began = time.perf_counter()
    try:
        repository(work)
        with server(work, "detect") as (url, traces):
            with TritonControl(url) as triton:
                for model in (MODEL, *TWINS):
                    triton.load(model)
            cost = production_cost(url, traces, args.blocks, args.requests)
            paired = paired_cost(url, traces, 2 * args.blocks, args.requests // 2)
            found = detection(url, traces, args.runs)
        promotion = promotion_cost(work / "promote", args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    off, on, every = cost["p95"]["off"], cost["p95"]["on"], cost["p95"]["rate1"]
    n = found["runs"]
    print(f"planted divergence detected (3 % planted, {CAPTURED} captured)  {found['detected']}/{n} runs")
    print(f"identical candidate refused, 2 processes spinning  {found['false_refusals']}/{n} runs")
    print(f"requests judged per replay  {found['judged']:.1f} requests")
    print(f"planted share of the captures  {found['planted'] * 100:.2f} %")
    print(f"replay of {CAPTURED} requests, direct (median)  {found['replay_s']:.3f} s")
    print(f"serving p95, capture off  {off:.3f} ms")
    print(f"serving p95, capture on (rate 1000)  {on:.3f} ms")
    print(f"p95 capture on / off (target <= 1.05)  {on / off:.3f} x")
    p50 = cost["p50"]
    print(
        f"serving p50, capture off / on (rate 1000) / rate 1  {p50['off']:.3f} / {p50['on']:.3f} / "
        f"{p50['rate1']:.3f} ms"
    )
    print(f"p50 capture on / off  {p50['on'] / p50['off']:.3f} x")
    print(f"serving p95, every request captured (rate 1)  {every:.3f} ms")
    print(f"p95 rate 1 / off  {every / off:.3f} x")
    print(f"paired twins p95, capture off  {paired['off']:.3f} ms")
    print(f"paired twins p95, capture on (rate 1000)  {paired['on']:.3f} ms")
    print(f"paired twins p95 on / off (target <= 1.05)  {paired['on'] / paired['off']:.3f} x")
    print(f"paired twins p50 on / off  {paired['on_p50'] / paired['off_p50']:.3f} x")
    print(f"promotion with the shadow replay (median)  {promotion['shadow_s']:.2f} s")
    print(f"promotion with --skip-shadow (median)  {promotion['skip_s']:.2f} s")
    print(f"added by the replay (target <= 3)  {promotion['shadow_s'] - promotion['skip_s']:.2f} s")
    print(f"replay's own seconds in the promotion (median)  {promotion['replay_s']:.3f} s")
    print(f"reading every trace file once, outside a promotion (median)  {promotion['read_s']:.3f} s")
    print(f"trace files under captures before the last promotion  {promotion['files']} files")
    for stage, added in promotion["stages"].items():
        print(f"stage {stage}: added by the replay (medians)  {added:.2f} s")
    print(f"requests judged per promotion  {promotion['judged']:.1f} requests")
    print(f"client failures during the promotions  {promotion['client_failures']} requests")
    say(f"wall {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
