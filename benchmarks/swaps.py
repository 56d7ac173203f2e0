"""The serving version's latency during swaps that keep it vs swaps that re-create it (issue 34).

One real tritonserver (the nvidia-pytriton wheel's 2.51) on a local store, a python model
(``scorer``), a client thread sending requests to the model (unpinned: what clients do) the whole
time, and N promotions alternating two versions -- run twice, side by side in one process:

- ``kept``: mlreg as it is: the store keeps an empty ``__pycache__`` guard in each version folder,
  so the python stub writes nothing there and a load never re-creates the serving version;
- ``re-created``: the same promotions with the guard switched off (what mlreg did before): the
  stub writes its cache into the served folder, the next load finds the files changed and Triton
  re-creates every loaded version.

Printed per variant: requests, failures, p50/p99/max latency (ms) during the swaps, instance
starts from the server's log, and seconds per promotion.  ``--json`` for machines.

    .venv/bin/python benchmarks/swaps.py --swaps 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(args["model_version"])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * self.factor)]
            )
            for r in requests
        ]
"""
CONFIG = """name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@contextlib.contextmanager
def guard_switched_off(off: bool) -> Iterator[None]:
    """``off``: LocalObjects.guard_bytecode does nothing (mlreg before the guard)."""
    from pipelines.storage.local import LocalObjects

    kept = LocalObjects.guard_bytecode
    if off:
        LocalObjects.guard_bytecode = lambda self, model, version: []  # type: ignore[method-assign]
    try:
        yield
    finally:
        LocalObjects.guard_bytecode = kept  # type: ignore[method-assign]


def client(url: str, stop: threading.Event, latencies: list[float], failures: list[str]) -> None:
    from pipelines.triton.control import TritonControl
    from registry.errors import MlregError

    x = np.ones(4, np.float32)
    with TritonControl(url) as triton:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                triton.infer("scorer", {"X": x}, ["Y"])
                latencies.append(time.perf_counter() - began)
            except MlregError as exc:
                failures.append(exc.message)


def run(variant: str, swaps: int, work: Path) -> dict[str, Any]:
    from pipelines.core.context import Options
    from pipelines.devstack import local_triton
    from pipelines.promote.environments import environment
    from pipelines.promote.runner import Promotion
    from registry.mlflow import MlflowRegistry
    from registry.register import Candidate, register
    from registry.settings import Settings

    root = work / variant
    root.mkdir()
    env_vars = {"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]}
    settings = Settings.from_env(env=env_vars)
    store = root / "store"
    store.mkdir()
    key = os.environ["MLREG_CONTROL_KEY"]
    info, process = local_triton.start_server(
        store, root / "triton", settings.backends_source, control_key=key
    )
    try:
        (root / "mlreg.toml").write_text(
            f'[environments.bench]\nstore = "{store}"\ntargets = ["{info.grpc_url}"]\ngpu = false\n'
        )
        registry = MlflowRegistry(settings)
        versions = []
        for tag in ("a", "b"):
            folder = root / "src" / tag
            (folder / "1").mkdir(parents=True)
            (folder / "config.pbtxt").write_text(CONFIG)
            (folder / "1" / "model.py").write_text(f"# {tag}\n{MODEL}")
            versions.append(
                register(registry, Candidate("scorer", folder / "1", folder / "config.pbtxt")).version
            )
        env = environment(settings, "bench")

        def promote(version: str) -> None:
            Promotion(settings, env, registry, Options(skip_quality=True)).run("scorer", version)

        with guard_switched_off(variant == "re-created"):
            promote(versions[0])
            log = Path(info.log_path)
            starts = log.read_text(errors="replace").count("ModelInstanceInitialize: scorer_")
            latencies: list[float] = []
            failures: list[str] = []
            stop = threading.Event()
            thread = threading.Thread(target=client, args=(info.grpc_url, stop, latencies, failures))
            thread.start()
            began = time.perf_counter()
            try:
                for index in range(swaps):
                    promote(versions[(index + 1) % 2])
            finally:
                seconds = time.perf_counter() - began
                stop.set()
                thread.join()
        starts = log.read_text(errors="replace").count("ModelInstanceInitialize: scorer_") - starts
    finally:
        local_triton.stop_pid(info.pid, info.shm_prefix, process=process)
    ms = np.array(latencies) * 1000
    return {
        "variant": variant,
        "swaps": swaps,
        "requests": len(latencies),
        "failures": len(failures),
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "max_ms": float(ms.max()) if len(ms) else float("nan"),
        "instance_starts": starts,
        "seconds_per_swap": seconds / swaps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    os.environ.setdefault("MLREG_CONTROL_KEY", "mlreg-benchmark-swaps-" + os.urandom(8).hex())
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-swaps-"))
    try:
        results = [run(variant, args.swaps, work) for variant in ("kept", "re-created")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"benchmark": "swaps", "results": results}, indent=1))
        return 0
    heads = (
        ("requests", 9),
        ("failed", 7),
        ("p50 ms", 9),
        ("p99 ms", 9),
        ("max ms", 9),
        ("starts", 8),
        ("s/swap", 8),
    )
    print(f"{'variant':<12}" + "".join(f"{h:>{w}}" for h, w in heads))
    for r in results:
        print(
            f"{r['variant']:<12}{r['requests']:>9}{r['failures']:>7}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
            f"{r['max_ms']:>9.1f}{r['instance_starts']:>8}{r['seconds_per_swap']:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
