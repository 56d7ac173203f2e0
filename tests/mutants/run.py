"""The guarantee mutants (tests/mutants/mutants.toml), applied one at a time to a copy of the tree.

``make mutants`` runs this: each mutant is the smallest change that breaks one guarantee the README
states (a condition inverted, a restore skipped); the tests it names must fail with it.  The tree
this runs from is never written: its tracked and untracked (not ignored) files are copied into a
temporary folder (``.venv``, ``.git`` and ``.mlreg`` left out), each mutant is applied there, its
tests run there with that folder first on ``sys.path`` -- the project's ``.venv`` holds an editable
install of the working tree, so a guard plugin (``_mutant_guard``) checks that ``registry``,
``pipelines``, ``mlreg`` and the mutated module itself are imported from the copy -- and the copy is
deleted at the end.  ``--jobs N`` (default: the machine's cores, at most 4) runs N mutants at once,
each in a copy of its own (a mutant is applied to one copy while others run theirs: no two mutants
ever share a tree), and the baseline's test files split over them.

First the named tests run once on the unmutated copy (a test that fails there would "kill" every
mutant).  A mutant whose search text is not found exactly once in its file is *stale* and fails the
run, as does one that survives (its tests pass) or errors (pytest could not run them).

    python tests/mutants/run.py [--only ID ...] [--list] [--keep] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).resolve().with_name("mutants.toml")
# A feature adds its guarantees' mutants in its own file beside the list (``<feature>.toml``, the
# same table): read after mutants.toml, in name order; ids are unique across all of them.
HERE = LIST.parent
LEFT_OUT = (".venv", ".git", ".mlreg")  # never copied: the environment, history, local state
PER_MUTANT_S = 300  # one mutant's tests; a hang is an error, never a kill
BASELINE_S = 1800  # one copy's share of every named test, unmutated (each test bounded as above)
# Mutants run at once, each in its own copy: a mutant's pytest is mostly one process's imports and
# set-up, so two of them keep two cores busy where one left the other idle.
JOBS = min(os.cpu_count() or 1, 4)
GUARD = '''
"""Loaded by tests/mutants/run.py: the modules under test must be the copy's, not the editable
install's (the working tree another process may be editing)."""
import importlib
import os
from pathlib import Path

import pytest


def pytest_sessionstart(session):
    root = Path(os.environ["MLREG_MUTANT_ROOT"]).resolve()
    names = ["registry", "pipelines", "mlreg"] + os.environ.get("MLREG_MUTANT_MODULE", "").split()
    for name in names:
        where = Path(importlib.import_module(name).__file__).resolve()
        if not where.is_relative_to(root):
            pytest.exit(f"mutant guard: {name} imported from {where}, not from the copy {root}", 3)
