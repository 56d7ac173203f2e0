"""No test can hang the suite: pytest-timeout's ceiling is set in pyproject.toml, and a test that
outlives it fails (a real run of pytest on a test that sleeps past a 0.3 s ceiling)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SLEEPER = """
import time


def test_sleeps_past_its_ceiling():
    time.sleep(30)
"""


def test_the_suite_has_a_per_test_ceiling() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ceiling = project["tool"]["pytest"]["ini_options"]["timeout"]
    assert 60 <= int(ceiling) <= 900  # set, and inside the suite's 15-minute budget
    assert any(dep.startswith("pytest-timeout") for dep in project["project"]["optional-dependencies"]["dev"])


def test_a_test_past_its_ceiling_fails(tmp_path: Path) -> None:
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_sleeper.py",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "pytest_timeout",  # the only plugin loaded (no autoload: a start-up of a fraction of a second)
            "-o",
            "timeout=0.3",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed: Timeout (>0.3s) from pytest-timeout" in done.stdout
    assert "1 failed" in done.stdout
