"""The docs' tutorials run as they are written (issue 48): every ```bash and ```console block of
each page under ``docs/site_src/tutorial/``, in order, in a fresh folder outside the checkout, on
the embedded registry and a real local stack (``docs/tutorial_blocks.py`` reads the blocks).  A
command that fails, an output line the page shows and the command does not print, or a page that
drifts from what works fails the test; the state each step leaves is asserted too, not only exits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs import tutorial_blocks
from registry.mlflow import sqlite

pytestmark = pytest.mark.integration

OWN_MODEL = tutorial_blocks.TUTORIALS / "your-own-model.md"


def clean_env() -> dict[str, str]:
    """A newcomer's shell: no MLREG_/MLFLOW_ settings of this run, this interpreter's tools first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLREG_", "MLFLOW_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_page(page: Path, folder: Path, env: dict[str, str]) -> dict[str, str]:
    """Every step of ``page`` in ``folder``; the output of each console command, by command."""
    said: dict[str, str] = {}
    for step in tutorial_blocks.steps(page):
        argv = ["bash", "-e", "-o", "pipefail", "-c", step.command]
        run = subprocess.run(
            argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        output = run.stdout + run.stderr
        assert run.returncode == 0, f"{page.name}: exit {run.returncode} from:\n{step.command}\n{output}"
        missing = step.missing(output)
        assert not missing, f"{page.name}: `{step.command}` did not print {missing}; it printed:\n{output}"
        said[step.command] = output
    return said


def test_every_tutorial_page_is_run_here() -> None:
    """A new tutorial page gets its test (and its state assertions) here, or this fails."""
    assert tutorial_blocks.pages() == [OWN_MODEL]


def test_the_your_own_model_tutorial_runs_as_written(tmp_path: Path) -> None:
    project = tmp_path / "team"
    project.mkdir()
    env = clean_env()
    try:
        said = run_page(OWN_MODEL, project, env)
    finally:
        subprocess.run(
            ["mlreg", "stack", "down"], cwd=project, env=env, capture_output=True, timeout=120, check=False
        )
    registry = f"sqlite:///{project / '.mlreg' / 'mlflow.db'}"
    for model in ("classifier", "scaler", "iris"):
        record = sqlite.registered_model(registry, model)
        assert record is not None, model
        assert [(v, tags["validation"]) for v, _, tags in record.versions] == [("1", "passed")], model
        assert record.aliases == {"local": "1"}, model  # the promotion moved each model's alias
    store, folders = project / ".mlreg" / "model_repository", project / "models"
    for file in ("classifier/1/model.onnx", "scaler/1/model.py"):  # what serves is what was registered
        assert (store / file).read_bytes() == (folders / file).read_bytes(), file
    assert "model_version: 1" in (store / "iris" / "config.pbtxt").read_text()  # the pins it serves
    promoted = said["MLREG_TEMPLATE_DIR=models mlreg promote iris --version 1"]
    gated = re.search(r"golden inputs passed on ([\w, ]+)", promoted)  # the page's golden inputs, sent
    assert gated is not None, promoted
    assert set(gated.group(1).replace(",", " ").split()) == {"scaler", "classifier"}
    predicted = said["mlflow deployments predict -t mlreg --name iris --input-path request.json"]
    assert json.loads(predicted.strip().splitlines()[-1]) == {"outputs": {"scores": [[0.0, 1.25, 0.0, 0.0]]}}
    status = subprocess.run(
        ["mlreg", "stack", "status", "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(status.stdout)["running"] is False  # the page's last step stopped the stack
