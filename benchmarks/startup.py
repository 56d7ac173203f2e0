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
                                               pydantic (``typer._adapters``); mlreg/cli/startup.py
                                               converts plain str/int/Path values itself, so this
                                               row is what the CLI no longer pays

    .venv/bin/python benchmarks/startup.py [--runs 15] [--built PATH]
    .venv/bin/python benchmarks/startup.py --compare [REV] [--runs 15] [--built PATH]
    .venv/bin/python benchmarks/startup.py --registry [--project PATH] [--compare [REV]] [--runs 7]

``--registry`` (issue 48, "answers in a second") times the read-only commands on an embedded
registry: ``mlreg status``, ``history``, ``show``, ``versions``, ``alias ls`` and a ``promote``
whose model name has a typo (it must refuse, "did you mean", exit 4), each beside ``python -c pass``
in the same run, with its ratio to it (target: <= 1 s and <= 10x).  The project (``--project``, else made once
in a temporary folder: two of the template's python models registered by ``mlreg register`` and
three promotion runs recorded through the MLflow adapter, ~30 s) has no stack running, so
``status`` reads the registry and the store and finds no Triton.  With ``--compare`` the same rows
run for REV's tree and this checkout, interleaved.

Without ``--built`` the template is built once into a temporary folder (exports the Keras
models: ~15 s).

``--compare [REV]`` is before/after in one run: REV's ``mlreg``, ``registry`` and ``pipelines``
(default: the merge base of HEAD and ``main``, which is HEAD on ``main``; a folder holding such a
tree is taken as it is) are extracted with ``git archive`` into a temporary folder, and
``mlreg --help`` and ``mlreg validate model_repository_template`` (this checkout's template for
both sides; the built one too with ``--built``) run as whole processes for each tree, interleaved,
N runs each; median, min and CPU per tree side by side, and this checkout once more as a user
runs it (through the editable install, no PYTHONPATH).  Both sides run the same venv's ``mlreg``
script with PYTHONPATH set to their own tree (its entries come before the editable install's
finder) and a neutral cwd; each side's ``mlreg.__file__`` is printed to prove which code ran.
Both trees are byte-compiled first (``compileall``): a fresh archive, or any tree under
PYTHONDONTWRITEBYTECODE, would otherwise compile its sources on every run and look ~2x slower.
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
NO_CLI = (
    "import sys\nfrom pathlib import Path\nfrom registry.contracts.validate import validate_path\n"
    "sys.exit(1 if validate_path(Path(sys.argv[1])).errors else 0)\n"
)


def mlreg_command() -> list[str]:
    script = Path(sys.executable).parent / "mlreg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mlreg"]


