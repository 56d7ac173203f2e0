"""The test suite's own speed, before and after a change, side by side in one run (issue 21).

Two figures, each for two commits of this repository (``--old``, default the commit before issue
21's work; ``--new``, default HEAD):

- ``unit``: ``pytest tests/unit`` wall time and pytest's own figure, old and new alternated for
  ``--rounds`` rounds on this checkout's virtualenv (each tree imports its own code: cwd and
  PYTHONPATH = the tree); the new tree also with ``MLREG_TEST_TMPFS=0`` (its throwaway files on
  the disk, not /dev/shm), on ``--workers`` pytest-xdist workers (default 2), and as a fresh
  clone with no test module's rewrite kept (``new, not primed``).  Each tree is first primed as
  ``make install`` primes a checkout (``.ci/bytecode.py --tests``: pytest's rewritten test modules
  kept; this machine sets PYTHONDONTWRITEBYTECODE, so pytest keeps none by itself), the old one
  included.  Since issue 46 tests/unit is the in-process tier and tests/component the tests that
  start processes or wait (tests/unit/conftest.py): before it, tests/unit held both, so the old
  tree's figure is both tiers; ``--component`` (default 1 round) times the new tree's
  tests/component on two workers, so the two tiers' sum is beside it.
  Target: issue 46: <= 10 s on an idle machine.  Print the machine's load with the
  figures (``uptime``): on a shared machine they grow with it.
- ``full``: what CI does on a clean clone, ``bash .ci/run`` (a fresh .venv: install, lint,
  mypy, the whole suite), wall time and pytest's own time, and the 25 slowest tests.
  Target: <= 15 min.  ~20 min per tree: ``--full new`` runs only the new one.
  Its JUnit XML summed per test module (setup and teardown included) prints the 15 slowest;
  ``--update-seconds`` writes the new tree's sums to tests/module_seconds.json, the table the
  suite's pytest-xdist scheduler hands modules out by, longest first (tests/conftest.py).

    .venv/bin/python benchmarks/suite.py                    # unit, 3 rounds
    .venv/bin/python benchmarks/suite.py --full both        # + a clean clone of each, in turn
    .venv/bin/python benchmarks/suite.py --old f1adb88 --full new --rounds 1
    .venv/bin/python benchmarks/suite.py --old 77d4639 --rounds 3   # issue 46's round, before/after
    .venv/bin/python benchmarks/suite.py --old 475d1ed --rounds 3   # issue 46's tiers, before/after
    .venv/bin/python benchmarks/suite.py --full new --rounds 0 --update-seconds  # CI's module table

Each clean-clone run is started through ``setsid`` with SIGINT at its default (a suite started as
a shell's background job inherits SIGINT ignored; one test interrupts a promotion with it).  The
logs stay under the printed folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE_ISSUE_21 = "f1adb88"


def checkout(rev: str, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", rev], check=True)
    return dest


def prime(tree: Path) -> None:
    """Keep pytest's rewritten test modules in ``tree``, as ``make install`` does (.ci/bytecode.py
    --tests, this checkout's, run in ``tree``)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = ROOT / ".ci" / "bytecode.py"
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(script), "--tests"], cwd=tree, env=env, check=True
    )


def unit_seconds(
    tree: Path, log: Path, tmpfs: bool = True, workers: int = 0, folder: str = "tests/unit"
) -> tuple[float, float]:
    """``pytest tests/unit`` (or ``folder``) in ``tree`` (``workers`` > 0: on that many pytest-xdist
    workers): wall seconds and pytest's own figure ("passed in").  A run with failures
    still counts (its figure is what the suite cost) and is said; the log keeps the 10 slowest
    tests (``slowest``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "MLREG_TEST_TMPFS": "1" if tmpfs else "0"}
    env.pop("MLREG_HOME", None)
    xdist = ["-n", str(workers), "--dist", "loadfile"] if workers else []  # as the Makefile's
    start = time.monotonic()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pytest"), folder, "-q", "-p", "no:cacheprovider", *xdist]
        + ["-o", "addopts=--strict-markers", "--durations=10"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    log.write_text(done.stdout + done.stderr)
    failed = re.search(r"(\d+) (failed|error)", done.stdout)
    if done.returncode != 0:
        print(f"  (pytest {folder} in {tree}: exit {done.returncode}, {failed[0] if failed else '?'}: {log})")
    reported = re.search(r" in ([0-9.]+)s", done.stdout.splitlines()[-1] if done.stdout else "")
    return seconds, float(reported[1]) if reported else float("nan")


def slowest(log: Path) -> list[str]:
    """The slowest tests a unit run's log lists (``--durations=10``)."""
    return re.findall(r"^(\d+\.\d+s (?:call|setup|teardown)\s+\S+)$", log.read_text(), re.M)


