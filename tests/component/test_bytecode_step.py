""".ci/bytecode.py --tests (``make install``'s step 4): pytest's rewritten test modules are kept,
and a ``__pycache__`` the collection wrote into a model folder -- a folder copied into a Triton
model repository, where the closed world refuses any entry it did not verify -- is removed, while
one that was there before, or holds what the step did not write, is left."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / ".ci" / "bytecode.py"


def _scratch(root: Path) -> Path:
    """A checkout whose one test module imports a model's code at collection (module level)."""
    model = root / "model_repository_template" / "m" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("ANSWER = 42\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(
        f"import sys\nsys.path.insert(0, {str(model)!r})\nimport model\n\n\n"
        "def test_x():\n    assert model.ANSWER == 42\n"
    )
    return model


def _step(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, str(STEP), "--tests"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_rewrites_are_kept_and_a_cache_written_into_a_model_folder_is_removed(tmp_path: Path) -> None:
    model = _scratch(tmp_path)
    done = _step(tmp_path)
    assert done.returncode == 0, done.stderr
    kept = list((tmp_path / "tests" / "__pycache__").glob("test_x.*-pytest-*.pyc"))
    assert len(kept) == 1, sorted(p.name for p in (tmp_path / "tests").rglob("*"))
    assert not (model / "__pycache__").exists(), "the collection's cache in a model folder stayed"
    assert f"removed {model / '__pycache__'}" in done.stderr
    assert (model / "model.py").read_text() == "ANSWER = 42\n"  # the model itself untouched


def test_a_cache_that_was_there_before_is_left_even_if_it_holds_only_fresh_bytecode(tmp_path: Path) -> None:
    """Not made by the step, so not deleted: a model folder's ``__pycache__`` present before the
    collection stays, though everything in it is bytecode written in this second."""
    model = _scratch(tmp_path)
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "stranger.cpython-311.pyc").write_bytes(b"not ours")
    done = _step(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (model / "__pycache__" / "stranger.cpython-311.pyc").read_bytes() == b"not ours"
    assert "removed" not in done.stderr


def _step_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bytecode_step", STEP)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_a_folder_of_bytecode_written_since_the_start_is_the_step_s(tmp_path: Path) -> None:
    step = _step_module()
    start = time.time()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "a.cpython-311.pyc").write_bytes(b"x")
    assert step.written_since(str(fresh), start - 1)
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.cpython-311.pyc").write_bytes(b"x")
    (other / "notes.txt").write_text("someone's")
    assert not step.written_since(str(other), start - 1)  # a file that is not bytecode
    old = tmp_path / "old"
    old.mkdir()
    (old / "a.cpython-311.pyc").write_bytes(b"x")
    os.utime(old / "a.cpython-311.pyc", (start - 3600, start - 3600))
    assert not step.written_since(str(old), start - 1)  # bytecode from before the step
