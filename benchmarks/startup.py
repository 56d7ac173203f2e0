"""Start-up cost of the CLI, side by side with its baselines, in one run (issue 9).

Each command is a whole process, run N times in turn (interleaved, so that a busy machine
slows all of them alike); the medians are printed side by side:

- ``python -c pass``                          the interpreter alone (same venv)
- ``python -c "import onnx, google.protobuf"`` what reading ONNX through the onnx package costs
- ``mlreg --help``                            target < 0.1 s
- ``mlreg validate <built template>``         target < 0.15 s, TensorFlow/grpc/onnx never imported
- the same validation without the CLI          ``validate_path`` in a bare process: what the CLI
                                               layer (typer, its pydantic coercion) adds on top
- ``import typer, typer._adapters``             typer 0.29 coerces every non-bool parameter with
                                               pydantic (``typer._adapters``)

    .venv/bin/python benchmarks/startup.py [--runs 15] [--built PATH] [--compare TREE]

``--compare TREE`` times the two validation rows again with another source tree on PYTHONPATH
(before/after in one run), e.g. ``git archive fad4c77 mlreg registry pipelines | tar -x -C TREE``.

Without ``--built`` the template is built once into a temporary folder (exports the Keras
models: ~15 s).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAVY = ("tensorflow", "mlflow", "boto3", "grpc", "onnx", "tritonclient.grpc")
# `mlreg validate` in-process through the CLI entry, then a look at sys.modules (not timed apart).
VALIDATE_CHECK = (
    "import sys\nfrom mlreg.cli.main import main\nsys.argv = ['mlreg', 'validate', sys.argv[1]]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
)
NEUTRAL = tempfile.gettempdir()
COMPARED = "<built template>"  # the rows timed again under --compare
NO_CLI = (
    "import sys\nfrom pathlib import Path\nfrom registry.contracts.validate import validate_path\n"
    "sys.exit(1 if validate_path(Path(sys.argv[1])).errors else 0)\n"
)


def mlreg_command() -> list[str]:
    script = Path(sys.executable).parent / "mlreg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mlreg"]


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock seconds and CPU seconds (user + system) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    # cwd outside the checkout: `python -c` puts the cwd first on sys.path (--compare must win)
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=NEUTRAL)
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def measure(
    commands: dict[str, list[str]], runs: int, env: dict[str, str], other: dict[str, str] | None
) -> dict[str, list[tuple[float, float]]]:
    """Each command ``runs`` times, in turn; with ``other``, the mlreg rows also under that env."""
    plan = [(label, command, env) for label, command in commands.items()]
    if other is not None:
        compared = [(label, command) for label, command in commands.items() if COMPARED in label]
        plan += [(f"{label} [compare]", command, other) for label, command in compared]
    times: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in plan}
    for _, command, command_env in plan:  # one warm-up each (page cache, .pyc files)
        run_once(command, command_env)
    for _ in range(runs):
        for label, command, command_env in plan:
            times[label].append(run_once(command, command_env))
    return times


def report(times: dict[str, list[tuple[float, float]]], targets: dict[str, float]) -> None:
    base = statistics.median(wall for wall, _ in times["python -c pass"])
    print(f"{'':52s} {'wall median':>11s} {'wall min':>9s} {'- pass':>8s} {'CPU median':>11s}")
    for label, values in times.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        low = min(w for w, _ in values)
        target = f"  (target < {targets[label]})" if label in targets else ""
        print(f"  {label:50s} {wall:9.3f} s {low:7.3f} s {wall - base:6.3f} s {cpu:9.3f} s{target}")


def built_template(given: str | None) -> Path:
    if given:
        return Path(given).resolve()
    from registry import template
    from registry.settings import Settings

    out = Path(tempfile.mkdtemp(prefix="mlreg-bench-startup-")) / "built"
    template.build(Settings.from_env().template_dir, out, device="cpu", force=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--built", help="an already built template (skips the ~15 s build)")
    parser.add_argument(
        "--compare",
        metavar="TREE",
        help="another source tree (e.g. `git archive REV mlreg registry pipelines`): its mlreg rows "
        "are timed in the same run (PYTHONPATH=TREE)",
    )
    args = parser.parse_args()
    built = built_template(args.built)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MLREG_NO_PROGRESS": "1"}
    py, mlreg = sys.executable, mlreg_command()
    commands = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import onnx, google.protobuf"': [py, "-c", "import onnx, google.protobuf"],
        "mlreg --help": [*mlreg, "--help"],
        "mlreg validate <built template>": [*mlreg, "validate", str(built)],
        "validate_path(<built template>), no CLI": [py, "-c", NO_CLI, str(built)],
        "python -c 'import typer, typer._adapters'": [py, "-c", "import typer, typer._adapters"],
    }
    other = {**env, "PYTHONPATH": str(Path(args.compare).resolve())} if args.compare else None
    times = measure(commands, args.runs, env, other)
    print(f"whole processes, {args.runs} runs each (interleaved), template: {built}")
    report(times, {"mlreg --help": 0.1, "mlreg validate <built template>": 0.15})
    print(
        f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}; CPU time is steadier on a busy machine"
    )
    heavy = subprocess.run(
        [py, "-c", VALIDATE_CHECK, str(built)], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    print(f"heavy modules imported by `mlreg validate`: {heavy.splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
