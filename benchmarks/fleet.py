"""Fleet roll-out timings, side by side in one run (issue 12).

(a) Promotion wall time (bake 0, quality skipped, a light python-backend model) over 1, 2 and 4
    replicas with max_parallel = replicas vs 1 (canary = 1, waves = [100]: the canary, then the
    rest at once).  Target: 4 replicas in parallel <= 0.6x sequential.  Runs alternate parallel and
    sequential so a busy machine weighs on both alike; the median of ROUNDS is shown, and the
    deploy + finalize stages (the part that touches the replicas) beside the whole promotion.
(b) requests to the 3 replicas (one client thread each) during 3-replica promotions (bake 2 s on
    Triton's metrics, canary 1 then waves [50, 100]) repeated until >= 10,000 requests were sent
    during them: failed requests (target 0), p99 latency during vs before.
(c) `mlreg status --env` (mlreg.ops.status.model_status) over 4 replicas, parallel probes,
    beside a serial loop of the same probes.  Target: < 1 s.

    .venv/bin/python benchmarks/fleet.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlreg.ops.status import model_status  # noqa: E402
from pipelines.core.context import Options  # noqa: E402
from pipelines.devstack import local_triton  # noqa: E402
from pipelines.devstack.scratch import scratch_servers  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Promotion  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.register import Candidate, register  # noqa: E402
from registry.settings import Settings  # noqa: E402

ROUNDS = 3
NO_BAKE = "waves = [100]\nbake_seconds = 0\n"
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

VERSION_TAG = {tag}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float32))]))
        return out
"""
CONFIG = """name: "bench"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def write_env(root: Path, store: Path, urls: list[str], parallel: int, bake: str = NO_BAKE) -> None:
    targets = ", ".join(f'"{u}"' for u in urls)
    (root / "mlreg.toml").write_text(
        f'[environments.bench]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
        f"canary = 1\nmax_parallel = {parallel}\n{bake}"
    )


class Traffic:
    """One client thread per replica; every request's latency and outcome recorded."""

    def __init__(self, urls: list[str]) -> None:
        self.stop = threading.Event()
        self.during = threading.Event()
        self.records: list[tuple[bool, float, bool]] = []  # during, seconds, ok
        self.threads = [threading.Thread(target=self.send, args=(url,)) for url in urls]

    def send(self, url: str) -> None:
        x = {"X": np.ones(4, np.float32)}
        with TritonControl(url, timeout=30) as triton:
            while not self.stop.is_set():
                began = time.perf_counter()
                try:
                    triton.infer("bench", x, ["Y"])
                    ok = True
                except Exception:  # counted, never raised: the benchmark reports failures
                    ok = False
                self.records.append((self.during.is_set(), time.perf_counter() - began, ok))

    def count(self, during: bool) -> int:
        return sum(1 for r in self.records if r[0] == during)

    def p99_ms(self, during: bool) -> float:
        return float(np.percentile([r[1] for r in self.records if r[0] == during and r[2]], 99) * 1000)


def under_traffic(settings: Settings, registry: MlflowRegistry, work: Path, urls: list[str], tag: int) -> int:
    traffic = Traffic(urls)
    for thread in traffic.threads:
        thread.start()
    try:
        time.sleep(5)
        traffic.during.set()
        promotions = 0
        while traffic.count(True) < 10_000 and promotions < 10:
            tag += 1
            promote(settings, registry, new_version(registry, work, tag))
            promotions += 1
        traffic.during.clear()
    finally:
        traffic.stop.set()
        for thread in traffic.threads:
            thread.join(timeout=60)
    failed = sum(1 for r in traffic.records if r[0] and not r[2])
    print(
        f"during {promotions} promotions over 3 replicas: {failed} failed of {traffic.count(True)} requests; "
        f"p99 {traffic.p99_ms(True):.1f} ms during vs {traffic.p99_ms(False):.1f} ms before"
    )
    return tag


def new_version(registry: MlflowRegistry, work: Path, tag: int) -> str:
    folder = work / f"bench-{tag}"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL.format(tag=tag))
    return register(registry, Candidate("bench", folder / "1", folder / "config.pbtxt")).version