def run_once(command: list[str], env: dict[str, str], expect: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """Wall-clock seconds and CPU seconds (user + system) of one whole process that must exit
    with one of ``expect``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    # cwd outside the checkout: `python -c` puts the cwd first on sys.path (--compare must win)
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=NEUTRAL)
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in expect:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


Plan = list[tuple[str, list[str], dict[str, str]]]  # (label, command, its environment)


def measure(
    plan: Plan, runs: int, expect: dict[str, tuple[int, ...]] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """Each command of ``plan`` ``runs`` times, in turn (after one warm-up each); ``expect``: a
    label -> the exit statuses its command may end with (else 0)."""
    expect = expect or {}
    times: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in plan}
    for label, command, command_env in plan:  # one warm-up each (page cache, .pyc files)
        run_once(command, command_env, expect.get(label, (0,)))
    for _ in range(runs):
        for label, command, command_env in plan:
            times[label].append(run_once(command, command_env, expect.get(label, (0,))))
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


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def default_revision() -> str:
    """The merge base of HEAD and ``main`` (HEAD itself on ``main``, or where there is no ``main``)."""
    try:
        return git("merge-base", "HEAD", "main")
    except subprocess.CalledProcessError:
        return git("rev-parse", "HEAD")


def source_tree(revision: str, into: Path) -> tuple[Path, str]:
    """``revision``'s packages extracted under ``into`` (or ``revision`` itself if it is a folder)
    and the name to show for it."""
    if Path(revision).is_dir():
        return Path(revision).resolve(), str(Path(revision).resolve())
    commit = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, *PACKAGES], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into, f"{revision} ({commit[:9]})" if not commit.startswith(revision) else commit[:9]


PACKAGES = ("mlreg", "registry", "pipelines")
WHICH = "import mlreg, mlreg.cli.main, registry, pipelines; print(mlreg.__file__)"


def compare(
    revision: str, runs: int, built: str | None, env: dict[str, str], reads: Reads | None = None
) -> int:
    """``revision`` and this checkout, the CLI rows for each (``reads``: the registry's rows
    instead), interleaved in one run."""
    env = {**env, **reads.env} if reads is not None else env
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-compare-") as folder:
        other, name = source_tree(revision, Path(folder))
        sides = {
            f"before: {name}": {**env, "PYTHONPATH": str(other)},
            "after: this checkout": {**env, "PYTHONPATH": str(ROOT)},
            # as a user runs it: through the editable install, no PYTHONPATH
            "after, as installed": env,
        }
        py, mlreg = sys.executable, mlreg_command()
        # bytecode for both trees up front: a tree whose .pyc files are missing or stale (a fresh
        # archive; PYTHONDONTWRITEBYTECODE set) compiles its sources on every run (~x2)
        for tree in (other, ROOT):
            compiled = [py, "-m", "compileall", "-q", *(str(tree / package) for package in PACKAGES)]
            subprocess.run(compiled, check=True, stdout=subprocess.DEVNULL)
        template = ROOT / "model_repository_template"
        commands = {
            "mlreg --help": ["--help"],
            "mlreg validate model_repository_template": ["validate", str(template)],
        }
        if built:
            commands["mlreg validate <built template>"] = ["validate", str(Path(built).resolve())]
        expect: dict[str, tuple[int, ...]] = {}
        if reads is not None:
            commands = reads.commands
        for side, side_env in list(sides.items()):
            proc = subprocess.run(
                [py, "-c", WHICH], capture_output=True, text=True, check=True, env=side_env, cwd=NEUTRAL
            )
            print(f"{side}: mlreg imported from {proc.stdout.strip()}")
            if side_env is env and not proc.stdout.startswith(str(ROOT)):
                del sides[side]  # installed from elsewhere: not this checkout
        plan: Plan = [("python -c pass", [py, "-c", "pass"], env)]
        plan += [
            (f"{label} | {side}", [*mlreg, *args], side_env)
            for label, args in commands.items()
            for side, side_env in sides.items()
        ]
        if reads is not None:
            expect = {f"{label} | {side}": reads.exits(label, side) for label in commands for side in sides}
        times = measure(plan, runs, expect)
    print(f"whole processes, {runs} runs each (interleaved), the same venv ({py}); seconds")
    print(f"{'':42s}" + "".join(f" {side[:30]:>30s}" for side in sides))
    print(f"{'':42s}" + " {:>30s}".format("wall median / wall min / CPU") * len(sides) + "  after/before")
    base = times.pop("python -c pass")
    print(f"  {'python -c pass':40s} {cell(base):>30s}")
    before, after = list(sides)[:2]
    for label in commands:
        cells = "".join(f" {cell(times[f'{label} | {side}']):>30s}" for side in sides)
        old, new = times[f"{label} | {before}"], times[f"{label} | {after}"]
        change = statistics.median(w for w, _ in new) / statistics.median(w for w, _ in old) - 1
        ratio = statistics.median(w for w, _ in new) / statistics.median(w for w, _ in base)
        print(f"  {label:40s}{cells}  {change:+.0%}  (after: {ratio:.1f}x python -c pass)")
    print(
        f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}; CPU time is steadier on a busy machine"
    )
    return 0


SEED_PROMOTIONS = (  # three promotion runs, as pipelines/promote/record.py records them
    "import sys\nfrom registry.mlflow import MlflowRegistry\n"
    "from registry.mlflow.model import PROMOTIONS_EXPERIMENT\nfrom registry.settings import Settings\n"
    "registry = MlflowRegistry(Settings.from_env())\n"
    "for before, to in (('none', '1'), ('1', '1'), ('1', '1')):\n"
    "    tags = {'mlreg_model': sys.argv[1], 'mlreg_version': to, 'environment': 'local',"
    " 'result': 'promoted', 'user': 'bench'}\n"
    "    run = registry.runs.start_run(PROMOTIONS_EXPERIMENT, f'{sys.argv[1]}-v{to}-local', tags)\n"
    "    registry.runs.log(run, {'from_version': before, 'to_version': to}, {})\n"
    "    registry.runs.finish_run(run, True)\n"
)
REGISTERED = ("table_data_preprocess", "image_preprocess")  # python models: no export, no TensorFlow


class Reads:
    """The registry's rows (``--registry``): their commands, environment and exit statuses."""

    def __init__(self, project: Path) -> None:
        model = REGISTERED[0]
        self.env = {"MLREG_HOME": str(project / ".mlreg")}
        self.commands = {
            f"mlreg status {model}": ["status", model],
            f"mlreg history {model}": ["history", model],
            f"mlreg show {model} -V 1": ["show", model, "-V", "1"],
            f"mlreg versions {model}": ["versions", model],
            f"mlreg alias ls {model}": ["alias", "ls", model],
            f"mlreg promote {model}s --version 1 (typo)": ["promote", f"{model}s", "--version", "1"],
        }

    def exits(self, label: str, side: str = "") -> tuple[int, ...]:
        if label.startswith("mlreg status"):
            return (1,)  # drift: no stack runs, so nothing serves what the registry says
        if label.startswith("mlreg alias ls") and side.startswith("before"):
            return (0, 2)  # 2: no 'alias ls' before issue 48
        if label.endswith("(typo)"):
            # 4: the registry's refusal ("did you mean"); before issue 48 the stack's came first (8)
            return (4, 8) if side.startswith("before") else (4,)
        return (0,)


def registry_project(given: str | None, env: dict[str, str]) -> Path:
    """A project whose embedded registry holds ``REGISTERED`` (version 1 each) and three promotion
    runs of the first; ``given`` is taken as it is."""
    if given:
        return Path(given).resolve()
    project = Path(tempfile.mkdtemp(prefix="mlreg-bench-reads-"))
    run_env = {**env, "MLREG_HOME": str(project / ".mlreg")}
    template = ROOT / "model_repository_template"
    for model in REGISTERED:
        subprocess.run([*mlreg_command(), "register", model, str(template / model)], env=run_env, check=True)
    subprocess.run([sys.executable, "-c", SEED_PROMOTIONS, REGISTERED[0]], env=run_env, check=True)
    return project


def registry_rows(runs: int, project: Path, env: dict[str, str]) -> int:
    """The registry's rows beside ``python -c pass``, with each one's ratio to it."""
    reads = Reads(project)
    env = {**env, **reads.env}
    py, mlreg = sys.executable, mlreg_command()
    plan: Plan = [("python -c pass", [py, "-c", "pass"], env), ("mlreg --help", [*mlreg, "--help"], env)]
    plan += [(label, [*mlreg, *args], env) for label, args in reads.commands.items()]
    times = measure(plan, runs, {label: reads.exits(label) for label in reads.commands})
    base = statistics.median(w for w, _ in times["python -c pass"])
    print(f"whole processes, {runs} runs each (interleaved), project {project} (no stack running)")
    print(f"{'':52s} {'wall median':>11s} {'wall min':>9s} {'CPU median':>11s} {'x pass':>7s}")
    for label, values in times.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        low = min(w for w, _ in values)
        target = "  (target <= 1 s and <= 10x)" if label in reads.commands else ""
        print(f"  {label:50s} {wall:9.3f} s {low:7.3f} s {cpu:9.3f} s {wall / base:6.1f}x{target}")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    return 0


def cell(values: list[tuple[float, float]]) -> str:
    wall = statistics.median(w for w, _ in values)
    cpu = statistics.median(c for _, c in values)
    return f"{wall:.3f} / {min(w for w, _ in values):.3f} / {cpu:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--built", help="an already built template (skips the ~15 s build)")
    parser.add_argument(
        "--compare",
        metavar="REV",
        nargs="?",
        const="",
        help="this checkout against REV (default: the merge base of HEAD and main; or a folder "
        "holding mlreg/registry/pipelines): `mlreg --help` and `mlreg validate` side by side",
    )
    parser.add_argument(
        "--registry",
        action="store_true",
        help="the read-only commands on an embedded registry (status, history, show, versions, "
        "a typo'd promote) beside python -c pass",
    )
    parser.add_argument("--project", help="with --registry: a project whose .mlreg holds the registry")
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MLREG_NO_PROGRESS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own embedded registry
    reads = Reads(registry_project(args.project, env)) if args.registry else None
    if args.compare is not None:
        return compare(args.compare or default_revision(), args.runs, args.built, env, reads)
    if reads is not None:
        return registry_rows(args.runs, Path(reads.env["MLREG_HOME"]).parent, env)
    built = built_template(args.built)
    py, mlreg = sys.executable, mlreg_command()
    commands = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import onnx, google.protobuf"': [py, "-c", "import onnx, google.protobuf"],
        "mlreg --help": [*mlreg, "--help"],
        "mlreg validate <built template>": [*mlreg, "validate", str(built)],
        "validate_path(<built template>), no CLI": [py, "-c", NO_CLI, str(built)],
        "python -c 'import typer, typer._adapters'": [py, "-c", "import typer, typer._adapters"],
    }
    times = measure([(label, command, env) for label, command in commands.items()], args.runs)
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
