"""A promotion over a fleet of N replicas: real tritonservers beside a bare parallel load_model, or
the stand-in Triton fleet (tests/standin_triton.py) at 50, 100 and 200 replicas (issue 37).

Default (real): N tritonservers (default 16; MLREG_BENCH_REPLICAS or --replicas), explicit model
control, all on ONE local-folder store; a light python-backend model (as benchmarks/fleet.py).
Each round, in alternating order so that a busy machine weighs on both alike:

(a) a full mlreg promotion of a new version (Options(skip_quality=True); canary = 1,
    waves = [100], max_parallel = N, bake_seconds = 0): its wall time and its deploy + finalize
    stages (the part that touches the replicas);
(b) the bare baseline: a new version folder of another model written into the store with a
    config naming it, then ``load_model`` on all N at once (ThreadPoolExecutor(N), a fresh
    TritonControl each, as a promotion connects afresh) and waited for until READY;
(c) the overhead (a) - (b) (median of the per-round differences) and the full state listings
    (``model_states`` calls, counted per replica by wrapping the promotion's connector) that one
    promotion asked: the most any replica got, and all replicas together.

``--standin 50,100,200``: per size, that many stand-in replicas in THIS process (loopback) on one
local store, under canary = 1, waves = [10, 50, 100], bake_seconds = 1, max_parallel = N; each
stand-in loads in ``--load-delay`` s, refreshes its memory gauges every ``--metrics-interval`` s
(2: production's --metrics-interval-ms=2000) and answers 20 simulated requests a second per
version.  Each promotion is an ``mlreg promote --json`` process of its own (tritonclient's gRPC
calls counted per replica inside it), so that its peak RSS (wait4's ru_maxrss) and peak thread
count (/proc, every 10 ms) are mlreg's alone.  (d): the promotion and its deploy stage against the
ideal, waves x (load + bake); control calls per replica (every gRPC call but inference, counted by
the stand-ins; the bake's metric scrapes and the requests -- verify's, the bake's probes -- apart);
peak RSS and threads.  ``--faults`` adds, per size, (e) one replica failing the last bake (every
replica back, checked on each) and 5 % of the replicas short of memory (named, the rest converged).

``--anchor``: (f) 16 real tritonservers, then 16 stand-ins loading in the real replicas' median
load time, under the same policy (no client traffic: min_requests = 0 for both), calls counted on
the client side for both: the stand-in's figures beside real ones.

Figures on stdout, one a line: ``<label>  <number> <unit>``; medians of the rounds.  Per-round
values go to stderr.  The old tree needs its own copy of this script (compare.py runs each tree's
own; the default mode uses only APIs that 006d973 has too):

    MLREG_BENCH_REPLICAS=4 .venv/bin/python benchmarks/fleet_scale.py --rounds 1
    .venv/bin/python benchmarks/fleet_scale.py --standin 50,100,200 --rounds 2 --faults
    .venv/bin/python benchmarks/fleet_scale.py --anchor --rounds 2
    cp benchmarks/fleet_scale.py /tmp/mlreg-old/benchmarks/
    .venv/bin/python benchmarks/compare.py --old /tmp/mlreg-old fleet_scale
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet import CONFIG, MODEL, new_version  # noqa: E402  (benchmarks/fleet.py's light python model)

from pipelines.core.context import Options  # noqa: E402
from pipelines.core.policy import Policy, waves_of  # noqa: E402
from pipelines.core.ports import ServingTarget  # noqa: E402
from pipelines.devstack import local_triton  # noqa: E402
from pipelines.devstack.scratch import scratch_servers  # noqa: E402
from pipelines.fleet.replicas import Connect, triton_connector  # noqa: E402
from pipelines.guards.headroom import FOOTPRINT_KIND_TAG, FOOTPRINT_TAG  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Promotion  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.settings import Settings  # noqa: E402
from tests.standin_triton import MEMORY_TOTAL, MIB, StandinFleet  # noqa: E402


def write_env(root: Path, store: Path, urls: list[str]) -> None:
    targets = ", ".join(f'"{u}"' for u in urls)
    (root / "mlreg.toml").write_text(
        f'[environments.scale]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
        f"canary = 1\nwaves = [100]\nmax_parallel = {len(urls)}\nbake_seconds = 0\n"
    )


def counting(settings: Settings, counts: Counter[str]) -> Connect:
    """The promotion's connector, each target's ``model_states`` counted per URL."""
    connect = triton_connector(settings)

    def counted(url: str) -> ServingTarget:
        target = connect(url)
        listing = target.model_states

        def model_states() -> dict[str, dict[str, str]]:
            counts[url] += 1
            return listing()

        target.model_states = model_states  # type: ignore[method-assign]
        return target

    return counted


def promote(
    settings: Settings, registry: MlflowRegistry, version: str, counts: Counter[str]
) -> tuple[float, float]:
    env = environment(settings, "scale")
    began = time.perf_counter()
    promotion = Promotion(
        settings,
        env,
        registry,
        Options(skip_quality=True),
        connect=counting(settings, counts),
        scratch=scratch_servers(settings),
    )
    result = promotion.run("bench", version)
    wall = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(f"the promotion of bench v{version} failed: {result.error}")
    return wall, sum(s.seconds for s in result.stages if s.stage in ("deploy", "finalize"))


def bare(settings: Settings, store: Path, urls: list[str], tag: int) -> float:
    """Version ``tag`` of ``bare`` into the store, its config naming it; loaded on all at once."""
    folder = store / "bare"
    (folder / str(tag)).mkdir(parents=True)
    (folder / str(tag) / "model.py").write_text(MODEL.format(tag=tag))
    policy = f"version_policy: {{ specific: {{ versions: [ {tag} ] }} }}\n"
    (folder / "config.pbtxt").write_text(CONFIG.replace('"bench"', '"bare"') + policy)

    def load(url: str) -> None:
        timeout = settings.triton_timeout
        with TritonControl(url, timeout=timeout, load_timeout=timeout * 10) as triton:
            triton.load("bare")
            triton.wait_ready("bare", str(tag), timeout=timeout * 10)

    began = time.perf_counter()
    with ThreadPoolExecutor(len(urls)) as pool:
        list(pool.map(load, urls))
    return time.perf_counter() - began


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = int(os.environ.get("MLREG_BENCH_REPLICAS", "16"))
    parser.add_argument("--replicas", type=int, default=default, help="tritonservers (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="promotion + bare pairs (default 3)")
    parser.add_argument("--standin", default="", help="stand-in fleet sizes, e.g. 50,100,200")
    parser.add_argument("--anchor", action="store_true", help="16 real tritonservers beside 16 stand-ins")
    parser.add_argument("--faults", action="store_true", help="with --standin: the abort and 5%% short")
    parser.add_argument("--load-delay", type=float, default=0.5, help="a stand-in's load, s (0.5)")
    parser.add_argument("--metrics-interval", type=float, default=2.0, help="stand-in gauges' refresh, s")
    args = parser.parse_args()
    sizes = [int(n) for n in args.standin.split(",") if n.strip()]
    if min([args.replicas, *sizes]) < 2 or args.rounds < 1:
        parser.error("a staged roll-out needs 2 or more replicas (a canary and the rest); rounds >= 1")
    args.sizes = sizes
    return args


def figure(label: str, value: float, unit: str, digits: int | None = None) -> None:
    """``<label>  <value> <unit>``: seconds and ratios with 2 decimals, counts with none."""
    digits = digits if digits is not None else 2 if unit in ("s", "x") else 0
    number = f"{value:.{digits}f}"
    print(f"{label:<48} {number:>8} {unit}", flush=True)


def real(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="mlreg-bench-fleet-scale-"))
    print(f"state under {root}", file=sys.stderr)
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
    try:
        began = time.perf_counter()
        for index in range(args.replicas):
            servers.append(local_triton.start_server(store, root / f"r{index}", settings.backends_source))
        print(f"{args.replicas} servers live in {time.perf_counter() - began:.1f} s", file=sys.stderr)
        urls = [info.grpc_url for info, _ in servers]
        write_env(root, store, urls)
        registry = MlflowRegistry(settings)
        promote(settings, registry, new_version(registry, work, 1), Counter())  # first deployment
        bare(settings, store, urls, 1)
        walls, fleets, bares, counts = [], [], [], []
        for round_ in range(args.rounds):
            tag = round_ + 2
            version = new_version(registry, work, tag)
            count: Counter[str] = Counter()
            if round_ % 2:
                bares.append(bare(settings, store, urls, tag))
            wall, fleet = promote(settings, registry, version, count)
            if not round_ % 2:
                bares.append(bare(settings, store, urls, tag))
            walls.append(wall)
            fleets.append(fleet)
            counts.append(count)
            print(
                f"round {round_ + 1}: promotion {wall:.2f} s (deploy+finalize {fleet:.2f} s), bare "
                f"{bares[-1]:.2f} s, listings max {max(count.values(), default=0)} total {count.total()}",
                file=sys.stderr,
            )
    finally:
        with ThreadPoolExecutor(max(1, len(servers))) as pool:  # SIGTERM takes 3-4 s each
            for info, process in servers:
                pool.submit(local_triton.stop_pid, info.pid, info.shm_prefix, process=process)
    med = statistics.median
    print(f"fleet_scale: {args.replicas} replicas, medians of {args.rounds} round(s)")
    figure("(a) promotion", med(walls), "s")
    figure("(a) promotion: deploy+finalize stages", med(fleets), "s")
    figure("(b) bare parallel load_model on all", med(bares), "s")
    figure("(c) overhead: promotion - bare", med(w - b for w, b in zip(walls, bares, strict=True)), "s")
    figure(
        "(c) overhead: deploy+finalize - bare", med(f - b for f, b in zip(fleets, bares, strict=True)), "s"
    )
    figure("(c) ratio promotion / bare", med(w / b for w, b in zip(walls, bares, strict=True)), "x")
    figure("(c) state listings per replica, max", med(max(c.values(), default=0) for c in counts), "calls")
    figure("(c) state listings, all replicas", med(c.total() for c in counts), "calls")


# -- the stand-in fleet (--standin, --faults) and the anchor (--anchor) ----------------------------

NAME = "bench"  # benchmarks/fleet.py's model
WAVES = (10.0, 50.0, 100.0)
BAKE = 1.0
REPOSITORY = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
# ``mlreg promote`` itself, every gRPC call tritonclient makes counted per replica (the stand-ins
# count theirs too; a real tritonserver does not): python -c CHILD COUNTS_FILE ARGS...
CHILD = """
import atexit, json, sys, threading
from collections import Counter, defaultdict
import tritonclient.grpc as grpcclient

