"""The canary's performance check (issue 25): its cost, and its false refusals on a busy machine.

One real tritonserver, a light python-backend model answering after DELAY seconds (the serving
version and an identical candidate, loaded side by side as the quality gate loads them).

(a) cost: real promotions of the model into an environment on that server, WITH the check and
    with ``skip_perf``, alternating (so a busy machine weighs on both alike); the medians and the
    difference (target: <= 3 s added with the default request count).
(b) false refusals: the check of an identical candidate, RUNS times while LOAD processes spin on
    the CPU (target: 0 refusals in 20 runs); each run's p95 ratio, limit and seconds.
(c) a 3x slower candidate (control: the check must refuse it every time), RUNS_SLOW times under the
    same load.

    .venv/bin/python benchmarks/perf_check.py [--runs 20] [--load 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.checks.perf import PerfSettings, check, measure  # noqa: E402
from pipelines.core.context import Options  # noqa: E402
from pipelines.core.plan import desired_config  # noqa: E402
from pipelines.devstack import local_triton  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Promotion  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from registry.contracts.config import config_json  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.register import Candidate, register  # noqa: E402
from registry.settings import Settings  # noqa: E402

DELAY = 0.01
RUNS_SLOW = 5
MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TAG = {tag!r}
DELAY = {delay}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(DELAY)
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


def source(tag: str, delay: float = DELAY) -> str:
    return MODEL.format(tag=tag, delay=delay)


def checks(url: str, runs: int, candidate_delay: float) -> list[tuple[bool, float, float, float, bool]]:
    """``runs`` checks of a private candidate against the serving v1, each as the gate runs it (a
    failed run measured once more): (ok, ratio, limit, seconds, measured twice)."""
    private = "bench__candidate"
    text = desired_config(CONFIG, ["2"], gpu=False)
    found = []
    with TritonControl(url) as triton:
        code = source(f"candidate-{candidate_delay}", candidate_delay).encode()
        triton.load(private, config=config_json(text, private), files={"file:2/model.py": code})
        triton.wait_ready(private, "2")
        for _ in range(runs):
            began = time.perf_counter()
            result = check(
                lambda: measure(
                    lambda: TritonControl(url),
                    "bench",
                    (private, "2"),
                    "1",
                    {"X": np.zeros(4, dtype=np.float32)},
                    ["Y"],
                    PerfSettings(),
                )
            )
            found.append(
                (
                    result.ok,
                    result.ratio,
                    result.threshold,
                    time.perf_counter() - began,
                    bool(result.first_run),
                )
            )
        triton.unload(private)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="checks of an identical candidate (20)")
    parser.add_argument("--load", type=int, default=2, help="CPU-spinning processes during (b), (c) (2)")
    parser.add_argument("--rounds", type=int, default=3, help="promotion pairs in (a) (3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-perf-"))
    settings = Settings.from_env(env={"MLREG_HOME": str(work / ".mlreg"), "PATH": os.environ["PATH"]})
    store = work / "repository"
    store.mkdir()
    info, process = local_triton.start_server(store, work / "replica", settings.backends_source)
    (work / "mlreg.toml").write_text(
        f'[environments.bench]\nstore = "{store}"\ntargets = ["{info.grpc_url}"]\ngpu = false\n'
    )
    registry = MlflowRegistry(settings)
    env = environment(settings, "bench")

    def registered(tag: str) -> str:
        folder = work / "models" / tag
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG)
        (folder / "1" / "model.py").write_text(source(tag))
        return register(registry, Candidate("bench", folder / "1", folder / "config.pbtxt")).version

    def promote(version: str, skip_perf: bool) -> tuple[float, float]:
        began = time.perf_counter()
        result = Promotion(settings, env, registry, Options(skip_perf=skip_perf)).run("bench", version)
        quality = next(s.seconds for s in result.stages if s.stage in ("quality", "canary"))
        return time.perf_counter() - began, quality

    spinners: list[subprocess.Popen[bytes]] = []
    try:
        Promotion(settings, env, registry, Options(skip_quality=True)).run("bench", registered("v1"))
        with_check: list[tuple[float, float]] = []
        without: list[tuple[float, float]] = []
        for number in range(args.rounds):
            with_check.append(promote(registered(f"with-{number}"), skip_perf=False))
            without.append(promote(registered(f"without-{number}"), skip_perf=True))
        # back to v1 serving alone for (b) and (c)
        Promotion(settings, env, registry, Options(skip_quality=True)).run("bench", "1")
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
        equal = checks(info.grpc_url, args.runs, DELAY)
        slow = checks(info.grpc_url, RUNS_SLOW, 3 * DELAY)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        local_triton.stop_pid(info.pid, info.shm_prefix, process=process)
    median = statistics.median
    print(
        f"(a) promotions of a python model ({DELAY * 1000:.0f} ms per request), {args.rounds} pairs, seconds"
    )
    for label, values in (("WITH the check", with_check), ("--skip-perf", without)):
        whole, gate = median(v[0] for v in values), median(v[1] for v in values)
        print(f"  promote {label:16} {whole:6.2f}  its gate stage {gate:5.2f}")
    added = median(v[0] for v in with_check) - median(v[0] for v in without)
    print(f"  check's cost (promotion, median difference) {added:6.2f} (target <= 3 s)")
    refused = sum(1 for ok, *_ in equal if not ok)
    cores = os.cpu_count()
    print(f"(b) identical candidate, {args.runs} runs, under load ({args.load} spinners on {cores} cores)")
    print(
        f"  false refusals {refused} of {args.runs} (target 0); "
        f"first runs failed (measured again) {sum(1 for *_, twice in equal if twice)}"
    )
    ratios, limits, seconds = [v[1] for v in equal], [v[2] for v in equal], [v[3] for v in equal]
    print(
        f"  p95 ratio median {median(ratios):.2f}, max {max(ratios):.2f}; limit median {median(limits):.2f}; "
        f"check seconds median {median(seconds):.2f}"
    )
    caught = sum(1 for ok, *_ in slow if not ok)
    print(f"(c) 3x slower candidate under the same load: refused {caught} of {RUNS_SLOW} (control: all)")
    print(f"  p95 ratio median {median(v[1] for v in slow):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
