"""The deployment ledger's cost (issue 49 item 3), side by side in one run.

(a) ms per event appended on a local store (a folder on this machine's disk, not a tmpfs): N events
    by one writer, with and without a load receipt (ECDSA P-256); then the ms per event of reading
    the whole ledger back and verifying it.  Target: <= 5 ms per event.
(b) a 200-replica promotion on the stand-in Triton fleet (tests/standin_triton.py, in a process of
    its own as replicas are other machines; loopback gRPC), each replica loading in ``--load-delay``
    s, the real promotion (pipelines/promote/runner.py: canary 1, then every other replica at once,
    max_parallel 200, bake 0, quality skipped) with the registry of tests/fakes.py -- once with the
    ledger (every load appended by the Fleet's recorder), once without (the recorder factory patched
    to give none), alternating, a new version each round.  Target: with <= 1.05 x without (medians;
    the per-round ratios are printed too: on a busy machine they spread widely).

Figures on stdout, one a line: ``<label>  <number> <unit>``; per-round values on stderr.

    .venv/bin/python benchmarks/ledger.py                    # (a) and (b), 3 rounds
    .venv/bin/python benchmarks/ledger.py --events 2000 --replicas 200 --rounds 5 --load-delay 1.0
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.ledger import ledger_of  # noqa: E402
from pipelines.ledger import recorder as ledger_recorder  # noqa: E402
from pipelines.ledger.receipts import ReceiptSigner  # noqa: E402
from pipelines.ledger.recorder import Recorder  # noqa: E402
from pipelines.storage import open_store  # noqa: E402

CONFIG = """name: "bench"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def figure(label: str, value: float, unit: str, digits: int = 2) -> None:
    print(f"{label}  {value:.{digits}f} {unit}", flush=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="events per round of (a)")
    parser.add_argument("--replicas", type=int, default=200, help="stand-in replicas of (b)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-delay", type=float, default=0.5, help="a stand-in's load, seconds")
    parser.add_argument("--only", choices=["events", "fleet"], default=None)
    return parser.parse_args()


# -- (a) ---------------------------------------------------------------------------------------------


def _version_store(root: Path) -> Path:
    source = root / "src" / "bench"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text(CONFIG)
    (source / "1" / "model.py").write_text("X = 1\n")
    open_store(root / "store").versions.put_version("bench", "1", source / "1")
    return root / "store"


def per_event(count: int, rounds: int) -> None:
    base = Path(
        tempfile.mkdtemp(
            prefix="mlreg-bench-ledger-", dir=str(ROOT / ".mlreg") if (ROOT / ".mlreg").is_dir() else None
        )
    )
    key = base / "receipts.pem"
    subprocess.run(
        ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True
    )
    plain, signed, reads = [], [], []
    for index in range(rounds):
        for receipts, results in ((False, plain), (True, signed)):
            root = base / f"{index}-{int(receipts)}"
            store = open_store(_version_store(root))
            recorder = Recorder(
                ledger_of(store.objects), store, "bench", signer=ReceiptSigner(key) if receipts else None
            )
            began = time.perf_counter()
            for n in range(count):
                before = ("1",) if n % 2 else ()
                event = recorder.sent(f"replica-{n % 200}:8001", "bench", ("1",), before)
                assert event is not None, recorder.problems
            results.append((time.perf_counter() - began) / count * 1000)
            began = time.perf_counter()
            events, findings = ledger_of(store.objects).read_all()
            assert not findings, findings
            assert len(events) == count
            reads.append((time.perf_counter() - began) / count * 1000)
        print(
            f"round {index + 1}: {plain[-1]:.2f} ms, with receipts {signed[-1]:.2f} ms per event",
            file=sys.stderr,
        )
    where = subprocess.run(
        ["df", "--output=fstype", str(base)], capture_output=True, text=True
    ).stdout.split()[-1]
    figure(f"(a) append, local store ({where}), ms per event", statistics.median(plain), "ms")
    figure(f"(a) append with a load receipt ({where}), ms per event", statistics.median(signed), "ms")
    figure(f"(a) read back + verify ({where}), ms per event", statistics.median(reads), "ms", 3)


# -- (b) ---------------------------------------------------------------------------------------------

METHODS = {"sent": "sent", "append": "_append", "flush": "flush"}  # Recorder's methods timed