counts, lock, cls = defaultdict(Counter), threading.Lock(), grpcclient.InferenceServerClient
init = cls.__init__

def remembering(self, url, *args, **kwargs):
    init(self, url, *args, **kwargs)
    self.bench_url = url

def counted(name, call):
    def wrapper(self, *args, **kwargs):
        with lock:
            counts[self.bench_url][name] += 1
        return call(self, *args, **kwargs)
    return wrapper

cls.__init__ = remembering
for name in [n for n in vars(cls) if n.startswith(("is_", "get_", "load_", "unload_", "update_", "infer"))]:
    setattr(cls, name, counted(name, getattr(cls, name)))
atexit.register(lambda out=sys.argv[1]: open(out, "w").write(json.dumps(counts)))
sys.argv = ["mlreg", *sys.argv[2:]]
from mlreg.cli.main import main
main()
"""


@dataclass
class Measured:
    """One ``mlreg promote --json`` process."""

    code: int
    wall: float  # the process, start to exit (interpreter and imports included)
    rss_mb: float  # its peak resident set (ru_maxrss)
    threads: int  # the most threads it ran at once
    calls: dict[str, Counter[str]]  # url -> tritonclient call -> count
    document: dict[str, Any] = field(default_factory=dict)

    def stage(self, name: str) -> float:
        return sum(s["seconds"] for s in self.document.get("stages", []) if s["stage"] == name)

    @property
    def promotion(self) -> float:
        return sum(s["seconds"] for s in self.document.get("stages", []))

    def loads(self) -> list[float]:
        """Each replica's move in the deploy stage, seconds (its load and the checks around it)."""
        stages: list[dict[str, Any]] = self.document.get("stages", [])
        deploy = next((s for s in stages if s["stage"] == "deploy"), {})
        rollouts = (deploy.get("report") or {}).get("rollouts", [])
        return [t["seconds"] for r in rollouts for t in r["targets"]]


