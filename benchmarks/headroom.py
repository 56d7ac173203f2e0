"""What the memory headroom check adds to each load (issue 34), side by side in one run.

A 4-replica fleet (``--replicas``): the real ``Fleet`` on a real local-folder store, each replica a
small in-process stand-in for Triton's control API (a load takes ``--load-ms``, default 0, so the
figure is the guard's alone), and a stand-in for each replica's metrics endpoint -- a real
``http.server`` on 127.0.0.1 serving Triton 2.51's Prometheus text (4 GPUs' and the host's memory
gauges among the inference counters of ``--models`` models, as a busy replica exports them) whose
used memory follows what the replica holds.

Each round, in alternating order so a busy machine weighs on both alike, the same swap
(``Fleet.apply``: the store's config written once, then every replica, canary first, each waited
for until READY) with no guard and with ``Headroom`` (a recorded footprint: the check reads each
replica's gauges once and compares).  Reported, medians of the rounds:

- per replica: the move's wall time without and with the guard, and the difference;
- the check alone (``Headroom.checks[].seconds``: from ``before_load`` to its verdict): median and
  max; target <= 50 ms per replica;
- once: a first load whose footprint is not recorded, measured on the canary (the gauge polled
  until it refreshes: ``1.2 x`` the metrics interval at most, ``--interval`` seconds, Triton's
  default 2).

    .venv/bin/python benchmarks/headroom.py [--replicas 4] [--rounds 20] [--load-ms 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.core.undo import UndoLog  # noqa: E402
from pipelines.fleet.fleet import Change, Fleet  # noqa: E402
from pipelines.guards.headroom import Footprint, Headroom, replica_versions  # noqa: E402
from pipelines.storage import open_store  # noqa: E402

GIB = 2**30
CONFIG = """name: "bench"
backend: "python"
max_batch_size: 0
version_policy {{ specific {{ versions: [ {versions} ] }} }}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
"""
COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


class Replica:
    """Triton's control API as the Fleet uses it, in process: a load takes ``load_s``."""

    def __init__(self, url: str, load_s: float) -> None:
        self.url, self.load_s = url, load_s
        self.states: dict[str, dict[str, str]] = {}

    def is_live(self) -> bool:
        return True

    def model_states(self) -> dict[str, dict[str, str]]:
        return {m: dict(v) for m, v in self.states.items()}

    def load(self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        versions = (
            json.loads(config or "{}").get("version_policy", {}).get("specific", {}).get("versions", [])
        )
        time.sleep(self.load_s)
        self.states[model] = {str(v): "READY" for v in versions}

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.states.pop(model, None)

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None:
        assert self.states.get(model, {}).get(version) == "READY"

    def statistics(self, model: str = "") -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class Metrics:
    """Each replica's metrics page: 4 GPUs (80 GiB, 1 GiB per version held on each), the host,
    and ``models`` x 9 inference counters."""

    def __init__(self, replicas: dict[str, Replica], models: int) -> None:
        self.replicas = replicas
        self.counters = "".join(
            f'{name}{{model="m{i}",version="1"}} {i * 1000}\n' for i in range(models) for name in COUNTERS
        )
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.text(self.path.strip("/").removesuffix("/metrics")).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, replica: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{replica.split(':')[0]}/metrics"

    def text(self, name: str) -> str:
        replica = self.replicas[f"{name}:8001"]
        held = sum(len(v) for v in replica.states.values())
        gpus = "".join(
            f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-{g}"}} {80 * GIB}\n'
            f'nv_gpu_memory_used_bytes{{gpu_uuid="GPU-{g}"}} {(2 + held) * GIB}\n'
            for g in range(4)
        )
        host = f"nv_cpu_memory_total_bytes {256 * GIB}\nnv_cpu_memory_used_bytes {12 * GIB}\n"
        return self.counters + gpus + host

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def swap(fleet: Fleet, *versions: int) -> list[float]:
    """``bench`` to ``versions`` on every replica (the last one new): each move's seconds."""
    names = tuple(str(v) for v in versions)
    rollout = fleet.apply(Change("bench", CONFIG.format(versions=", ".join(names)), names))
    assert rollout.ok, rollout.to_dict()
    return [t.seconds for t in rollout.targets]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    urls = [f"r{i}:8001" for i in range(args.replicas)]
    replicas = {url: Replica(url, args.load_ms / 1000) for url in urls}
    metrics = Metrics(replicas, args.models)
    store = open_store(work / "store")
    recorded = lambda model, version: Footprint(model, version, 4 * GIB, "gpu")  # noqa: E731
    moves: dict[str, list[float]] = {"without": [], "with": []}
    checks: list[float] = []
    version = 1
    try:
        for round_ in range(args.rounds):
            for mode in ("without", "with") if round_ % 2 == 0 else ("with", "without"):
                fleet = Fleet(
                    store, urls, replicas.__getitem__, load_timeout=10, undo=UndoLog(False, store.session)
                )
                if mode == "with":
                    guard = Headroom(
                        metrics.url, known=recorded, held=replica_versions(fleet), interval=args.interval
                    )
                    fleet.guards[:] = [guard]
                version += 1
                moves[mode].extend(swap(fleet, version - 1, version))
                if mode == "with":
                    checks.extend(c["seconds"] for c in guard.checks)
        fleet = Fleet(store, urls, replicas.__getitem__, load_timeout=10, undo=UndoLog(False, store.session))
        guard = Headroom(metrics.url, held=replica_versions(fleet), interval=args.interval)
        fleet.guards[:] = [guard]
        version += 1
        measured = swap(fleet, version - 2, version - 1, version)  # one version more: 1 GiB per GPU
    finally:
        metrics.close()
    without, with_guard = statistics.median(moves["without"]), statistics.median(moves["with"])
    return {
        "replicas": args.replicas,
        "rounds": args.rounds,
        "load_ms": args.load_ms,
        "metrics_lines": len(metrics.text("r0").splitlines()),
        "move_ms_without_guard": round(without * 1000, 3),
        "move_ms_with_guard": round(with_guard * 1000, 3),
        "added_ms_per_replica": round((with_guard - without) * 1000, 3),
        "check_ms_median": round(statistics.median(checks) * 1000, 3),
        "check_ms_max": round(max(checks) * 1000, 3),
        "target_ms": 50,
        "ok": max(checks) <= 0.050,
        "first_load_measured": {
            "interval_s": args.interval,
            "canary_move_s": round(measured[0], 3),
            "other_moves_ms": [round(s * 1000, 3) for s in measured[1:]],
            "footprint_bytes": guard.footprints()[0][2] if guard.footprints() else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4, help="replicas in the fleet (default 4)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    parser.add_argument("--load-ms", type=float, default=0.0, help="what a stand-in load takes (default 0)")
    parser.add_argument("--models", type=int, default=40, help="models on each metrics page (default 40)")
    parser.add_argument("--interval", type=float, default=2.0, help="metrics interval, s (Triton's: 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-headroom-") as tmp:
        out = run(args, Path(tmp))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"{out['replicas']} replicas, {out['rounds']} rounds, metrics pages of {out['metrics_lines']} lines"
    )
    print(f"move per replica, no guard      {out['move_ms_without_guard']:>9.3f} ms")
    print(f"move per replica, with Headroom {out['move_ms_with_guard']:>9.3f} ms")
    print(f"added per replica               {out['added_ms_per_replica']:>9.3f} ms")
    verdict = "ok" if out["ok"] else "MISSED"
    print(
        f"the check alone                 {out['check_ms_median']:>9.3f} ms median, "
        f"{out['check_ms_max']:.3f} ms max (target <= {out['target_ms']} ms: {verdict})"
    )
    first = out["first_load_measured"]
    print(
        f"unknown footprint, measured on the canary: its move {first['canary_move_s']:.3f} s "
        f"(<= 1.2 x {first['interval_s']:g} s interval), the others {first['other_moves_ms']} ms, "
        f"footprint {first['footprint_bytes']} bytes"
    )


if __name__ == "__main__":
    main()
