"""Fleet roll-out timings, side by side in one run (issue 12).

(a) Promotion wall time (bake 0, quality skipped, a light python-backend model) over 1, 2 and 4
    replicas with max_parallel = replicas vs 1 (canary = 1, waves = [100]: the canary, then the
    rest at once).  Target: 4 replicas in parallel <= 0.6x sequential.  Runs alternate parallel and
    sequential so a busy machine weighs on both alike; the median of ROUNDS is shown, and the
    deploy + finalize stages (the part that touches the replicas) beside the whole promotion.
(b) `mlreg status --env` (pipelines.promote.status.model_status) over 4 replicas, parallel probes,
    beside a serial loop of the same probes.  Target: < 1 s.

    .venv/bin/python benchmarks/fleet.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines import local_triton  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Options, Promotion  # noqa: E402
from pipelines.promote.status import model_status  # noqa: E402
from pipelines.triton import TritonControl  # noqa: E402
from registry.mlflow_registry import MlflowRegistry  # noqa: E402
from registry.register import Candidate, register  # noqa: E402
from registry.settings import Settings  # noqa: E402

ROUNDS = 2
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


def write_env(root: Path, store: Path, urls: list[str], parallel: int) -> None:
    targets = ", ".join(f'"{u}"' for u in urls)
    (root / "mlreg.toml").write_text(
        f'[environments.bench]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
        f"canary = 1\nwaves = [100]\nbake_seconds = 0\nmax_parallel = {parallel}\n"
    )


def new_version(registry: MlflowRegistry, work: Path, tag: int) -> str:
    folder = work / f"bench-{tag}"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL.format(tag=tag))
    return register(registry, Candidate("bench", folder / "1", folder / "config.pbtxt")).version


def promote(settings: Settings, registry: MlflowRegistry, version: str) -> tuple[float, float]:
    env = environment(settings, "bench")
    began = time.perf_counter()
    result = Promotion(settings, env, registry, Options(skip_quality=True)).run("bench", version)
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
            for n in (1, 2, 4):
                modes = (n, 1) if n > 1 else (1,)
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