def threads_of(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0)


def mlreg_promote(root: Path, env: str, version: str, key: str) -> Measured:
    """``mlreg promote bench --version V --env ENV --skip-quality --json`` in a process of its own."""
    counts, out = root / f"calls-{env}-{version}.json", root / f"promote-{env}-{version}.json"
    environ = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    environ |= {"MLREG_HOME": str(root / ".mlreg"), "MLREG_CONTROL_KEY": key}
    args = ["promote", NAME, "--version", version, "--env", env, "--skip-quality", "--json"]
    began = time.perf_counter()
    with open(out, "w") as stdout, open(root / f"promote-{env}-{version}.err", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(counts), *args],
            cwd=ROOT,
            env=environ,
            stdout=stdout,
            stderr=stderr,
        )
        peak, done = [0], threading.Event()

        def watch() -> None:
            while not done.wait(0.01):
                peak[0] = max(peak[0], threads_of(process.pid))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(process.pid, 0)  # its own rusage: ru_maxrss is mlreg's peak
        process.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        watcher.join()
    wall = time.perf_counter() - began
    text = out.read_text()
    document = json.loads(text[text.index("{") :]) if "{" in text else {}
    calls = {u: Counter(c) for u, c in json.loads(counts.read_text()).items()} if counts.exists() else {}
    return Measured(process.returncode, wall, usage.ru_maxrss / 1024, peak[0], calls, document)


