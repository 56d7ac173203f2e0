"""The quality gate's cost, side by side in one run on the local stack (issue 15).

Each round, interleaved so that a busy machine weighs on all three alike (every one a real swap of
image_model, a TensorFlow SavedModel, on the same tritonserver):

- `mlreg promote image_model --version N`            the full promotion WITH the quality gate
- `mlreg promote image_model --version N --skip-quality`   the same without it (the gate's share)
- `mlreg promote image_model --version N --skip-perf`      the gate without its performance check
  (issue 25: the check's cost is the difference with the first, target <= 3 s)
- the bare baseline of benchmarks/promote.py: copy + config + load_model + wait-until-ready

all timed as whole processes (Python start and imports included for both).  Target: with the gate
<= 1.5x the baseline.  Also one `--serve-as onnx` promotion with the gate (SavedModel serving ->
ONNX candidate, gated alone under a private name on the canary) and its quality stage's seconds.

    .venv/bin/python benchmarks/quality.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from promote import BASELINE  # noqa: E402  (the bare baseline, one definition)

from pipelines.devstack.stack import stack_down, stack_up  # noqa: E402
from registry.settings import Settings  # noqa: E402


def cli(env: dict[str, str], *args: str) -> tuple[float, dict[str, float]]:
    """Seconds of the whole process, and its stages' seconds (--json)."""
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mlreg", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"mlreg {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout)
    stages = doc.get("stages", []) if isinstance(doc, dict) else []
    return seconds, {s["stage"]: s["seconds"] for s in stages}


def baseline(repo: Path, url: str, number: int, source: Path) -> tuple[float, float]:
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", BASELINE, str(repo), url, str(number), str(source)],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - began, float(proc.stdout.strip())


def exported(env: dict[str, str], seed: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mlreg", "export", "image_model", "--seed", str(seed), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    return str(json.loads(proc.stdout)["versions"][0]["version"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-quality-"))
    env = {**os.environ, "MLREG_HOME": str(work / ".mlreg"), "MLREG_NO_PROGRESS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    settings = Settings.from_env(env=env)
    settings.local_repository.mkdir(parents=True)
    info = stack_up(settings, ui=False).info
    assert info is not None
    gated: list[float] = []
    bare: list[float] = []
    base_process: list[float] = []
    base_inside: list[float] = []
    gate_stage: list[float] = []
    no_perf: list[float] = []
    no_perf_stage: list[float] = []
    try:
        subprocess.run(
            [sys.executable, "-m", "mlreg", "export"], env=env, cwd=ROOT, check=True, capture_output=True
        )
        cli(env, "promote", "ensemble_multi_modal_model", "--version", "1", "--skip-quality")
        versions = [exported(env, seed) for seed in range(20, 20 + 3 * rounds + 1)]
        source = settings.home / "exports" / "image_model" / "1"  # the last export's folder
        for number in range(rounds):
            seconds, stages = cli(env, "promote", "image_model", "--version", versions[3 * number])
            gated.append(seconds)
            gate_stage.append(stages.get("quality", float("nan")))
            bare.append(
                cli(env, "promote", "image_model", "--version", versions[3 * number + 1], "--skip-quality")[0]
            )
            seconds, stages = cli(
                env, "promote", "image_model", "--version", versions[3 * number + 2], "--skip-perf"
            )
            no_perf.append(seconds)
            no_perf_stage.append(stages.get("quality", float("nan")))
            process, inside = baseline(settings.local_repository, info.grpc_url, 99 - number, source)
            base_process.append(process)
            base_inside.append(inside)
        # back to a registered version (the baseline wrote 99, 98, ...), then across platforms
        cli(env, "promote", "image_model", "--version", versions[-1], "--skip-quality")
        for number in range(rounds):
            shutil.rmtree(settings.local_repository / "image_model" / str(99 - number), ignore_errors=True)
        onnx_source = exported(env, 40)
        onnx_s, onnx_stages = cli(
            env, "promote", "image_model", "--version", onnx_source, "--serve-as", "onnx"
        )
    finally:
        stack_down(settings)
    show = ", ".join
    median = statistics.median
    print(f"rounds: {rounds}, interleaved; whole processes; seconds")
    for label, values in (
        ("promote WITH the gate", gated),
        ("  its quality stage", gate_stage),
        ("promote --skip-quality", bare),
        ("promote --skip-perf", no_perf),
        ("  its quality stage (no perf)", no_perf_stage),
        ("bare baseline (process)", base_process),
        ("bare baseline (inside)", base_inside),
    ):
        print(f"  {label:26} {median(values):6.2f}  ({show(f'{x:.2f}' for x in values)})")
    print(
        f"  ratio WITH gate / baseline {median(gated) / median(base_process):.2f} (target <= 1.5); "
        f"stricter, against the baseline timed inside: {median(gated) / median(base_inside):.2f}"
    )
    print(f"  the perf check's cost (WITH - --skip-perf) {median(gated) - median(no_perf):.2f} (target <= 3)")
    print(
        f"  --serve-as onnx WITH the gate: {onnx_s:.2f} s; stages: "
        + show(f"{k} {v:.2f}" for k, v in onnx_stages.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
