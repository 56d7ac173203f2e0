"""The restart watch's calls (issue 45, item 3): what detecting a replica that restarts during a
staged roll-out (pipelines/fleet/restarts.py) adds per replica per wave, counted on the stand-in
fleet (tests/standin_triton.py: each replica counts every gRPC call it gets, by method).

Per fleet size (default 20 and 50 replicas; ``--sizes``), on one local store and a sqlite MLflow,
under canary = 1, waves = [10, 50, 100] (four waves), bake_seconds = 0, max_parallel = N: promotions
of new scorer versions, in alternating order, with the watch on (as shipped) and off (its ``check``
replaced by nothing: the roll-out as it was before issue 45), ``--rounds`` of each.  Figures: the
control calls (every gRPC call but inference) per replica per promotion, on and off; the extra calls
per replica per wave (on - off, over replicas x waves), and the most any replica got per wave; then
one promotion during which the canary restarts after its wave (given its wave's state again), with
its calls.  Medians of the rounds; ``<label>  <number> <unit>`` one a line on stdout.

    .venv/bin/python benchmarks/restart_calls.py --sizes 20,50 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("MLREG_CONTROL_KEY", "bench-" + os.urandom(8).hex())
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.core.policy import Policy, waves_of
from pipelines.fleet.restarts import RestartWatch
from registry.mlflow import MlflowRegistry
from tests.integration.fleetstack import FleetStack, scorer
from tests.integration.stacks import SCORER_CONFIG, stack_settings
from tests.standin_triton import StandinFleet

WAVES = (10.0, 50.0, 100.0)
CHECK = RestartWatch.check


def control(counts: Counter[str]) -> int:
    return sum(n for method, n in counts.items() if method != "ModelInfer")


def one(stack: FleetStack, standins: StandinFleet, tag: str, watch: bool) -> list[int]:
    RestartWatch.check = CHECK if watch else (lambda self, urls, moves: None)  # type: ignore[method-assign]
    try:
        version = stack.register("scorer", SCORER_CONFIG, scorer(tag))
        standins.reset_counts()
        assert stack.promote("scorer", version).ok
        return [control(r.calls) for r in standins.replicas]
    finally:
        RestartWatch.check = CHECK  # type: ignore[method-assign]


def size(n: int, rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"mlreg-bench-restart-H4-{n}-"))
    settings, _ = stack_settings(root)
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    with StandinFleet(
        store, n, load_delay=0.02, rate=20, metrics_interval=2, key=os.environ["MLREG_CONTROL_KEY"]
    ) as standins:
        stack = FleetStack(settings, MlflowRegistry(settings), str(store), standins.urls, work, root, [])
        targets = ", ".join(f'"{u}"' for u in standins.urls)
        (root / "mlreg.toml").write_text(
            f'[environments.fleet]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
            f"canary = 1\nwaves = [{', '.join(f'{w:g}' for w in WAVES)}]\nbake_seconds = 0\n"
            f"max_parallel = {n}\nmetrics = {standins.metrics_table()}\n"
        )
        waves = len(waves_of(standins.urls, Policy(canary=1, waves=WAVES)))
        assert stack.promote("scorer", stack.register("scorer", SCORER_CONFIG, scorer("v0"))).ok
        on: list[list[int]] = []
        off: list[list[int]] = []
        for index in range(rounds):
            for watch in (index % 2 == 0, index % 2 == 1):  # alternating order
                (on if watch else off).append(one(stack, standins, f"r{index}-{watch}", watch))
        mean_on = statistics.median(sum(c) / n for c in on)
        mean_off = statistics.median(sum(c) / n for c in off)
        worst = statistics.median(
            max(a - b for a, b in zip(x, y, strict=True)) for x, y in zip(on, off, strict=True)
        )
        print(f"standin-{n} waves  {waves} waves")
        print(f"standin-{n} control calls per replica, watch off  {mean_off:.2f} calls")
        print(f"standin-{n} control calls per replica, watch on  {mean_on:.2f} calls")
        print(
            f"standin-{n} extra calls per replica per wave (mean)  {(mean_on - mean_off) / waves:.2f} calls"
        )
        print(f"standin-{n} extra calls per wave, the most any replica got  {worst / waves:.2f} calls")
        canary = standins.replicas[0]
        second = standins.replicas[1]
        before = canary.restarts

        def crash(model: str) -> None:
            if canary.restarts == before:
                canary.restart_after = 0.3
                canary.crash()

        second.on_load = crash
        calls = one(stack, standins, "restart", True)
        second.on_load = None
        print(f"standin-{n} a canary restarted after its wave: restarts  {canary.restarts - before} restarts")
        print(f"standin-{n} a canary restarted after its wave: its control calls  {calls[0]} calls")
        serves = int(bool(canary.ready("scorer")))
        print(f"standin-{n} a canary restarted after its wave: serves the new version  {serves} bool")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,50")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        size(n, args.rounds)


if __name__ == "__main__":
    main()
