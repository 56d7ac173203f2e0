"""Claims about the real exports (TensorFlow, tf2onnx), moved here from tests/unit.

The unit suite runs without TensorFlow on stand-in artifacts (tests/unit/standins.py) that declare
their config's tensors; these tests check the real exports do the same, and the claims only a real
export can make: the article's literal faults (tests/unit/test_seed_literal.py), the ONNX reader on
a tf2onnx file (test_signature.py), reproducible exports and TensorFlow's start-up lines
(test_template.py, test_cli.py).  ``built_repository`` is the session's one TensorFlow build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlreg.cli.main import app
from registry import template
from registry.contracts.config import data_type_name, full_shape, load_config
from registry.contracts.signature import read_onnx, read_saved_model
from registry.contracts.validate import validate_path
from registry.template import load_exporter
from tests.cli import CliRunner
from tests.conftest import ROOT, TEMPLATE
from tests.integration import forkcli
from tests.unit.onnx_signatures import read, reference

pytestmark = pytest.mark.integration

LITERAL = ROOT / "tests" / "fixtures" / "seed_literal"
ARTIFACT_READERS = {
    "onnxruntime_onnx": read_onnx,
    "tensorflow_savedmodel": read_saved_model,
}


# -- from tests/unit/test_template.py --------------------------------------------------------------


@pytest.mark.parametrize("model", ["table_data_model", "image_model", "multi_modal_model"])
def test_artifact_tensors_equal_the_config(built_repository: Path, model: str) -> None:
    config = load_config(built_repository / model / "config.pbtxt")
    artifact = built_repository / model / "1" / config.default_model_filename
    signature = ARTIFACT_READERS[config.platform](artifact)

    def as_contract(tensors):  # name -> (dtype, shape with symbolic dims as -1)
        return {t.name: (t.dtype, tuple(d if isinstance(d, int) else -1 for d in t.shape)) for t in tensors}

    for declared, actual in ((config.input, signature.inputs), (config.output, signature.outputs)):
        expected = {t.name: (data_type_name(t.data_type), full_shape(config, t.dims)) for t in declared}
        assert as_contract(actual) == expected


def _onnx_weights(path: Path) -> dict[str, bytes]:
    import onnx

    return {init.name: init.raw_data for init in onnx.load(str(path)).graph.initializer}


def test_exports_are_reproducible_for_a_seed(tmp_path: Path, built_repository: Path) -> None:
    template.build(TEMPLATE, tmp_path / "a", models=["table_data_model"], seed=0)
    template.build(TEMPLATE, tmp_path / "b", models=["table_data_model"], seed=7)
    onnx_file = "table_data_model/1/model/model.onnx"
    first = _onnx_weights(built_repository / onnx_file)
    assert first
    assert any(first.values())
    assert _onnx_weights(tmp_path / "a" / onnx_file) == first
    assert _onnx_weights(tmp_path / "b" / onnx_file) != first


# -- from tests/unit/test_signature.py -------------------------------------------------------------


def test_the_built_template_onnx_model_reads_as_with_onnx(built_repository: Path) -> None:
    path = built_repository / "table_data_model" / "1" / "model" / "model.onnx"
    assert read(path) == reference(path)
    assert read_onnx(path).to_dict()["inputs"][0]["name"] == "categorical_col_1"


# -- from tests/component/test_cli.py -------------------------------------------------------------------

TENSORFLOW_LINES = ("oneDNN", "absl", "cpu_feature_guard", "This TensorFlow binary", "tensorflow/core")


def test_tensorflow_start_up_lines_never_reach_the_cli_output(tmp_path: Path) -> None:
    """A real export (TensorFlow and tf2onnx imported) with none of TensorFlow's variables set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "MLREG_DEBUG"))}
    env["MLREG_HOME"] = str(tmp_path / "home")
    build = ["template", "build", str(tmp_path / "out"), "-m", "table_data_model"]
    run = forkcli.run(build, env=env, cwd=Path.cwd(), timeout=600)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out/table_data_model/1/model/model.onnx").is_file()
    assert run.stdout == f"built 1 models into {tmp_path / 'out'}\n"
    assert run.stderr == "  table_data_model\n"
    assert not [line for line in TENSORFLOW_LINES if line in run.stdout + run.stderr]


# -- from tests/unit/test_seed_literal.py: the seed article's repository taken literally ----------


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
