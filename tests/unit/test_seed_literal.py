"""The seed article's repository taken literally: `mlreg validate` names each of its faults."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app
from registry.contracts.validate import validate_path
from registry.template import load_exporter
from tests.conftest import ROOT, TEMPLATE

LITERAL = ROOT / "tests" / "fixtures" / "seed_literal"


@pytest.fixture(scope="session")
def seed_literal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The article's configs verbatim, artifacts exported the article's way."""
    repo = tmp_path_factory.mktemp("seed") / "model_repository"
    shutil.copytree(LITERAL, repo)
    work = repo.parent / "tmp"
    for model in ("table_data_model", "image_model", "multi_modal_model"):
        keras_model = load_exporter(TEMPLATE / model / f"{model}_exporter.py").build_model()
        # Keras 3's model.save needs a .keras file; model.export is its SavedModel export
        target = work / "model" if model == "table_data_model" else repo / model / "1" / "model"
        keras_model.export(str(target), verbose=False)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tf2onnx.convert",
            "--saved-model",
            str(work / "model"),
            "--output",
            str(repo / "table_data_model/1/model/model.onnx"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return repo


def test_validate_rejects_the_literal_seed(seed_literal: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(seed_literal)])
    assert result.exit_code == 1
    assert "error(s)" in result.output.splitlines()[-1]


def test_each_fault_of_the_article_is_named_with_its_fix(seed_literal: Path) -> None:
    errors = [f for f in validate_path(seed_literal).findings if f.is_error]
    by_rule = {(f.rule, f.model, f.tensor): f.line() for f in errors}

    # 1. batching: the ensemble batches, the table-data models declare no max_batch_size.  Triton
    # loads that (a batching ensemble may hold non-batching members); the request then fails on
    # shape [1,1] vs [1]: mlreg's shape rule names it, labelled as mlreg's own finding
    assert not [f for f in errors if f.rule == "ensemble-batch"]
    for tensor, member in (
        ("table_data_input_1", "table_data_preprocess"),
        ("table_data_input_2", "table_data_preprocess"),
        ("table_data_model_output", "table_data_model"),
    ):
        finding = next(f for f in errors if f.rule == "ensemble-shape" and f.tensor == tensor)
        assert finding.origin == "mlreg"
        assert finding.line().startswith(f"ensemble_multi_modal_model/{tensor}: [mlreg] in ensemble ")
        assert f"fix: set max_batch_size > 0 in {member}/config.pbtxt" in finding.line()
    # 2. the ONNX batch dimension is not in the config
    line = by_rule[("shape", "table_data_model", "categorical_col_1")]
    assert (
        "the model expects 2 dimensions (shape [-1,3]) but the model configuration specifies "
        "1 dimensions (shape [3])" in line
    )
    assert "fix: the model has a batch dimension: set max_batch_size > 0 with dims: [3]" in line
    # 3. Keras' SavedModel export names the output output_0, the configs say output
    for model in ("image_model", "multi_modal_model"):
        line = by_rule[("output-name", model, "output")]
        assert "unexpected inference output 'output', allowed outputs are: output_0" in line
    # 4. the tf2onnx CLI renamed the ONNX output too
    line = by_rule[("output-name", "table_data_model", "table_model_output")]
    assert "unexpected inference output 'table_model_output', allowed outputs are: output_0" in line


def test_the_corrected_template_has_no_error(built_repository: Path) -> None:
    assert [f for f in validate_path(built_repository).findings if f.is_error] == []
