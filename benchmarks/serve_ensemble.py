"""Serve the template's ensemble on the local Triton and measure it.

Reports, in one run: start-to-ready time (server live, whole ensemble loaded),
ensemble throughput and p50/p99 latency at concurrency 1, 4 and 16 side by side,
and the batch sizes multi_modal_model actually executed at each level (Triton's
statistics API) -- the dynamic batcher must visibly batch under concurrency.

    .venv/bin/python benchmarks/serve_ensemble.py [--seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "model_repository_template"))

from golden_inputs import ensemble_inputs  # noqa: E402

from pipelines.devstack import local_triton  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from registry import template  # noqa: E402
from registry.settings import Settings  # noqa: E402

ENSEMBLE = "ensemble_multi_modal_model"
BATCHED = "multi_modal_model"


def batch_histogram(control: TritonControl) -> Counter[int]:
    stats = control.statistics(BATCHED)[0]
    return Counter(
        {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}
    )


def run_level(url: str, concurrency: int, seconds: float) -> dict[str, object]:
    inputs = ensemble_inputs()
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        nonlocal failures
        with TritonControl(url, timeout=30.0) as control:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    out = control.infer(ENSEMBLE, inputs, ["multi_modal_output"])
                    ok = bool(np.isfinite(out["multi_modal_output"]).all())
                except Exception:
                    ok = False
                elapsed = time.perf_counter() - started
                with lock:
                    if ok:
                        latencies.append(elapsed)
                    else:
                        failures += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "failed": failures,
        "throughput_rps": len(latencies) / wall,
        "p50_ms": 1000 * statistics.median(ordered) if ordered else float("nan"),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        if ordered
        else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each level")
    parser.add_argument("--levels", default="1,4,16", help="concurrency levels")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    settings = Settings.from_env()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-"))
    repository = work / "repository"
    template.build(settings.template_dir, repository, device="cpu", force=True)

    began = time.perf_counter()
    info, process = local_triton.start_server(repository, work / "state", settings.backends_source)
    live_s = time.perf_counter() - began
    report: dict[str, object] = {"server_live_s": live_s}
    try:
        with TritonControl(info.grpc_url, load_timeout=300.0) as control:
            control.load(ENSEMBLE)
            report["start_to_ready_s"] = time.perf_counter() - began
            control.infer(ENSEMBLE, ensemble_inputs(), ["multi_modal_output"])  # warm-up
            levels = []
            for concurrency in (int(c) for c in args.levels.split(",")):
                before = batch_histogram(control)
                level = run_level(info.grpc_url, concurrency, args.seconds)
                after = batch_histogram(control)
                level["batch_sizes"] = dict(sorted((after - before).items()))
                levels.append(level)
            report["levels"] = levels
    finally:
        local_triton.stop_pid(info.pid, info.shm_prefix, process=process)

    print(
        f"server live: {report['server_live_s']:.2f}s   "
        f"start-to-ready (ensemble + 5 members loaded): {report['start_to_ready_s']:.2f}s"
    )
    print(
        f"{'concurrency':>11} {'requests':>9} {'failed':>7} {'req/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8}  multi_modal_model executed batch sizes {{size: executions}}"
    )
    for level in report["levels"]:  # type: ignore[union-attr]
        print(
            f"{level['concurrency']:>11} {level['requests']:>9} {level['failed']:>7} "
            f"{level['throughput_rps']:>8.1f} {level['p50_ms']:>8.1f} {level['p99_ms']:>8.1f}  "
            f"{level['batch_sizes']}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