def _load() -> str:
    """The machine's load average (1, 5, 15 min): the figures beside it grow with it."""
    return ", ".join(f"{a:.1f}" for a in os.getloadavg())


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def module_seconds(junit: Path, tree: Path) -> dict[str, float]:
    """Each test module's seconds in a run's JUnit XML (every test's time: setup, call and
    teardown), slowest first: the module named by the classname's longest prefix that is a file
    of ``tree`` (a test class in a module adds a part)."""
    sums: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("classname"):  # a run's own error (an interrupt, a collection error)
            continue
        parts = str(case.get("classname")).split(".")
        prefixes = ("/".join(parts[:n]) + ".py" for n in range(len(parts), 0, -1))
        module = next((m for m in prefixes if (tree / m).is_file()), "/".join(parts) + ".py")
        sums[module] = sums.get(module, 0.0) + float(case.get("time") or 0)
    return {m: round(t, 1) for m, t in sorted(sums.items(), key=lambda item: -item[1])}


def write_module_seconds(seconds: dict[str, float], rev: str, load: str) -> Path:
    """tests/module_seconds.json of this checkout: what the scheduler reads (tests/conftest.py)."""
    target = ROOT / "tests" / "module_seconds.json"
    about = (
        "Seconds each test module took in a clean-clone `bash .ci/run` (CI's pytest-xdist "
        "workers): the order tests/conftest.py hands modules out in, longest first. Written by "
        "benchmarks/suite.py --full new --update-seconds."
    )
    document = {"about": about, "commit": rev, "load": load, "seconds": seconds}
    target.write_text(json.dumps(document, indent=1) + "\n")
    return target


def full_run(tree: Path, log: Path) -> dict[str, object]:
    junit = log.with_suffix(".xml")
    # the run's JUnit XML beside its log (PYTEST_ADDOPTS: CI's command line stays as it is)
    addopts = f"{os.environ.get('PYTEST_ADDOPTS', '')} --junitxml={junit}".strip()
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", ".ci/run"],
            env={**os.environ, "PYTEST_ADDOPTS": addopts},
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_default_sigint,
            start_new_session=True,
        )
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    summary = re.findall(r"=+ (.* in ([\d.]+)s.*) =+", text)
    slowest = re.findall(r"^(\d+\.\d+s (?:call|setup|teardown)\s+\S+)$", text, re.M)[:25]
    return {
        "exit": done.returncode,
        "seconds": seconds,
        "pytest": summary[-1][0] if summary else "(no pytest summary)",
        "pytest_seconds": float(summary[-1][1]) if summary else float("nan"),
        "slowest": slowest,
        "modules": module_seconds(junit, tree) if junit.is_file() else {},
    }


