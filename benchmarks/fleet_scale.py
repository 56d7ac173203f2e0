"""A promotion over a fleet of N real tritonservers beside a bare parallel load_model, in one run.

N tritonservers (default 16; MLREG_BENCH_REPLICAS or --replicas), explicit model control, all on
ONE local-folder store; a light python-backend model (as benchmarks/fleet.py).  Each round, in
alternating order so that a busy machine weighs on both alike:

(a) a full mlreg promotion of a new version (Options(skip_quality=True); canary = 1,
    waves = [100], max_parallel = N, bake_seconds = 0): its wall time and its deploy + finalize
    stages (the part that touches the replicas);
(b) the bare baseline: a new version folder of another model written into the store with a
    config naming it, then ``load_model`` on all N at once (ThreadPoolExecutor(N), a fresh
    TritonControl each, as a promotion connects afresh) and waited for until READY;
(c) the overhead (a) - (b) (median of the per-round differences) and the full state listings
    (``model_states`` calls, counted per replica by wrapping the promotion's connector) that one
    promotion asked: the most any replica got, and all replicas together.

Figures on stdout, one a line: ``<label>  <number> <unit>`` (s, x, calls); medians of the rounds.
Per-round values go to stderr.  The old tree needs its own copy of this script (compare.py runs
each tree's own; it uses only APIs that 006d973 has too):

    MLREG_BENCH_REPLICAS=4 .venv/bin/python benchmarks/fleet_scale.py --rounds 1
    cp benchmarks/fleet_scale.py /tmp/mlreg-old/benchmarks/
    .venv/bin/python benchmarks/compare.py --old /tmp/mlreg-old fleet_scale
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet import CONFIG, MODEL, new_version  # noqa: E402  (benchmarks/fleet.py's light python model)

from pipelines.devstack import local_triton  # noqa: E402
from pipelines.devstack.scratch import scratch_servers  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.ports import ServingTarget  # noqa: E402
from pipelines.promote.replicas import Connect, triton_connector  # noqa: E402
from pipelines.promote.runner import Options, Promotion  # noqa: E402
from pipelines.triton import TritonControl  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.settings import Settings  # noqa: E402


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
    args = parser.parse_args()
    if args.replicas < 2 or args.rounds < 1:
        parser.error("a staged roll-out needs 2 or more replicas (a canary and the rest); rounds >= 1")
    return args


def figure(label: str, value: float, unit: str) -> None:
    number = f"{value:.0f}" if unit == "calls" else f"{value:.2f}"
    print(f"{label:<48} {number:>8} {unit}", flush=True)


def run(args: argparse.Namespace) -> None:
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


if __name__ == "__main__":
    run(arguments())