def scale_env(root: Path, sections: dict[str, tuple[Path, Sequence[str], dict[str, str], str]]) -> None:
    """mlreg.toml: per environment name (store, targets, metrics URLs, extra policy lines), the
    issue's policy: canary 1, waves 10/50/100 %, bake 1 s, every wave's replicas at once."""
    text = ""
    for name, (store, urls, metrics, extra) in sections.items():
        targets = ", ".join(f'"{u}"' for u in urls)
        table = ", ".join(f'"{u}" = "{m}"' for u, m in metrics.items())
        text += (
            f'[environments.{name}]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
            f"canary = 1\nwaves = [{', '.join(f'{w:g}' for w in WAVES)}]\nbake_seconds = {BAKE:g}\n"
            f"max_parallel = {len(urls)}\nmetrics = {{ {table} }}\n{extra}\n"
        )
    (root / "mlreg.toml").write_text(text)


def waves(urls: Sequence[str]) -> list[list[str]]:
    return waves_of(urls, Policy(canary=1, waves=WAVES))


def ideal(urls: Sequence[str], load: float) -> float:
    """The issue's ideal roll-out: waves x (load + bake)."""
    return len(waves(urls)) * (load + BAKE)


def control(calls: Counter[str]) -> int:
    """Every gRPC call but inference (the stand-ins' method names, or tritonclient's)."""
    return sum(n for method, n in calls.items() if method not in ("ModelInfer", "infer"))


def expect(measured: Measured, ok: bool, what: str) -> None:
    if (measured.code == 0) != ok:
        error = measured.document.get("error", "")
        raise SystemExit(f"{what}: exit {measured.code}, expected {'0' if ok else 'a failure'}: {error}")


@dataclass
class Round:
    measured: Measured
    served: dict[str, Counter[str]]  # url -> the calls the stand-in got (none for a real replica)
    scrapes: float = 0.0  # metric scrapes per replica (the bake's and the headroom guard's)


def standin(args: argparse.Namespace) -> None:
    key = secrets.token_urlsafe(16)
    print(f"fleet_scale --standin: load {args.load_delay:g} s, bake {BAKE:g} s, medians of {args.rounds}")
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"mlreg-bench-standin-{size}-"))
        print(f"state under {root}", file=sys.stderr)
        settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
        store, work = root / "store", root / "work"
        store.mkdir()
        work.mkdir()
        fleet = StandinFleet(
            store, size, load_delay=args.load_delay, metrics_interval=args.metrics_interval, key=key
        )
        with fleet:
            metrics = {r.grpc_url: r.metrics_url for r in fleet.replicas}
            extra = f"max_unavailable = {math.ceil(size * 0.05)}\n"
            scale_env(root, {"scale": (store, fleet.urls, metrics, extra)})
            registry = MlflowRegistry(settings)
            expect(
                mlreg_promote(root, "scale", new_version(registry, work, 1), key), True, "first deployment"
            )
            rounds = []
            for index in range(args.rounds):
                version = new_version(registry, work, index + 2)
                fleet.reset_counts()
                measured = mlreg_promote(root, "scale", version, key)
                expect(measured, True, f"round {index + 1}")
                if any(r.ready(NAME) != [version] for r in fleet.replicas):
                    raise SystemExit(f"round {index + 1}: not every replica serves v{version}")
                served = {r.grpc_url: Counter(r.calls) for r in fleet.replicas}
                rounds.append(Round(measured, served, statistics.mean(r.scrapes for r in fleet.replicas)))
                tell(f"size {size} round {index + 1}", rounds[-1])
            report(f"(d) standin-{size}", fleet.urls, args.load_delay, rounds)
            if args.faults:
                faults(root, registry, work, fleet, key, args.rounds + 2)