def unit_figures(trees: dict[str, Path], work: Path, rounds: int, workers: int) -> None:
    """``pytest tests/unit`` of each tree (and the new one's variants), ``rounds`` rounds alternated."""
    # the new tree twice: as it runs (throwaway files on /dev/shm when there is room) and with
    # MLREG_TEST_TMPFS=0 (pytest's default basetemp), so the tmpfs's share is measured too
    runs = {
        "old": (trees["old"], True, 0),
        "new": (trees["new"], True, 0),
        "new, no tmpfs": (trees["new"], False, 0),
    }
    if workers:  # the new tree on pytest-xdist workers
        runs[f"new, -n {workers}"] = (trees["new"], True, workers)
    runs["new, not primed"] = (trees["cold"], True, 0)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name, (tree, tmpfs, n) in runs.items():
            log = work / f"unit-{name.replace(', ', '-').replace(' ', '-')}-{round_}.log"
            times[name].append(unit_seconds(tree, log, tmpfs, n))
            print(f"  {name}, round {round_ + 1}: {times[name][-1][0]:.1f} s (load {_load()})", flush=True)
    old = statistics.median(w for w, _ in times["old"])
    print(f"pytest tests/unit, median of {rounds} rounds (wall; pytest's own figure); load {_load()}:")
    for name, measured in times.items():
        wall = statistics.median(w for w, _ in measured)
        reported = statistics.median(r for _, r in measured)
        each = [round(w, 1) for w, _ in measured]
        print(f"  {name:15} {wall:5.1f} s; {reported:5.1f} s  ({wall / old:.2f}x old)  rounds {each}")
    print("the new tree's 10 slowest unit tests (its last round):")
    for line in slowest(work / f"unit-new-{rounds - 1}.log"):
        print(f"  {line}")


def component_figure(tree: Path, work: Path, rounds: int) -> None:
    """The new tree's other fast tier, tests/component, on two pytest-xdist workers."""
    measured = [
        unit_seconds(tree, work / f"component-{n}.log", True, 2, "tests/component") for n in range(rounds)
    ]
    wall = statistics.median(w for w, _ in measured)
    reported = statistics.median(r for _, r in measured)
    print(
        f"pytest tests/component -n 2 (the new tree), median of {rounds}: {wall:.1f} s; "
        f"{reported:.1f} s (load {_load()})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", default=BEFORE_ISSUE_21, help=f"baseline commit (default {BEFORE_ISSUE_21})")
    parser.add_argument("--new", default="HEAD", help="commit measured against it (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="unit rounds, old and new alternated")
    parser.add_argument("--full", choices=["none", "new", "both"], default="none", help="clean-clone runs")
    parser.add_argument(
        "--update-seconds",
        action="store_true",
        help="write the new tree's clean-clone module seconds to tests/module_seconds.json",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="the new tree also on N pytest-xdist workers (0: not)"
    )
    parser.add_argument(
        "--component", type=int, default=1, help="rounds of the new tree's tests/component, two workers"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlreg-suite-"))
    trees = {"old": checkout(args.old, work / "old"), "new": checkout(args.new, work / "new")}
    for tree in trees.values():
        prime(tree)
    trees["cold"] = checkout(args.new, work / "cold")  # a fresh clone: nothing kept
    print(f"old = {args.old}, new = {args.new}; logs under {work}; load {_load()}", flush=True)
    if args.rounds:
        unit_figures(trees, work, args.rounds, args.workers)
    if args.component and (trees["new"] / "tests" / "component").is_dir():
        component_figure(trees["new"], work, args.component)
    for name in ("old", "new") if args.full == "both" else ("new",) if args.full == "new" else ():
        result = full_run(trees[name], work / f"full-{name}.log")
        print(
            f"bash .ci/run, clean clone, {name}: exit {result['exit']}, {result['seconds'] / 60:.1f} min "
            f"(pytest {result['pytest_seconds'] / 60:.1f} min: {result['pytest']})",
            flush=True,
        )
        for line in result["slowest"]:  # type: ignore[attr-defined]
            print(f"  {line}")
        modules: dict[str, float] = result["modules"]  # type: ignore[assignment]
        print(f"  the 15 slowest modules (of {len(modules)}; {sum(modules.values()):.0f} s in all):")
        for module, seconds in list(modules.items())[:15]:
            print(f"  {seconds:7.1f} s  {module}")
        if name == "new" and args.update_seconds and result["exit"] == 0 and modules:
            load = ", ".join(f"{a:.1f}" for a in os.getloadavg())
            head = ["git", "-C", str(trees[name]), "rev-parse", "--short", "HEAD"]
            rev = subprocess.run(head, capture_output=True, text=True, check=True).stdout.strip()
            print(f"  written: {write_module_seconds(modules, rev, load)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
