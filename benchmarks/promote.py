"""Promotion on the local stack, side by side with a bare baseline, in one run.

(a) `mlreg promote image_model --version N --skip-quality` (whole CLI process; the quality stage is
    timed separately) vs a bare baseline script doing only upload + load_model + wait-until-ready,
    timed the same way (whole process) and, stricter, from inside the script.  Target: <= 1.3x.
(b) ensemble traffic during promotions (image_model swapped back and forth until >= 10,000
    requests were sent during promotions): failed requests (target 0), p99 latency during vs before.
(c) promoting the version already serving.  Target: a no-op in < 2 s.

    .venv/bin/python benchmarks/promote.py
    MLREG_BENCH_ONLY=a .venv/bin/python benchmarks/promote.py    # (a) alone
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "model_repository_template"))

from golden_inputs import ensemble_inputs  # noqa: E402

from pipelines.devstack.stack import stack_down, stack_up  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from pipelines.triton.control_key import GRPC_HEADER, control_key  # noqa: E402
from registry.settings import Settings  # noqa: E402

ROUNDS = 3
ONLY_A = os.environ.get("MLREG_BENCH_ONLY") == "a"  # (a) alone: the ratio, without (b) and (c)
BASELINE = """
import os, shutil, sys, time
from pathlib import Path
import tritonclient.grpc as grpcclient
repo, url, version, source = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
began = time.perf_counter()
shutil.copytree(source, repo / "image_model" / version)  # the upload (local store)
config = (repo / "image_model" / "config.pbtxt").read_text()
start = config.find("version_policy")
if start >= 0:  # drop the block, whatever its layout
    depth, end = 0, config.index("{", start)
    for end in range(end, len(config)):
        depth += {"{": 1, "}": -1}.get(config[end], 0)
        if depth == 0:
            break
    config = config[:start] + config[end + 1:]
config += "version_policy { specific { versions: [%s] } }\\n" % version
(repo / "image_model" / "config.pbtxt").write_text(config)
client = grpcclient.InferenceServerClient(url)
# the stack's Triton restricts model control to its key (pipelines/triton/control_key.py), as mlreg sends it
headers = {os.environ["BENCH_KEY_HEADER"]: os.environ["BENCH_KEY"]} if os.environ.get("BENCH_KEY") else None
client.load_model("image_model", headers=headers, client_timeout=300)
while not client.is_model_ready("image_model", version):
    time.sleep(0.05)
