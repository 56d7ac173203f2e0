"""Benchmarks before and after a change, side by side in one run (issue 19).

Runs each named benchmark (``benchmarks/<name>.py``) of two source trees in turn, old, new, old,
new ... for ``--rounds`` rounds (so that a busy machine weighs on both alike), never two at once.
Each tree runs its OWN copy of the script with its own code: cwd = the tree, PYTHONPATH = the
tree (which wins over the venv's editable install), the same interpreter.  The figures each
script prints are parsed, keyed by their line's label, and shown side by side: old, new, the
ratio new / old (medians over the rounds), flagged where worse by more than ``--tolerance`` (5%)
and, for seconds, by more than ``--min-seconds`` (the scripts print 2 decimals: 0.01 -> 0.03 s is
no 3x).  Counts are shown, not judged; failed requests are flagged when they grow.

    mkdir /tmp/mlreg-old && git archive fde5c36 | tar -x -C /tmp/mlreg-old   # the old commit's tree
    .venv/bin/python benchmarks/compare.py --old /tmp/mlreg-old promote quality fleet
    .venv/bin/python benchmarks/compare.py --make-old fde5c36 --rounds 2 quality --args quality='--rounds 1'
    MLREG_BENCH_ONLY=a .venv/bin/python benchmarks/compare.py --old /tmp/mlreg-old promote  # (a) only
    .venv/bin/python benchmarks/compare.py --from-logs /tmp/mlreg-compare-XXXX quality  # re-read a run

``--args NAME='ARGS'`` passes ARGS to both versions of NAME; each option must be one that both
scripts declare (``add_argument``), else the comparison stops before running anything.  The
environment is passed through (e.g. MLREG_BENCH_ONLY), less the variables that would make both
trees share state or template (MLREG_HOME, MLREG_TEMPLATE_DIR, MLFLOW_TRACKING_URI, PYTHONPATH).

Both trees are byte-compiled first (a fresh archive has no .pyc files: its imports would be slower).
Each run gets a TMPDIR of its own, removed afterwards (promote.py and quality.py keep their
MLREG_HOME under mkdtemp and never delete it); processes a run leaves behind (found by a marker in
their environment) are reported and stopped, and a change to a tree's .mlreg/ is reported.  The
raw output of every run (stdout + stderr) is kept under /tmp/mlreg-compare-*/ (printed at the end).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("promote", "quality", "fleet", "fleet_scale", "control_key")
DROPPED_ENV = (
    "MLREG_HOME",
    "MLREG_TEMPLATE_DIR",
    "MLFLOW_TRACKING_URI",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
)
MARKER = "MLREG_COMPARE_RUN"
# a number as the scripts print it: 1.23, 10,123 (thousands), nan
N = r"(nan|-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"
# lower is better | not judged (counts; the bare baselines and the latency before promotions, which
# run no mlreg code: they show how busy the machine was) | failed requests (target 0)
LOWER, INFO, ZERO = "lower", "info", "zero"

Figure = tuple[str, float, str]  # label, value, kind
Handler = Callable[[re.Match[str]], list[Figure]]


def number(text: str) -> float:
    return float(text.replace(",", ""))


def named(*labels: tuple[str, str]) -> Handler:
    """One figure per group, in order: (label, kind) each."""
    return lambda m: [(label, number(m.group(i + 1)), kind) for i, (label, kind) in enumerate(labels)]


def stages(head: str, prefix: str, unit: str) -> Handler:
    """``<head seconds> ... stages: name 1.23, other 0.40``: the total and each stage."""

    def parse(m: re.Match[str]) -> list[Figure]:
        found: list[Figure] = [(head, number(m.group(1)), LOWER)]
        for part in m.group(2).split(","):
            name, _, value = part.strip().rpartition(" ")
            if name and re.fullmatch(N, value):
                found.append((f"{prefix}{name}{unit}", number(value), LOWER))
        return found

    return parse


def fleet_row(m: re.Match[str]) -> list[Figure]:
    where = f"{m.group(1)} replicas, max_parallel {m.group(2)}"
    return [
        (f"{where}: promotion s", number(m.group(3)), LOWER),
        (f"{where}: deploy+finalize s", number(m.group(4)), LOWER),
    ]


def fleet_ratio(m: re.Match[str]) -> list[Figure]:
    n = m.group(1)
    return [
        (f"{n} replicas: parallel / sequential", number(m.group(2)), LOWER),
        (f"{n} replicas: parallel / sequential (deploy+finalize)", number(m.group(3)), LOWER),
    ]


def quality_row(m: re.Match[str]) -> list[Figure]:
    label = m.group(1)
    return [(f"{label} s", number(m.group(2)), INFO if label.startswith("bare baseline") else LOWER)]


def labelled(m: re.Match[str]) -> list[Figure]:
    """``<label>  1.23 s`` | ``2.01 x`` | ``4 calls`` (fleet_scale); the bare baseline and counts
    are shown, not judged."""
    label, unit = m.group(1), m.group(3)
    kind = INFO if label.startswith("(b)") or unit == "calls" else LOWER
    return [(f"{label} {unit}", number(m.group(2)), kind)]


def control_key_row(m: re.Match[str]) -> list[Figure]:
    """``(a) ...  1.23 s`` | ``(b) ...  2.01 ms`` | ``... 1.01 x`` (control_key): all judged."""
    return [(f"{m.group(1)} {m.group(3)}", number(m.group(2)), LOWER)]


# per benchmark: (pattern searched in each line, its figures); None: a line known to hold no figure
RULES: dict[str, list[tuple[str, Handler | None]]] = {
    "promote": [
        (r"^\(a\) medians of", None),  # the single runs, repeated as medians below
        (
            rf"mlreg promote \(no quality\)\s+{N} s\s+stages: (.*)$",
            stages("mlreg promote, no quality s", "  stage ", " s"),
        ),
        (
            rf"baseline script, whole process\s+{N} s\s+ratio {N}",
            named(("baseline script, whole process s", INFO), ("ratio promote / baseline (process)", LOWER)),
        ),
        (
            rf"baseline timed from inside\s+{N} s\s+ratio {N}",
            named(("baseline timed from inside s", INFO), ("ratio promote / baseline (inside)", LOWER)),
        ),
        (rf"a full promotion with it took {N} s", named(("promote with the quality stage s", LOWER))),
        (
            rf"^\(b\) {N} ensemble requests during {N} promotions: {N} failed"
            rf".*p99 before {N} ms, during {N} ms",
            named(
                ("(b) requests during promotions", INFO),
                ("(b) promotions", INFO),
                ("(b) failed requests", ZERO),
                ("(b) p99 before ms", INFO),
                ("(b) p99 during ms", LOWER),
            ),
        ),
        (rf"^\(c\) promoting the serving version: median {N} s", named(("(c) no-op promotion s", LOWER))),
    ],
    "quality": [
        (r"^rounds: ", None),
        (
            rf"ratio WITH gate / baseline {N} .*timed inside: {N}",
            named(
                ("ratio WITH gate / baseline (process)", LOWER),
                ("ratio WITH gate / baseline (inside)", LOWER),
            ),
        ),
        (
            rf"--serve-as onnx WITH the gate: {N} s; stages: (.*)$",
            stages("--serve-as onnx WITH the gate s", "  onnx stage ", " s"),
        ),
        (rf"^\s*(.+?)\s+{N}\s+\([^()]*\)$", quality_row),
    ],
    "fleet": [
        (r"^\s*replicas\s+max_parallel", None),
        (rf"^\s*(\d+)\s+(\d+)\s+{N}\s+{N}\s*$", fleet_row),
        (rf"^(\d+) replicas: parallel / sequential = {N}x \(deploy\+finalize {N}x\)", fleet_ratio),
        (
            rf"^during {N} promotions over (?:\d+) replicas: {N} failed of {N} requests; "
            rf"p99 {N} ms during vs {N} ms before",
            named(
                ("(b) promotions", INFO),
                ("(b) failed requests", ZERO),
                ("(b) requests during promotions", INFO),
                ("(b) p99 during ms", LOWER),
                ("(b) p99 before ms", INFO),
            ),
        ),
        (
            rf"^status --env over (?:\d+) replicas: {N} s \(the \d+ probes alone, serially: {N} s\)",
            named(("status --env s", LOWER), ("the probes alone, serially s", LOWER)),
        ),
    ],
    "fleet_scale": [
        (r"^fleet_scale: \d+ replicas", None),
        (rf"^(\([abc]\) .+?)\s+{N} (s|x|calls)$", labelled),
    ],
    "control_key": [
        (r"^control_key: ", None),
        (rf"^(\([ab]\) .+?)\s+{N} (s|ms|x)$", control_key_row),
    ],
}


def parse(name: str, output: str) -> tuple[list[Figure], list[str]]:
    """The figures of one run's stdout, and the lines with numbers that no rule knows."""
    figures: list[Figure] = []
    unknown: list[str] = []
    for line in output.splitlines():
        for pattern, handler in RULES.get(name, []):
            m = re.search(pattern, line)
            if m:
                figures += handler(m) if handler else []
                break
        else:
            if re.search(r"\d", line):
                unknown.append(line)
    return figures, unknown


