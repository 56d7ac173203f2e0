"""Time to safe (issue 49 item 5): how long an aborted promotion takes from the failing check's
decision to every replica serving the previous version again, as its verdict records it.

Per fleet size (``--sizes``, default 3,200): that many stand-in replicas (tests/standin_triton.py,
in this process, loopback; each load takes ``--load-delay`` s) on one local store, under
benchmarks/fleet_scale.py's policy (canary = 1, waves = [10, 50, 100], bake_seconds = 1,
max_parallel = N).  A first version is deployed; then each round promotes a new version whose
requests fail on one replica of the last wave (``failing``: the stand-in answers them with errors),
so the promotion fails after every replica moved (``verify``'s request to that replica: no bake
follows the last wave) and the undo puts all of them back.  Each
promotion is an ``mlreg promote --json`` process (benchmarks/fleet_scale.py ``mlreg_promote``);
the figures are read from its --json document's ``time_to_safe`` (pipelines/promote/verdicts.py:
detection -> each replica's restore finished) and checked against the fleet: every replica must
serve exactly what it served before, else the round fails.

What "the previous version still loaded" costs: the staged roll-out swaps each replica straight to
the new version, so the undo re-loads the previous one; the stand-in charges ``--load-delay`` for
every load, a re-load included (a real Triton keeps nothing of an unloaded version), so these
figures are those of a re-load, an upper bound for a replica where it is still loaded.

Figures on stdout, one a line (``<label>  <number> <unit>``, medians of the rounds):

    .venv/bin/python benchmarks/time_to_safe.py --sizes 3,200 --rounds 2
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet import new_version  # noqa: E402
from fleet_scale import NAME, expect, figure, mlreg_promote, scale_env, waves  # noqa: E402

from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.settings import Settings  # noqa: E402
from tests.standin_triton import StandinFleet  # noqa: E402

TARGET_FLEET_S = 30.0  # the issue's: the whole 200-replica stand-in fleet back within 30 s
TARGET_REPLICA_S = 5.0  # the issue's: p95 per replica (3 real replicas)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3,200", help="stand-in fleet sizes (default 3,200)")
    parser.add_argument("--rounds", type=int, default=2, help="aborted promotions per size (default 2)")
    parser.add_argument("--load-delay", type=float, default=0.5, help="a stand-in's load, s (0.5)")
    args = parser.parse_args()
    args.sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    if min(args.sizes) < 3 or args.rounds < 1:
        parser.error("three or more replicas (a canary and two waves); rounds >= 1")
    return args


def aborted(
    root: Path, fleet: StandinFleet, registry: MlflowRegistry, work: Path, key: str, tag: int
) -> dict[str, Any]:
    """One promotion whose last bake trips; its time to safe, checked against the fleet."""
    before = {r.grpc_url: r.ready(NAME) for r in fleet.replicas}
    version = new_version(registry, work, tag)
    failing = fleet.replica(waves(fleet.urls)[-1][-1])
    failing.failing.add((NAME, version))
    measured = mlreg_promote(root, "scale", version, key)
    failing.failing.clear()
    expect(measured, False, f"round {tag}: the abort")
    safe = measured.document.get("time_to_safe") or {}
    back = [r.grpc_url for r in fleet.replicas if r.ready(NAME) == before[r.grpc_url]]
    if len(back) != len(fleet.replicas) or safe.get("not_back"):
        raise SystemExit(f"round {tag}: {len(back)} of {len(fleet.replicas)} back; verdict: {safe}")
    if len(safe.get("replicas") or {}) != len(fleet.replicas):
        raise SystemExit(f"round {tag}: the verdict names {len(safe.get('replicas') or {})} replicas back")
    print(f"round {tag}: reason {measured.document.get('reason', '')[:160]}", file=sys.stderr)
    print(f"round {tag}: time to safe {safe}"[:400], file=sys.stderr)
    return safe


def size_of(size: int, args: argparse.Namespace) -> None:
    key = secrets.token_urlsafe(16)
    root = Path(tempfile.mkdtemp(prefix=f"mlreg-bench-safe-{size}-"))
    print(f"state under {root}", file=sys.stderr)
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    with StandinFleet(store, size, load_delay=args.load_delay, metrics_interval=2.0, key=key) as fleet:
        metrics = {r.grpc_url: r.metrics_url for r in fleet.replicas}
        scale_env(root, {"scale": (store, fleet.urls, metrics, "")})
        registry = MlflowRegistry(settings)
        expect(mlreg_promote(root, "scale", new_version(registry, work, 1), key), True, "first deployment")
        rounds = [aborted(root, fleet, registry, work, key, index + 2) for index in range(args.rounds)]
    label = f"standin-{size}"
    p95 = statistics.median(float(r["p95_replica_seconds"]) for r in rounds)
    whole = statistics.median(float(r["whole_fleet_seconds"]) for r in rounds)
    every = sorted(s for r in rounds for s in r["replicas"].values())
    figure(f"{label} time to safe, whole fleet", whole, "s")
    figure(f"{label} time to safe, p95 per replica", p95, "s")
    figure(f"{label} time to safe, max per replica (all rounds)", every[-1], "s")
    figure(f"{label} replicas back (each round)", len(rounds[0]["replicas"]), "replicas")
    if size >= 200:
        figure(f"{label} whole fleet / target {TARGET_FLEET_S:g} s", whole / TARGET_FLEET_S, "x")
    else:
        figure(f"{label} p95 per replica / target {TARGET_REPLICA_S:g} s", p95 / TARGET_REPLICA_S, "x")
    print(
        f"{label}: {math.ceil(len(every) * 0.95)} of {len(every)} replica restores within {p95:.2f} s",
        file=sys.stderr,
    )


def main() -> None:
    args = arguments()
    print(f"time_to_safe: stand-in load {args.load_delay:g} s, medians of {args.rounds} aborted promotion(s)")
    for size in args.sizes:
        size_of(size, args)


if __name__ == "__main__":
    main()