def promote(settings: Settings, registry: MlflowRegistry, version: str) -> tuple[float, float]:
    env = environment(settings, "bench")
    began = time.perf_counter()
    promotion = Promotion(
        settings, env, registry, Options(skip_quality=True), scratch=scratch_servers(settings)
    )
    result = promotion.run("bench", version)
    wall = time.perf_counter() - began
    assert result.ok, result
    fleet = sum(s.seconds for s in result.stages if s.stage in ("deploy", "finalize"))
    return wall, fleet


def status_times(settings: Settings, registry: MlflowRegistry, urls: list[str]) -> tuple[float, float]:
    env = environment(settings, "bench")
    began = time.perf_counter()
    rows = model_status(settings, env, registry, ["bench"])
    parallel = time.perf_counter() - began
    assert len(rows[0]["serving"]) == len(urls), rows
    began = time.perf_counter()
    for url in urls:
        with TritonControl(url) as triton:
            triton.model_states()
    serial_probes = time.perf_counter() - began
    return parallel, serial_probes


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-fleet-") as tmp:
        root = Path(tmp)
        settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
        store = root / "store"
        store.mkdir()
        work = root / "work"
        work.mkdir()
        servers = []
        try:
            for index in range(4):
                servers.append(local_triton.start_server(store, root / f"r{index}", settings.backends_source))
            urls = [info.grpc_url for info, _ in servers]
            registry = MlflowRegistry(settings)
            tag = 0
            write_env(root, store, urls, 4)
            tag += 1
            promote(settings, registry, new_version(registry, work, tag))  # first deployment everywhere
            print(f"{'replicas':>8} {'max_parallel':>12} {'promotion s':>12} {'deploy+finalize s':>18}")
            table: dict[tuple[int, int], list[tuple[float, float]]] = {}
            for n in (2, 4):  # a staged roll-out needs a replica beside the canary (policy.check_fleet)
                modes = (n, 1)
                for _ in range(ROUNDS):
                    for parallel in modes:
                        write_env(root, store, urls[:n], parallel)
                        tag += 1
                        table.setdefault((n, parallel), []).append(
                            promote(settings, registry, new_version(registry, work, tag))
                        )
                for parallel in modes:
                    runs = table[(n, parallel)]
                    wall = statistics.median(r[0] for r in runs)
                    fleet = statistics.median(r[1] for r in runs)
                    print(f"{n:>8} {parallel:>12} {wall:>12.2f} {fleet:>18.2f}")
            for n in (2, 4):
                par = statistics.median(r[0] for r in table[(n, n)])
                seq = statistics.median(r[0] for r in table[(n, 1)])
                fpar = statistics.median(r[1] for r in table[(n, n)])
                fseq = statistics.median(r[1] for r in table[(n, 1)])
                ratio = f"{par / seq:.2f}x (deploy+finalize {fpar / fseq:.2f}x)"
                print(f"{n} replicas: parallel / sequential = {ratio}")
            metrics = ", ".join(f'"{i.grpc_url}" = "{i.metrics_url}"' for i, _ in servers[:3])
            bake = (  # a fresh stub on 2 busy cores doubles the mean latency for seconds: not judged here
                f"bake_seconds = 2\nwaves = [50, 100]\nmin_requests = 5\nmax_latency_ratio = 50\n"
                f"metrics = {{ {metrics} }}\n"
            )
            write_env(root, store, urls[:3], 3, bake)
            tag = under_traffic(settings, registry, work, urls[:3], tag)
            write_env(root, store, urls, 4)
            times = [status_times(settings, registry, urls) for _ in range(3)]
            status, serial = (statistics.median(t[i] for t in times) for i in (0, 1))
            print(
                f"status --env over 4 replicas: {status:.3f} s "
                f"(the 4 probes alone, serially: {serial:.3f} s); target < 1 s"
            )
        finally:
            for info, process in servers:
                local_triton.stop_pid(info.pid, info.shm_prefix, process=process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