def declared_options(script: Path) -> set[str]:
    """The option strings a script declares with ``add_argument`` (none: it reads no arguments)."""
    options: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                    options.add(str(arg.value))
    return options


def check_args(name: str, args: list[str], trees: dict[str, Path]) -> None:
    for side, tree in trees.items():
        accepted = declared_options(tree / "benchmarks" / f"{name}.py")
        for arg in args:
            option = arg.split("=", 1)[0]
            if arg.startswith("-") and option not in accepted:
                raise SystemExit(
                    f"--args {name}: the {side} tree's benchmarks/{name}.py does not take {option} "
                    f"(it takes: {', '.join(sorted(accepted)) or 'no arguments'})"
                )


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment holds ``MARKER=marker``: what a run started and left running."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def stop_leftovers(marker: str, label: str) -> None:
    pids = marked_pids(marker)
    if not pids:
        return
    print(f"    ! {label} left {len(pids)} process(es) running: {pids}; stopping them (SIGTERM)")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while (pids := marked_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def state_of(tree: Path) -> set[tuple[str, int]]:
    """The tree's .mlreg/ (the default MLREG_HOME) at the top: (name, mtime) of each entry."""
    home = tree / ".mlreg"
    if not home.is_dir():
        return set()
    return {(p.name, p.stat().st_mtime_ns) for p in home.iterdir()}


@dataclass
class Run:
    bench: str
    side: str
    round: int
    seconds: float
    rc: int
    log: Path
    figures: list[Figure] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def run_one(
    bench: str, side: str, number: int, tree: Path, args: list[str], logs: Path, timeout: float | None
) -> Run:
    marker = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix=f"mlreg-cmp-{side}-"))
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update({"PYTHONPATH": str(tree), "TMPDIR": str(tmp), MARKER: marker})
    command = [sys.executable, str(tree / "benchmarks" / f"{bench}.py"), *args]
    log = logs / f"{bench}-{number}-{side}.log"
    before = state_of(tree)
    load = os.getloadavg()[0]
    print(
        f"  [{bench} round {number} {side}] {shlex.join(command)}  (cwd {tree}, load {load:.1f})", flush=True
    )
    began = time.perf_counter()
    try:
        proc = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = (
            124,
            _text(exc.stdout),
            _text(exc.stderr) + f"\n[compare] timed out after {timeout} s\n",
        )
    seconds = time.perf_counter() - began
    stop_leftovers(marker, f"{bench} ({side})")
    shutil.rmtree(tmp, ignore_errors=True)
    log.write_text(
        f"$ {shlex.join(command)}\n# cwd {tree}, rc {rc}, {seconds:.1f} s\n--- stdout\n{out}--- stderr\n{err}"
    )
    for line in out.splitlines():
        print(f"    | {line}")
    if rc != 0:
        print(f"    ! exit status {rc}; the last lines of stderr:")
        for line in err.strip().splitlines()[-15:]:
            print(f"    ! {line}")
    if state_of(tree) != before:
        print(f"    ! {tree / '.mlreg'} changed during the run (state the next run may see)")
    run = Run(bench, side, number, seconds, rc, log)
    run.figures, run.unknown = parse(bench, out)
    for line in run.unknown:
        print(f"    ? no rule for this line, not compared: {line.strip()}")
    print(f"    {seconds:.1f} s, {len(run.figures)} figures parsed", flush=True)
    return run


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def collect(runs: list[Run], side: str) -> dict[str, tuple[list[float], str]]:
    values: dict[str, tuple[list[float], str]] = {}
    for run in runs:
        if run.side == side and run.rc == 0:
            for label, value, kind in run.figures:
                values.setdefault(label, ([], kind))[0].append(value)
    return values