def tell(what: str, run: Round) -> None:
    m = run.measured
    print(
        f"{what}: process {m.wall:.2f} s, promotion {m.promotion:.2f} s, deploy {m.stage('deploy'):.2f} s, "
        f"rss {m.rss_mb:.0f} MB, threads {m.threads}"
        + (f", scrapes/replica {run.scrapes:.1f}" if run.served else "")
        + "; stages "
        + ", ".join(f"{s['stage']} {s['seconds']:.2f}" for s in m.document.get("stages", [])),
        file=sys.stderr,
    )


def report(label: str, urls: Sequence[str], load: float, rounds: list[Round]) -> None:
    """The figures of ``rounds`` over ``urls`` (medians), against the ideal with ``load``."""
    med, best = statistics.median, ideal(urls, load)
    figure(f"{label} promotion (its stages)", med(r.measured.promotion for r in rounds), "s")
    figure(f"{label} deploy stage", med(r.measured.stage("deploy") for r in rounds), "s")
    figure(f"{label} ideal {len(waves(urls))} x ({load:.2f} + {BAKE:g})", best, "s")
    figure(f"{label} deploy / ideal", med(r.measured.stage("deploy") / best for r in rounds), "x")
    figure(f"{label} promotion / ideal", med(r.measured.promotion / best for r in rounds), "x")
    figure(f"{label} mlreg process, start to exit", med(r.measured.wall for r in rounds), "s")
    sides: list[tuple[str, Callable[[Round], dict[str, Counter[str]]]]] = [
        ("client", lambda r: r.measured.calls)
    ]
    if rounds[0].served:
        sides.insert(0, ("server", lambda r: r.served))
    for side, calls in sides:
        per = [[control(c) for c in calls(r).values()] for r in rounds]
        figure(f"{label} control calls/replica max ({side})", med(max(p) for p in per), "calls")
        figure(
            f"{label} control calls/replica mean ({side})", med(statistics.mean(p) for p in per), "calls", 2
        )
    for side, calls in sides[:1]:
        methods: Counter[str] = Counter()
        for run in rounds:
            for counted in calls(run).values():
                methods.update(counted)
        share = len(rounds) * len(urls)
        print(
            f"{label} calls/replica by method ({side}): "
            + ", ".join(f"{m} {n / share:.2f}" for m, n in sorted(methods.items()))
        )
    if rounds[0].served:
        figure(f"{label} metric scrapes/replica", med(r.scrapes for r in rounds), "scrapes", 1)
    figure(f"{label} mlreg peak RSS", med(r.measured.rss_mb for r in rounds), "MB")
    figure(f"{label} mlreg peak threads", med(r.measured.threads for r in rounds), "threads")