class Timed:
    """Seconds spent in each of Recorder's ``METHODS`` (summed over threads) while installed."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {name: [] for name in METHODS}
        self.real = {name: getattr(Recorder, attr) for name, attr in METHODS.items()}

    def __enter__(self) -> Timed:
        for name, attr in METHODS.items():
            setattr(Recorder, attr, self._timing(name))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, attr in METHODS.items():
            setattr(Recorder, attr, self.real[name])

    def _timing(self, name: str) -> object:
        def timed(recorder: Recorder, *args: object, **kwargs: object) -> object:
            began = time.perf_counter()
            try:
                return self.real[name](recorder, *args, **kwargs)
            finally:
                self.spent[name].append(time.perf_counter() - began)

        return timed

    def taken(self) -> dict[str, float]:
        sums = {name: sum(times) for name, times in self.spent.items()}
        for times in self.spent.values():
            times.clear()
        return sums


def serve_standins(store: str, size: int, load_delay: float, key: str, pipe: Any) -> None:
    """The stand-in fleet in a process of its own (as replicas are other machines: their CPU is
    not the promotion's): its URLs sent, then what each replica serves of a model on request."""
    from tests.standin_triton import StandinFleet

    with StandinFleet(Path(store), size, load_delay=load_delay, key=key) as fleet:
        pipe.send(fleet.urls)
        while (model := pipe.recv()) is not None:
            pipe.send([r.ready(model) for r in fleet.replicas])


class Standins:
    """The child process's fleet, seen from the promotion's process."""

    def __init__(self, store: Path, size: int, load_delay: float, key: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=serve_standins, args=(str(store), size, load_delay, key, child))

    def __enter__(self) -> Standins:
        self.process.start()
        if not self.pipe.poll(120):
            raise SystemExit("the stand-in fleet did not start within 120 s")
        self.urls: list[str] = self.pipe.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pipe.send(None)
        self.process.join(timeout=60)

    def ready(self, model: str) -> list[list[str]]:
        self.pipe.send(model)
        if not self.pipe.poll(60):
            raise SystemExit("the stand-in fleet did not answer within 60 s")
        return list(self.pipe.recv())


def fleet_promotion(size: int, load_delay: float, rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"mlreg-bench-ledger-fleet-{size}-"))
    (root / "store").mkdir()
    key = secrets.token_urlsafe(16)
    with Standins(root / "store", size, load_delay, key) as fleet, Timed() as timed:
        promote = promoter(root, fleet, key)
        promote(1, True)  # the first deployment: not measured
        timed.taken()
        with_ledger: list[float] = []
        without: list[float] = []
        inside: list[dict[str, float]] = []
        for index in range(rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for ledger in order:
                wall = promote(2 + 2 * index + int(ledger != order[0]), ledger)
                (with_ledger if ledger else without).append(wall)
                taken = timed.taken()
                if ledger:
                    inside.append(taken)
            print(
                f"round {index + 1}: with {with_ledger[-1]:.2f} s, without {without[-1]:.2f} s",
                file=sys.stderr,
            )
        events, findings = ledger_of(open_store(root / "store").objects).read_all()
    assert not findings, findings
    label = f"(b) {size}-replica stand-in promotion (load {load_delay:g} s)"
    figure(f"{label} with the ledger", statistics.median(with_ledger), "s")
    figure(f"{label} without", statistics.median(without), "s")
    figure(f"{label} with / without", statistics.median(with_ledger) / statistics.median(without), "x", 3)
    ratios = sorted(w / o for w, o in zip(with_ledger, without, strict=True))
    print(f"{label} per-round ratios: " + ", ".join(f"{r:.3f}" for r in ratios))
    for name, what in (
        ("sent", "fleet threads' time in Recorder.sent (sum)"),
        ("append", "writer's appends (sum)"),
    ):
        figure(f"{label} {what}", statistics.median(t[name] for t in inside), "s", 3)
    figure(
        f"{label} record stage's wait for the writer", statistics.median(t["flush"] for t in inside), "s", 3
    )
    figure(f"{label} events appended in all", len(events), "events", 0)


def promoter(root: Path, fleet: Any, key: str) -> Callable[[int, bool], float]:
    """A promotion of a new version of ``bench`` to every stand-in, with or without the ledger:
    its wall time (every replica checked to serve it)."""
    from pipelines.core.context import Options
    from pipelines.promote.environments import environment
    from pipelines.promote.runner import Promotion
    from pipelines.triton.control import TritonControl
    from pipelines.triton.control_key import ControlKey
    from registry.settings import Settings
    from tests.fakes import FakeRegistry

    targets = ", ".join(f'"{u}"' for u in fleet.urls)
    (root / "mlreg.toml").write_text(
        f'[environments.scale]\nstore = "{root / "store"}"\ntargets = [{targets}]\ngpu = false\n'
        f"warmup = false\ncanary = 1\nwaves = [100]\nmax_parallel = {len(fleet.urls)}\nbake_seconds = 0\n"
    )
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg")})
    env = environment(settings, "scale")
    registry = FakeRegistry(root / "registry")
    control = ControlKey(key, "the benchmark")
    factory = ledger_recorder.for_fleet

    def connect(url: str) -> TritonControl:
        return TritonControl(url, timeout=30.0, load_timeout=120.0, key=control)

    def promote(version: int, ledger: bool) -> float:
        registry.add("bench", str(version), CONFIG)
        ledger_recorder.for_fleet = factory if ledger else (lambda *a, **k: None)  # type: ignore[assignment]
        try:
            began = time.perf_counter()
            promotion = Promotion(settings, env, registry, Options(skip_quality=True), connect)  # type: ignore[arg-type]
            result = promotion.run("bench", str(version))
            wall = time.perf_counter() - began
        finally:
            ledger_recorder.for_fleet = factory
        if not result.ok or any(held != [str(version)] for held in fleet.ready("bench")):
            raise SystemExit(f"v{version}: not every replica serves it ({result.error})")
        return wall

    return promote


def main() -> None:
    args = arguments()
    if args.only in (None, "events"):
        per_event(args.events, args.rounds)
    if args.only in (None, "fleet"):
        fleet_promotion(args.replicas, args.load_delay, args.rounds)


if __name__ == "__main__":
    main()