def cell(values: list[float] | None) -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    spread = f" [{min(values):g}..{max(values):g}]" if len(values) > 1 else ""
    return f"{middle:.3f}".rstrip("0").rstrip(".") + spread


def judge(
    label: str, old: list[float] | None, new: list[float] | None, kind: str, limits: Limits
) -> tuple[str, bool]:
    """The ratio new / old as shown, and whether it is a regression beyond the tolerance (seconds:
    and by more than ``limits.seconds``, as the scripts print 2 decimals: 0.01 -> 0.03 is no 3x)."""
    if not old or not new:
        return "-", False
    a, b = statistics.median(old), statistics.median(new)
    if kind == ZERO:
        return ("=" if a == b else f"{a:g} -> {b:g}"), b > a
    if a == 0 or a != a or b != b:
        return "-", False
    ratio = b / a
    small = label.endswith(" s") and b - a <= limits.seconds
    return f"{ratio:.3f}", kind == LOWER and ratio > 1 + limits.tolerance and not small


@dataclass(frozen=True)
class Limits:
    tolerance: float  # flag new / old above 1 + this
    seconds: float  # ... and, for figures in seconds, new - old above this


def table(bench: str, runs: list[Run], limits: Limits) -> int:
    """Prints the side-by-side table of one benchmark; returns how many figures are flagged."""
    old, new = collect(runs, "old"), collect(runs, "new")
    labels = list(dict.fromkeys([*old, *new]))
    times = {side: [r.seconds for r in runs if r.side == side] for side in ("old", "new")}
    width = max([len(label) for label in labels] + [30])
    print(f"\n{bench}: run took old {cell(times['old'])} s, new {cell(times['new'])} s (whole script)")
    print(f"  {'figure':{width}}  {'old':>18}  {'new':>18}  {'new/old':>9}")
    flagged = 0
    for label in labels:
        kind = (old.get(label) or new[label])[1]
        o, n = old.get(label, (None, kind))[0], new.get(label, (None, kind))[0]
        ratio, bad = judge(label, o, n, kind, limits)
        flagged += bad
        note = "  <-- worse" if bad else ("  (not judged)" if kind == INFO else "")
        print(f"  {label:{width}}  {cell(o):>18}  {cell(n):>18}  {ratio:>9}{note}")
    failed = [r for r in runs if r.rc != 0]
    for r in failed:
        print(f"  ! {r.side} round {r.round} failed (exit {r.rc}): {r.log}")
    return flagged + len(failed)