'''


@dataclass
class Mutant:
    id: str
    guarantee: str
    file: str
    search: str
    replace: str
    tests: list[str]
    integration: str = ""  # why an integration test is needed to kill it (empty: unit tests do)
    outcome: str = ""
    killed_by: str = ""
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)

    @property
    def module(self) -> str:
        """The mutated module's import name, which the guard checks is the copy's; none for a script
        outside the packages (``.ci/``: its tests run it by its path in the copy)."""
        if any(part.startswith(".") for part in self.file.split("/")):
            return ""
        return self.file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def lists(here: Path = HERE) -> list[Path]:
    """mutants.toml, then every other ``*.toml`` beside it, in name order."""
    others = sorted(p for p in here.glob("*.toml") if p.name != LIST.name)
    return [here / LIST.name, *others]


def load(path: Path | None = None) -> list[Mutant]:
    paths = [path] if path is not None else lists()
    entries = [entry for p in paths for entry in tomllib.loads(p.read_text()).get("mutant", [])]
    mutants = [Mutant(**entry) for entry in entries]
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"{HERE}: duplicate mutant ids: {', '.join(duplicates)}")
    return mutants


def tracked_files(root: Path) -> list[str]:
    """The tree's tracked and untracked (not ignored) files; outside a git checkout (an exported
    tree), every file but caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
    )
    if listed.returncode == 0:
        names = [name for name in listed.stdout.decode().split("\0") if name]
    else:
        found = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
        names = [str(p) for p in found if "__pycache__" not in p.parts]
    return [n for n in names if n.split("/", 1)[0] not in LEFT_OUT and (root / n).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    for name in tracked_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target, follow_symlinks=False)


def stale(mutant: Mutant, tree: Path) -> str:
    """Why ``mutant`` cannot be applied to ``tree`` (empty: it can)."""
    path = tree / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    found = path.read_text().count(mutant.search)
    if found != 1:
        return f"its search text occurs {found} times in {mutant.file} (exactly once expected)"
    if mutant.search == mutant.replace:
        return "its replacement equals its search text"
    return ""


# A mutant breaks the code that decides which processes are ours: one that dropped
# group_members' process-group check made a test's teardown kill every process of the machine
# (session 19, rv2-stack-down-group-members-only).  Where this runs as root and util-linux's unshare
# is there, each run of the tests is in a PID namespace of its own: it sees (/proc) and can signal
# only its own processes, and whatever it leaves is killed with it.  ``sh`` is the namespace's
# init, so pytest is not PID 1 (init ignores the signals it has no handler for: a test that signals
# its own process would see another outcome).  Elsewhere (no root, no unshare): [] and the runs are
# not contained, which the table's last line says.
NAMESPACE = ["--pid", "--fork", "--mount-proc", "--kill-child"]
INIT = ["sh", "-c", '"$@"; exit $?', "sh"]


def contained() -> list[str]:
    """The argv prefix that runs a command in a PID namespace of its own, or [] where none can be
    made here."""
    exe = shutil.which("unshare")
    if exe is None or os.geteuid() != 0:
        return []
    try:
        probe = subprocess.run([exe, *NAMESPACE, *INIT, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [exe, *NAMESPACE, *INIT] if probe.returncode == 0 else []


CONTAINED = contained() if __name__ == "__main__" else []  # probed once, by the runner


def pytest(
    tree: Path, guard: Path, tests: list[str], module: str = "", stop_first: bool = True, total: float = 0
) -> tuple[int, str, float]:
    """Run ``tests`` in ``tree``: (exit code, output, seconds); -1 when the run got no answer within
    ``total`` seconds (default PER_MUTANT_S + 60: one mutant's tests; every test is bounded by
    PER_MUTANT_S too)."""
    total = total or PER_MUTANT_S + 60
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(guard), os.environ.get("PYTHONPATH", "")]),
        "MLREG_MUTANT_ROOT": str(tree),
        "MLREG_MUTANT_MODULE": module,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("MLREG_ALLOW_SKIPS", None)
    if CONTAINED:  # the unit runs' /dev/shm folders are judged abandoned by pid, which it cannot see
        env["MLREG_TEST_TMPFS"] = "0"
    argv = [*CONTAINED, sys.executable, "-m", "pytest", *tests, "-q", "-rfE", "--strict-markers"]
    argv += ["-x"] if stop_first else []
    argv += ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "_mutant_guard", "-o", "addopts="]
    argv += [f"--timeout={PER_MUTANT_S}"]
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=total)
    except subprocess.TimeoutExpired as exc:
        return -1, f"no answer in {total:.0f} s: {exc}", time.monotonic() - start
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def failures(output: str) -> list[str]:
    """The node ids pytest's short summary names as failed or errored."""
    found = []
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            found.append(line.split(" ", 1)[1].split(" - ", 1)[0])
    return found


def first_failure(output: str) -> str:
    """The first failed test, its parameters cut short (the table's cell)."""
    test = next(iter(failures(output)), "?")
    name, bracket, params = test.partition("[")
    return name + (bracket + params[:24] + ("...]" if len(params) > 25 else params[24:]) if bracket else "")


def run_one(mutant: Mutant, tree: Path, guard: Path) -> None:
    path = tree / mutant.file
    original = path.read_text()
    path.write_text(original.replace(mutant.search, mutant.replace, 1))
    try:
        rc, output, mutant.seconds = pytest(tree, guard, mutant.tests, mutant.module)
    finally:
        path.write_text(original)
    if rc == 1:
        mutant.outcome, mutant.killed_by = "killed", first_failure(output)
    elif rc == 0:
        mutant.outcome = "SURVIVED"
    else:
        mutant.outcome = "ERROR"
    if mutant.outcome != "killed":
        mutant.detail = output.splitlines()[-25:]


def table(mutants: list[Mutant]) -> str:
    rows = [("guarantee", "mutant", "outcome", "killed by", "seconds")]
    for m in mutants:
        seconds = f"{m.seconds:.1f}" if m.seconds else "-"
        rows.append((m.guarantee, m.id, m.outcome, m.killed_by or "-", seconds))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="mutant ids to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"mutants run at once (default {JOBS})")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    mutants = load()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            parser.error(f"unknown mutant ids: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id}: {m.file}: {m.guarantee} -- {' '.join(m.tests)}")
        return 0
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mlreg-mutants-"))
    try:
        return _run(mutants, work, start, args.jobs)
    finally:
        if args.keep:
            print(f"the copy is kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def baseline(trees: list[Path], guard: Path, live: list[Mutant]) -> tuple[int, str, list[str]]:
    """The named tests on the unmutated copies, their test files split over the copies (a module's
    tests stay together): the worst exit code, the output of the runs that did not pass, what failed."""
    tests = sorted({t for m in live for t in m.tests})
    modules = " ".join(sorted({m.module for m in live}))
    files = sorted({t.split("::", 1)[0] for t in tests})
    shares = [
        [t for t in tests if files.index(t.split("::", 1)[0]) % len(trees) == k] for k in range(len(trees))
    ]
    shares = [share for share in shares if share]
    if not shares:
        return 0, "", []
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        runs = list(
            pool.map(
                lambda k: pytest(trees[k], guard, shares[k], modules, False, BASELINE_S), range(len(shares))
            )
        )
    codes = [rc for rc, _, _ in runs]
    rc = next((c for c in codes if c not in (0, 1)), max(codes))
    output = "\n".join(out for code, out, _ in runs if code != 0)
    seconds = time.monotonic() - start
    print(f"baseline: the {len(tests)} named tests on the unmutated copies: rc {rc} in {seconds:.1f} s")
    return rc, output, [f for code, out, _ in runs for f in failures(out)]


def _run(mutants: list[Mutant], work: Path, start: float, jobs: int = 1) -> int:
    guard = work / "guard"
    guard.mkdir()
    (guard / "_mutant_guard.py").write_text(GUARD)
    trees = [work / ("tree" if k == 0 else f"tree-{k}") for k in range(max(1, jobs))]
    for tree in trees:
        copy_tree(ROOT, tree)
    for mutant in mutants:
        why = stale(mutant, trees[0])
        if why:
            mutant.outcome, mutant.detail = "STALE", [why]
    live = [m for m in mutants if not m.outcome]
    rc, output, broken = baseline(trees, guard, live)
    if rc not in (0, 1) or (rc == 1 and not broken):
        print("\n".join(output.splitlines()[-40:]))
        print("the named tests could not run on the unmutated copy: nothing was judged")
        return 1
    for mutant in live:
        failing = [f for f in broken if any(f == t or f.startswith(f"{t}::") for t in mutant.tests)]
        if failing:  # a test failing without the mutant would "kill" it: not judged
            mutant.outcome, mutant.detail = "BASELINE-FAILS", [f"fails unmutated: {f}" for f in failing]
    live = [m for m in live if not m.outcome]
    free: queue.Queue[Path] = queue.Queue()
    for tree in trees:
        free.put(tree)

    def judge(mutant: Mutant) -> None:
        tree = free.get()  # a copy no other mutant holds now
        try:
            run_one(mutant, tree, guard)
        finally:
            free.put(tree)
        print(f"  {mutant.id}: {mutant.outcome} ({mutant.seconds:.1f} s)", flush=True)

    with ThreadPoolExecutor(max_workers=len(trees)) as pool:
        list(pool.map(judge, live))
    print()
    print(table(mutants))
    bad = [m for m in mutants if m.outcome != "killed"]
    for m in bad:
        print(f"\n{m.id}: {m.outcome}")
        print("\n".join(f"  {line}" for line in m.detail))
    tiers = killed_by_tier(mutants)
    needs = [m.id for m in mutants if m.integration]
    print(
        f"\n{len(mutants) - len(bad)} of {len(mutants)} mutants killed ({tiers['unit']} by tests/unit, "
        f"{tiers['component']} by tests/component, {tiers['integration']} by tests/integration; "
        f"an integration test needed for {len(needs)}: {', '.join(needs) or 'none'}) "
        f"in {time.monotonic() - start:.0f} s; "
        + (
            "each run in a PID namespace of its own"
            if CONTAINED
            else "the runs not contained (no root or unshare)"
        )
    )
    return 1 if bad else 0


def killed_by_tier(mutants: list[Mutant]) -> dict[str, int]:
    """How many killed mutants the first failing test of each tier killed: tests/unit (in the pytest
    process), tests/component (local processes), tests/integration (real servers)."""
    tiers = {"unit": 0, "component": 0, "integration": 0, "other": 0}
    for m in mutants:
        if m.outcome == "killed":
            folder = m.killed_by.split("/")[1] if m.killed_by.startswith("tests/") else ""
            tiers[folder if folder in tiers else "other"] += 1
    return tiers


if __name__ == "__main__":
    sys.exit(main())
