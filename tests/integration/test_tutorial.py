"""README's "Your own model" runs as it is written (issue 48): its one shell block, line by line,
in a fresh folder outside the checkout holding only ``classifier.onnx`` (made here with
onnx.helper), on the embedded registry and a real local stack.  A line that fails, or a README
that drifts from what works, fails the test; each step's state is asserted, not only its exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from registry.mlflow import sqlite

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your own model"


def tutorial_lines() -> list[str]:
    """The commands of README's section, in order (its first ```bash block)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, f"README's '{SECTION}' has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def classifier(path: Path) -> None:
    """``features`` [batch, 4] float -> ``scores`` = relu(features), as README describes it."""
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["features"], ["scores"])], "g", [features], [scores])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def test_the_your_own_model_tutorial_runs_as_written(tmp_path: Path) -> None:
    project = tmp_path / "team"
    project.mkdir()
    classifier(project / "classifier.onnx")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLREG_", "MLFLOW_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    lines = tutorial_lines()
    assert lines[0] == "mlreg init . --from classifier.onnx"
    assert lines[-1] == "mlreg stack down"
    said: dict[str, str] = {}
    try:
        for line in lines:
            run = subprocess.run(
                ["bash", "-c", line],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert run.returncode == 0, f"README line failed: {line}\n{run.stdout}\n{run.stderr}"
            said[line.split()[1] if line.startswith("mlreg") else line.split()[0]] = run.stdout + run.stderr
    finally:
        subprocess.run(
            ["mlreg", "stack", "down"], cwd=project, env=env, capture_output=True, timeout=120, check=False
        )
    assert "1 model(s) checked: 0 error(s)" in said["validate"]
    record = sqlite.registered_model(f"sqlite:///{project / '.mlreg' / 'mlflow.db'}", "classifier")
    assert record is not None
    assert [(v, tags["validation"]) for v, _, tags in record.versions] == [("1", "passed")]
    assert record.aliases == {"local": "1"}  # the promotion moved the local alias
    assert (project / ".mlreg/model_repository/classifier/1/model.onnx").read_bytes() == (
        project / "models/classifier/1/model.onnx"
    ).read_bytes()
    assert "golden inputs passed on classifier" in said["MLREG_TEMPLATE_DIR=models"]
    assert json.loads(said["mlflow"].strip().splitlines()[-1]) == {
        "outputs": {"scores": [[0.0, 0.5, 0.0, 2.0]]}
    }