def faults(root: Path, registry: MlflowRegistry, work: Path, fleet: StandinFleet, key: str, tag: int) -> None:
    """(e) one replica of the third wave failing the last bake, then 5 % of them short of memory."""
    urls, label = fleet.urls, f"(e) standin-{len(fleet.urls)}"
    before = {r.grpc_url: r.ready(NAME) for r in fleet.replicas}
    version = new_version(registry, work, tag)
    failing = fleet.replica(waves(urls)[2][-1])
    failing.failing.add((NAME, version))
    measured = mlreg_promote(root, "scale", version, key)
    failing.failing.clear()
    expect(measured, False, "the abort")
    print(f"{label} abort: {measured.document.get('error', '')[:200]}", file=sys.stderr)
    back = sum(r.ready(NAME) == before[r.grpc_url] for r in fleet.replicas)
    figure(f"{label} abort at the last bake, process", measured.wall, "s")
    figure(f"{label} abort: its rollback stage", measured.stage("rollback"), "s")
    figure(f"{label} abort: replicas back exactly (of {len(urls)})", back, "replicas")
    version = new_version(registry, work, tag + 1)
    for name, value in ((FOOTPRINT_TAG, str(256 * MIB)), (FOOTPRINT_KIND_TAG, "host")):
        registry.models.set_version_tag(NAME, version, name, value)
    count = math.ceil(len(urls) * 0.05)
    short = urls[1:][:: (len(urls) - 1) // count][:count]  # spread over the waves, never the canary
    for url in short:
        replica = fleet.replica(url)
        replica.memory_total = replica.memory_base + replica.footprint + 64 * MIB
    measured = mlreg_promote(root, "scale", version, key)
    for url in short:
        fleet.replica(url).memory_total = MEMORY_TOTAL
    named = set(measured.document.get("plan", {}).get("skipped", {}))
    print(
        f"{label} 5 % short: exit {measured.code} {measured.document.get('error', '')[:200]}", file=sys.stderr
    )
    converged = sum(
        r.ready(NAME) == ([version] if r.grpc_url not in short else before[r.grpc_url])
        for r in fleet.replicas
    )
    figure(f"{label} {count} short of memory, process", measured.wall, "s")
    figure(f"{label} short replicas named (of {count})", len(named & set(short)), "replicas")
    figure(f"{label} replicas as expected after (of {len(urls)})", converged, "replicas")


def anchor(args: argparse.Namespace) -> None:
    """(f) 16 real tritonservers, then 16 stand-ins loading in the real median load, one policy."""
    key, size = secrets.token_urlsafe(16), 16
    root = Path(tempfile.mkdtemp(prefix="mlreg-bench-anchor-"))
    print(f"state under {root}", file=sys.stderr)
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    stores = {name: root / name for name in ("real", "standin")}
    for folder in (*stores.values(), root / "work"):
        folder.mkdir()
    sections: dict[str, tuple[Path, Sequence[str], dict[str, str], str]] = {}
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
    try:
        for index in range(size):
            servers.append(
                local_triton.start_server(stores["real"], root / f"r{index}", settings.backends_source)
            )
        urls = [info.grpc_url for info, _ in servers]
        sections["real"] = (
            stores["real"],
            urls,
            {i.grpc_url: i.metrics_url for i, _ in servers},
            "min_requests = 0\n",
        )
        scale_env(root, sections)
        registry = MlflowRegistry(settings)
        versions = [new_version(registry, root / "work", tag) for tag in range(1, args.rounds + 2)]
        real_rounds = anchored(root, "real", versions, key)
        load = statistics.median(t for r in real_rounds for t in r.measured.loads())
        # the local tritonservers refresh their gauges every 500 ms (local_triton.LOCAL_DEPARTURES)
        with StandinFleet(stores["standin"], size, load_delay=load, metrics_interval=0.5, key=key) as fleet:
            metrics = {r.grpc_url: r.metrics_url for r in fleet.replicas}
            sections["standin"] = (stores["standin"], fleet.urls, metrics, "min_requests = 0\n")
            scale_env(root, sections)
            standin_rounds = anchored(root, "standin", versions, key)
    finally:
        with ThreadPoolExecutor(max(1, len(servers))) as pool:  # SIGTERM takes 3-4 s each
            for info, process in servers:
                pool.submit(local_triton.stop_pid, info.pid, info.shm_prefix, process=process)
    print(f"fleet_scale --anchor: 16 real tritonservers, then 16 stand-ins loading in {load:.2f} s")
    for label, rounds in (("(f) real-16", real_rounds), ("(f) standin-16", standin_rounds)):
        moves = statistics.median(t for r in rounds for t in r.measured.loads())
        figure(f"{label} a replica's move (load and checks), median", moves, "s")
        report(label, urls, moves, rounds)


def anchored(root: Path, env: str, versions: list[str], key: str) -> list[Round]:
    expect(mlreg_promote(root, env, versions[0], key), True, f"{env}: first deployment")
    rounds = []
    for index, version in enumerate(versions[1:]):
        measured = mlreg_promote(root, env, version, key)
        expect(measured, True, f"{env} round {index + 1}")
        rounds.append(Round(measured, {}))
        tell(f"{env} round {index + 1}", rounds[-1])
    return rounds


if __name__ == "__main__":
    parsed = arguments()
    if parsed.sizes:
        standin(parsed)
    if parsed.anchor:
        anchor(parsed)
    if not parsed.sizes and not parsed.anchor:
        real(parsed)
