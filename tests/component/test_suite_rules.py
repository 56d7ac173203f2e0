"""The suite's own rules: a skipped test proves nothing, so any skip fails the run -- a test skipped
by a marker, a module skipped whole at import, and an xfail alike (tests/conftest.py); and no test
module imports another (what two share lives in a helper module or a conftest.py)."""

from __future__ import annotations

import ast
import gc
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "marker": "import pytest\n\n@pytest.mark.skip(reason='no tool')\ndef test_x():\n    assert True\n",
    "module": "import pytest\n\npytest.skip('no tool', allow_module_level=True)\n\n"
    "def test_x():\n    assert True\n",
    "xfail": "import pytest\n\n@pytest.mark.xfail(reason='flaky')\ndef test_x():\n    assert False\n",
}
PASSING = "def test_ok():\n    assert True\n"


@dataclass
class Run:
    returncode: int
    stdout: str


def _suite_rules() -> ModuleType:
    """A fresh copy of tests/conftest.py (its own list of skips) to run as the inner run's plugin."""
    spec = importlib.util.spec_from_file_location("suite_rules_under_test", ROOT / "tests" / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Run]:
    """A pytest run of the given test modules with the suite's rules, in this process (as pytester's
    runpytest_inprocess: a new session, its modules and sys.path put back after it)."""
    monkeypatch.delenv("MLREG_ALLOW_SKIPS", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def run_sources(*sources: str) -> Run:
        for index, source in enumerate(sources):
            (tmp_path / f"test_case_{index}.py").write_text(source)
        modules = set(sys.modules)
        capsys.readouterr()
        args = ["-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)]
        gc.freeze()  # the outer session's heap is left out of the inner run's collections (1 s each)
        try:
            code = pytest.main(args, plugins=[_suite_rules()])
        finally:
            gc.unfreeze()
            for name in set(sys.modules) - modules:
                del sys.modules[name]
        return Run(int(code), capsys.readouterr().out)

    return run_sources


@pytest.mark.parametrize("kind", sorted(CASES))
def test_any_skip_fails_the_run_and_is_named(run: Callable[..., Run], kind: str) -> None:
    proc = run(PASSING, CASES[kind])
    assert proc.returncode == 1, proc.stdout
    assert "unexpected skips (the suite fails on any skip)" in proc.stdout
    assert "test_case_1.py" in proc.stdout.split("unexpected skips")[1]


def test_a_run_with_no_skip_passes(run: Callable[..., Run]) -> None:
    proc = run(PASSING)
    assert proc.returncode == 0, proc.stdout
    assert "unexpected skips" not in proc.stdout


def imports_of_test_modules(root: Path) -> list[str]:
    """Every import, in the .py files under ``root / "tests"``, of a test module (``test_*``)."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            tested = [n for n in names if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
            found += [f"{path.relative_to(root)}:{node.lineno} imports {tested[0]}"] if tested else []
    return found


def test_no_test_module_imports_another(tmp_path: Path) -> None:
    """Importing a test module runs its collection-time code and, for a fixture, sets it up once per
    importing module: shared stacks, configs and helpers live in tests/integration/stacks.py,
    fleetstack.py, nativestack.py, infra.py, tests/unit/worlds.py ... or a conftest.py."""
    assert imports_of_test_modules(ROOT) == []
    (tmp_path / "tests" / "unit").mkdir(parents=True)  # the control: one that does is named
    (tmp_path / "tests" / "unit" / "helper.py").write_text("import os\nfrom tests.unit.test_x import y\n")
    assert imports_of_test_modules(tmp_path) == ["tests/unit/helper.py:2 imports tests.unit.test_x"]