def make_old(commit: str) -> Path:
    tree = Path(tempfile.mkdtemp(prefix=f"mlreg-old-{commit[:12]}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    print(f"old tree: git archive {commit} -> {tree}")
    return tree


def bench_args(given: list[str], names: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {name: [] for name in names}
    for item in given:
        name, sep, args = item.partition("=")
        if not sep or name not in found:
            raise SystemExit(f"--args {item!r}: expected NAME='ARGS' with NAME one of {', '.join(names)}")
        found[name] += shlex.split(args)
    return found


def plan(names: list[str], rounds: int) -> Iterator[tuple[str, int, str]]:
    for name in names:
        for number in range(1, rounds + 1):
            yield name, number, "old"
            yield name, number, "new"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "benchmarks", nargs="+", choices=BENCHMARKS, metavar="BENCH", help=", ".join(BENCHMARKS)
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--old", metavar="TREE", help="a source tree of the old commit (git archive | tar -x)"
    )
    source.add_argument("--make-old", metavar="COMMIT", help="git archive COMMIT into a temporary folder")
    source.add_argument("--from-logs", metavar="DIR", help="run nothing: tables of an earlier run's outputs")
    parser.add_argument("--new", metavar="TREE", default=str(ROOT), help="default: this checkout")
    parser.add_argument("--rounds", type=int, default=1, help="old/new pairs per benchmark (default 1)")
    parser.add_argument("--args", action="append", default=[], metavar="NAME='ARGS'", help="passed to both")
    parser.add_argument("--tolerance", type=float, default=0.05, help="flag new/old above 1 + this (0.05)")
    parser.add_argument(
        "--min-seconds", type=float, default=0.05, help="seconds figures: flag only if new - old exceeds this"
    )
    parser.add_argument("--timeout", type=float, help="seconds for one run of one script (default: none)")
    return parser.parse_args()


def from_logs(folder: Path) -> list[Run]:
    """The runs of an earlier comparison, read back from its raw outputs (to check the parse)."""
    runs = []
    for log in sorted(folder.glob("*-*-*.log"), key=lambda p: p.stat().st_mtime):
        bench, number, side = log.stem.rsplit("-", 2)
        text = log.read_text()
        head = re.search(r"^# cwd .*, rc (-?\d+), ([\d.]+) s$", text, re.M)
        out = text.partition("\n--- stdout\n")[2].rpartition("--- stderr\n")[0]
        if head is None or bench not in RULES:
            continue
        run = Run(bench, side, int(number), float(head.group(2)), int(head.group(1)), log)
        run.figures, run.unknown = parse(bench, out)
        runs.append(run)
    return runs


def run_all(args: argparse.Namespace, names: list[str]) -> tuple[list[Run], Path]:
    trees = {
        "old": Path(args.old).resolve() if args.old else make_old(args.make_old),
        "new": Path(args.new).resolve(),
    }
    for side, tree in trees.items():
        missing = [n for n in names if not (tree / "benchmarks" / f"{n}.py").is_file()]
        if missing:
            raise SystemExit(f"the {side} tree {tree} has no benchmarks/{missing[0]}.py")
    extra = bench_args(args.args, names)
    for name in names:
        check_args(name, extra[name], trees)
    for tree in trees.values():  # both start with .pyc files (a fresh archive has none: slower imports)
        packages = [str(tree / d) for d in ("mlreg", "registry", "pipelines", "benchmarks")]
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", *packages], capture_output=True, check=False
        )
    logs = Path(tempfile.mkdtemp(prefix="mlreg-compare-"))
    print(f"old: {trees['old']}\nnew: {trees['new']}\nraw outputs: {logs}\n")
    runs = [
        run_one(n, side, k, trees[side], extra[n], logs, args.timeout)
        for n, k, side in plan(names, args.rounds)
    ]
    return runs, logs


def main() -> int:
    args = arguments()
    names = list(dict.fromkeys(args.benchmarks))
    runs, logs = (
        (from_logs(Path(args.from_logs)), Path(args.from_logs)) if args.from_logs else run_all(args, names)
    )
    limits = Limits(args.tolerance, args.min_seconds)
    flagged = sum(table(n, [r for r in runs if r.bench == n], limits) for n in names)
    print(
        f"\n{flagged} figure(s) worse by more than {args.tolerance:.0%} (seconds: and by more than "
        f"{args.min_seconds:g} s) or failed runs; medians of the rounds, [min..max] where more; raw "
        f"outputs in {logs}; load average (1 min) now {os.getloadavg()[0]:.1f}"
    )
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
