"""The suite's own rule: a skipped test proves nothing, so any skip fails the run -- a test skipped
by a marker, a module skipped whole at import, and an xfail alike (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "marker": "import pytest\n\n@pytest.mark.skip(reason='no tool')\ndef test_x():\n    assert True\n",
    "module": "import pytest\n\npytest.skip('no tool', allow_module_level=True)\n\n"
    "def test_x():\n    assert True\n",
    "xfail": "import pytest\n\n@pytest.mark.xfail(reason='flaky')\ndef test_x():\n    assert False\n",
}
PASSING = "def test_ok():\n    assert True\n"


def run(tmp_path: Path, *sources: str) -> subprocess.CompletedProcess[str]:
    for index, source in enumerate(sources):
        (tmp_path / f"test_case_{index}.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "MLREG_ALLOW_SKIPS"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("kind", sorted(CASES))
def test_any_skip_fails_the_run_and_is_named(tmp_path: Path, kind: str) -> None:
    proc = run(tmp_path, PASSING, CASES[kind])
    assert proc.returncode == 1, proc.stdout
    assert "unexpected skips (the suite fails on any skip)" in proc.stdout
    assert "test_case_1.py" in proc.stdout.split("unexpected skips")[1]


def test_a_run_with_no_skip_passes(tmp_path: Path) -> None:
    proc = run(tmp_path, PASSING)
    assert proc.returncode == 0, proc.stdout
    assert "unexpected skips" not in proc.stdout
