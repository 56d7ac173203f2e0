"""tests/mutants/run.py, the guarantee mutants' runner, on its pure parts: a mutant whose search
text is not exactly once in its file is stale, the list is valid TOML with unique ids naming
existing test files, pytest's summary is read for the killing test, and the table says it all."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_run", ROOT / "tests" / "mutants" / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutants_run"] = module  # dataclasses resolve their module's annotations there
    spec.loader.exec_module(module)
    return module


def _mutant(run: ModuleType, **fields: object) -> object:
    base = {"id": "m", "guarantee": "g", "file": "pkg/mod.py", "search": "a < b", "replace": "a > b"}
    return run.Mutant(**{**base, "tests": ["tests/unit/test_x.py"], **fields})


def test_a_mutant_applies_only_where_its_search_text_is_exactly_once(run: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("if a < b:\n    pass\n")
    assert run.stale(_mutant(run), tmp_path) == ""
    module.write_text("if a <= b:\n    pass\n")
    assert (
        run.stale(_mutant(run), tmp_path)
        == "its search text occurs 0 times in pkg/mod.py (exactly once expected)"
    )
    module.write_text("if a < b or a < b:\n    pass\n")
    assert "occurs 2 times" in run.stale(_mutant(run), tmp_path)
    assert run.stale(_mutant(run, file="pkg/gone.py"), tmp_path) == "pkg/gone.py does not exist"
    assert run.stale(_mutant(run, replace="a < b"), tmp_path) != ""


def test_the_list_has_unique_ids_a_guarantee_and_existing_test_files(run: ModuleType) -> None:
    mutants = run.load()
    assert len(mutants) >= 22
    assert len({m.id for m in mutants}) == len(mutants)
    for m in mutants:
        assert m.guarantee, m.id
        assert (ROOT / m.file).is_file(), m.id
        for test in m.tests:
            assert (ROOT / test.split("::", 1)[0]).is_file(), (m.id, test)
    assert sum(1 for m in mutants if m.integration) <= 3  # at most 3 need a real server


def test_the_killing_test_is_read_from_pytests_summary_and_the_table_shows_it(run: ModuleType) -> None:
    output = (
        "...\nFAILED tests/unit/test_x.py::test_y[a-very-long-parameter-id-indeed-yes] - AssertionError\n"
    )
    assert run.failures(output) == ["tests/unit/test_x.py::test_y[a-very-long-parameter-id-indeed-yes]"]
    assert run.first_failure(output) == "tests/unit/test_x.py::test_y[a-very-long-parameter-id...]"
    killed = _mutant(run, outcome="killed", killed_by="tests/unit/test_x.py::test_y", seconds=2.5)
    stale = _mutant(run, id="old", outcome="STALE")
    lines = run.table([killed, stale]).splitlines()
    assert lines[0].split() == ["guarantee", "mutant", "outcome", "killed", "by", "seconds"]
    assert lines[2].split() == ["g", "m", "killed", "tests/unit/test_x.py::test_y", "2.5"]
    assert lines[3].split() == ["g", "old", "STALE", "-", "-"]


def test_a_contained_run_sees_only_its_own_processes_and_its_command_is_not_init(run: ModuleType) -> None:
    """Where the runner can make a PID namespace (root, unshare), a mutant's tests see and can
    signal only their own processes: a mutant that widens "ours" to every process (one did: the
    teardown killed the machine's) reaches nothing outside.  Elsewhere the runner says it cannot."""
    prefix = run.contained()
    if not prefix:  # the runner says it cannot contain a run here: then it really cannot
        unshare = shutil.which("unshare")
        if os.geteuid() == 0 and unshare is not None:
            tried = subprocess.run([unshare, *run.NAMESPACE, "true"], capture_output=True, timeout=30)
            assert tried.returncode != 0
        return
    assert prefix[-4:] == run.INIT
    outside = subprocess.Popen(["sleep", "60"])
    try:
        probe = (
            "import json, os; "
            "print(json.dumps([os.getpid(), [int(p) for p in os.listdir('/proc') if p.isdigit()]]))"
        )
        done = subprocess.run(
            [*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        pid, seen = json.loads(done.stdout)
        assert sorted(seen) == [1, pid]  # the namespace's init (sh) and the command: nothing else
        assert pid != 1  # signals a test sends its own process keep their default effect
        assert outside.poll() is None
    finally:
        outside.kill()
        outside.wait()


def test_the_summary_counts_each_kill_by_the_tier_of_the_test_that_made_it(run: ModuleType) -> None:
    """A mutant killed by tests/unit counts for the unit tier, not for tests/component (the two fast
    tiers are told apart, as the README's table of them is)."""
    mutants = [
        _mutant(run, id="a", outcome="killed", killed_by="tests/unit/test_x.py::test_y"),
        _mutant(run, id="b", outcome="killed", killed_by="tests/component/test_x.py::test_y[p]"),
        _mutant(run, id="c", outcome="killed", killed_by="tests/component/test_z.py::test_w"),
        _mutant(run, id="d", outcome="killed", killed_by="tests/integration/test_x.py::test_y"),
        _mutant(run, id="e", outcome="survived"),
    ]
    assert run.killed_by_tier(mutants) == {"unit": 1, "component": 2, "integration": 1, "other": 0}


def test_a_script_outside_the_packages_has_no_module_for_the_guard(run: ModuleType) -> None:
    """A mutant of .ci/bytecode.py is judged by tests that run the copy's script by its path; a
    package module is named so the guard can check it is imported from the copy."""
    assert _mutant(run, file=".ci/bytecode.py").module == ""
    assert _mutant(run, file="pipelines/devstack/local_triton.py").module == "pipelines.devstack.local_triton"
    assert _mutant(run, file="registry/__init__.py").module == "registry"
