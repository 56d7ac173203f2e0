"""The docs' tutorials run as they are written (issue 48): every ```bash and ```console block of
each page under ``docs/site_src/tutorial/``, in order, in a fresh folder outside the checkout, on
the embedded registry and a real local stack (``docs/tutorial_blocks.py`` reads the blocks).  A
command that fails, an output line the page shows and the command does not print, or a page that
drifts from what works fails the test; the state each step leaves is asserted too, not only exits."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from docs import tutorial_blocks
from registry.mlflow import sqlite

pytestmark = pytest.mark.integration

OWN_MODEL = tutorial_blocks.TUTORIALS / "your-own-model.md"
# the page's scaler (src/scaler/model.py): (raw - MEAN) / SCALE
MEAN, SCALE = (5.8, 3.0, 3.8, 1.2), (0.8, 0.4, 1.8, 0.8)


def clean_env() -> dict[str, str]:
    """A newcomer's shell: no MLREG_/MLFLOW_ settings of this run, this interpreter's tools first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLREG_", "MLFLOW_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_page(page: Path, folder: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    """Every step of ``page`` in ``folder``, in order; each command with what it printed."""
    said: list[tuple[str, str]] = []
    for step in tutorial_blocks.steps(page):
        argv = ["bash", "-e", "-o", "pipefail", "-c", step.command]
        run = subprocess.run(
            argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        output = run.stdout + run.stderr
        assert run.returncode == 0, f"{page.name}: exit {run.returncode} from:\n{step.command}\n{output}"
        missing = step.missing(output)
        assert not missing, f"{page.name}: `{step.command}` did not print {missing}; it printed:\n{output}"
        said.append((step.command, output))
    return said


def printed(said: list[tuple[str, str]], command: str) -> list[str]:
    """What each run of ``command`` printed, in order."""
    return [output for run, output in said if run == command]


def scores(raw: list[float], activation: Callable[[float], float]) -> list[float]:
    """What the page's ensemble answers: the scaler's standardisation, then the classifier."""
    return [activation((x - m) / s) for x, m, s in zip(raw, MEAN, SCALE, strict=True)]


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
    classifier, scaler, iris = (
        sqlite.registered_model(registry, m) for m in ("classifier", "scaler", "iris")
    )
    assert classifier is not None
    assert scaler is not None
    assert iris is not None
    assert [(v, tags["validation"]) for v, _, tags in classifier.versions] == [
        ("1", "passed"),
        ("2", "passed"),
    ]
    assert classifier.aliases == {"local": "2"}  # v2 went out through the canary
    assert [(v, tags["validation"]) for v, _, tags in scaler.versions] == [("1", "passed")]
    assert scaler.aliases == {"local": "1"}
    assert (iris.versions[0][0], iris.versions[0][2]["validation"]) == ("1", "passed")
    assert "local" in iris.aliases
    local = project / ".mlreg" / "model_repository"  # the one-server part's store: the registered bytes
    assert [node.op_type for node in onnx.load(local / "classifier/1/model.onnx").graph.node] == ["Relu"]
    assert (local / "scaler/1/model.py").read_bytes() == (project / "models/scaler/1/model.py").read_bytes()
    (promoted,) = printed(said, "MLREG_TEMPLATE_DIR=models mlreg promote iris --version 1")
    gated = re.search(r"golden inputs passed on ([\w, ]+)", promoted)  # the page's golden inputs, sent
    assert gated is not None, promoted
    assert set(gated.group(1).replace(",", " ").split()) == {"scaler", "classifier"}
    (canary,) = printed(said, "MLREG_TEMPLATE_DIR=models mlreg promote classifier --version 2")
    assert "against serving: classifier" in canary  # the gate compared v2 with v1 on the canary
    answers = [
        json.loads(output.strip().splitlines()[-1])["outputs"]["scores"][0]
        for output in printed(
            said, "mlflow deployments predict -t mlreg --name iris --input-path request.json"
        )
    ]
    raw = [5.1, 3.5, 1.4, 0.2]
    assert answers[0] == pytest.approx(scores(raw, lambda x: max(x, 0.0)), rel=1e-5)  # v1 on one server: relu
    assert answers[1] == pytest.approx(
        scores(raw, lambda x: 1 / (1 + math.exp(-x))), rel=1e-5
    )  # v2 on the fleet
    status = subprocess.run(
        ["mlreg", "stack", "status", "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(status.stdout)["running"] is False  # the page's last step stopped the stack