print(time.perf_counter() - began)
"""


def cli(env: dict[str, str], *args: str) -> tuple[float, str]:
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mlreg", *args], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"mlreg {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - began, proc.stdout


class Traffic:
    def __init__(self, url: str, threads: int = 8) -> None:
        self.url, self.stop, self.lock = url, threading.Event(), threading.Lock()
        self.records: list[tuple[float, float, bool]] = []  # (start, latency, ok)
        self.threads = [threading.Thread(target=self.worker) for _ in range(threads)]

    def worker(self) -> None:
        inputs = ensemble_inputs()
        with TritonControl(self.url, timeout=30) as triton:
            deadline = time.monotonic() + 900
            while not self.stop.is_set() and time.monotonic() < deadline:
                began = time.monotonic()
                try:
                    triton.infer("ensemble_multi_modal_model", inputs, ["multi_modal_output"])
                    ok = True
                except Exception:
                    ok = False
                with self.lock:
                    self.records.append((began, time.monotonic() - began, ok))

    def window(self, start: float, end: float) -> list[tuple[float, float, bool]]:
        with self.lock:
            return [r for r in self.records if start <= r[0] < end]


def p99(records: list[tuple[float, float, bool]]) -> float:
    ordered = sorted(r[1] for r in records)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-promote-"))
    env = {**os.environ, "MLREG_HOME": str(work / ".mlreg"), "MLREG_NO_PROGRESS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    settings = Settings.from_env(env=env)
    settings.local_repository.mkdir(parents=True)
    info = stack_up(settings, ui=False).info
    assert info is not None
    try:
        cli(env, "export")
        cli(env, "promote", "ensemble_multi_modal_model", "--version", "1", "--skip-quality")
        versions = []
        for seed in (7, 8, 9, 13):
            _, out = cli(env, "export", "image_model", "--seed", str(seed), "--json")
            versions.append(json.loads(out)["versions"][0]["version"])
        # (a) mlreg promote vs the bare baseline, ROUNDS each (every one a real swap), medians
        quality_s, _ = cli(env, "promote", "image_model", "--version", versions[0])  # with quality
        ours: list[float] = []
        stage_runs: list[dict[str, float]] = []
        for version in versions[1 : 1 + ROUNDS]:
            seconds, out = cli(
                env, "promote", "image_model", "--version", version, "--skip-quality", "--json"
            )
            ours.append(seconds)
            stage_runs.append({s["stage"]: s["seconds"] for s in json.loads(out)["stages"]})
        source = settings.home / "exports" / "image_model" / "1"
        cli(env, "export", "image_model", "--seed", "10")
        baseline_process: list[float] = []
        baseline_inside: list[float] = []
        key = control_key(settings.home, environ=env)  # the stack's: the baseline's load needs it too
        bare = {**env, "BENCH_KEY_HEADER": GRPC_HEADER, "BENCH_KEY": key.value if key else ""}
        for number in range(99, 99 - ROUNDS, -1):
            began = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    BASELINE,
                    str(settings.local_repository),
                    info.grpc_url,
                    str(number),
                    str(source),
                ],
                capture_output=True,
                text=True,
                check=True,
                env=bare,
            )
            baseline_process.append(time.perf_counter() - began)  # as `mlreg promote` is timed
            baseline_inside.append(float(proc.stdout.strip()))  # Python start, imports left out
        # restore the store's desired state for image_model (the baseline wrote 99, 98, ...): its
        # hand-placed, unregistered folders go first (a promotion refuses a store holding folders
        # without a manifest); what serves is then no verified version, so there is no way back
        for number in range(99, 99 - ROUNDS, -1):
            shutil.rmtree(settings.local_repository / "image_model" / str(number), ignore_errors=True)
        cli(env, "promote", "image_model", "--version", versions[ROUNDS], "--skip-quality", "--no-way-back")
        stages = {k: statistics.median(run[k] for run in stage_runs) for k in stage_runs[0]}

        during: list[tuple[float, float, bool]] = []
        before: list[tuple[float, float, bool]] = []
        noop: list[float] = []
        promotions = 0
        if ONLY_A:
            return report(ours, baseline_process, baseline_inside, stages, quality_s, during, before, noop, 0)
        # (b) traffic during promotions
        traffic = Traffic(info.grpc_url)
        for thread in traffic.threads:
            thread.start()
        time.sleep(10)
        before = traffic.window(0, time.monotonic())
        flip = [versions[ROUNDS - 1], versions[ROUNDS]]
        deadline = time.monotonic() + 600
        while len(during) < 10_000 and time.monotonic() < deadline:
            start = time.monotonic()
            cli(env, "promote", "image_model", "--version", flip[promotions % 2], "--skip-quality")
            during.extend(traffic.window(start, time.monotonic()))
            promotions += 1
        traffic.stop.set()
        for thread in traffic.threads:
            thread.join()
        # (c) the version already serving
        noop = [
            cli(env, "promote", "image_model", "--version", flip[(promotions - 1) % 2])[0] for _ in range(3)
        ]
    finally:
        stack_down(settings)
    return report(
        ours, baseline_process, baseline_inside, stages, quality_s, during, before, noop, promotions
    )


def report(
    ours: list[float],
    baseline_process: list[float],
    baseline_inside: list[float],
    stages: dict[str, float],
    quality_s: float,
    during: list[tuple[float, float, bool]],
    before: list[tuple[float, float, bool]],
    noop: list[float],
    promotions: int,
) -> int:
    ours_s = statistics.median(ours)
    baseline_process_s = statistics.median(baseline_process)
    baseline_s = statistics.median(baseline_inside)
    failed = sum(1 for r in during if not r[2])
    print(
        f"(a) medians of {ROUNDS} runs each; mlreg promote: "
        + ", ".join(f"{x:.2f}" for x in ours)
        + "; baseline (process): "
        + ", ".join(f"{x:.2f}" for x in baseline_process)
    )
    print(
        f"    mlreg promote (no quality)     {ours_s:6.2f} s   stages: "
        + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
    )
    print(
        f"    baseline script, whole process {baseline_process_s:6.2f} s   ratio "
        f"{ours_s / baseline_process_s:.2f} (target <= 1.15)"
    )
    print(
        f"    baseline timed from inside     {baseline_s:6.2f} s   ratio {ours_s / baseline_s:.2f} "
        "(the stricter reading)"
    )
    print(f"    quality stage, reported apart: a full promotion with it took {quality_s:.2f} s")
    if ONLY_A:
        return 0
    print(
        f"(b) {len(during):,} ensemble requests during {promotions} promotions: {failed} failed "
        f"(target 0); p99 before {p99(before):.1f} ms, during {p99(during):.1f} ms"
    )
    print(f"(c) promoting the serving version: median {statistics.median(noop):.2f} s (target < 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
