"""``mlreg init`` (issue 48 item 1): a settings file the project's own loader reads, a model folder
made of an ONNX graph or a ``model.py`` that ``validate`` passes unchanged and ``register`` records
on an embedded (sqlite) MLflow registry, golden inputs from the contract, and nothing overwritten
without ``--force``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from mlreg.cli.main import app
from mlreg.ops.init import SETTINGS_FILE
from pipelines.checks.golden import golden_inputs, has_golden_inputs
from pipelines.promote.environments import load_environments
from registry.contracts.config import data_type_name, load_config, parse_config
from registry.mlflow import sqlite
from registry.settings import Settings
from tests.component.conftest import CliRuns
from tests.unit import standins

ROOT = Path(__file__).resolve().parents[2]
PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]
        outputs = [{"name": "length", "data_type": "TYPE_INT32", "dims": [1]}]
        for tensor in inputs:
            auto_complete_model_config.add_input(tensor)
        for tensor in outputs:
            auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return [None for _ in requests]
"""


def onnx_classifier(path: Path) -> Path:
    """A small ONNX graph made here: ``features`` [batch, 4] float -> ``scores`` [batch, 4]."""
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["features"], ["scores"])], "g", [features], [scores])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def files_under(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def settings_of(project: Path) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": str(project / ".mlreg")})


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_init_writes_a_settings_file_the_settings_loader_reads_and_its_fleet_uncommented_too(
    runner: CliRunner, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    result = runner.invoke(app, ["init", str(project)])
    assert result.exit_code == 0, result.output
    assert f"wrote {project / SETTINGS_FILE}" in result.stdout
    assert files_under(project).keys() == {SETTINGS_FILE}
    assert list(load_environments(settings_of(project))) == ["local"]  # all of it commented out
    lines = (project / SETTINGS_FILE).read_text().splitlines()
    start = lines.index("# [environments.fleet]")
    uncommented = [line.removeprefix("#").strip() for line in lines[start:]]
    (project / SETTINGS_FILE).write_text("\n".join(uncommented) + "\n")  # what a user does
    fleet = load_environments(settings_of(project))["fleet"]
    assert fleet.store == "s3://127.0.0.1:9000/models/fleet"
    assert fleet.targets == ("127.0.0.1:8001", "127.0.0.1:8011")
    assert fleet.policy is not None
    assert (fleet.policy.canary, fleet.policy.bake_seconds) == (1, 60)
    assert fleet.control_key == "env:MLREG_FLEET_CONTROL_KEY"
    assert fleet.metrics_url("127.0.0.1:8011") == "http://127.0.0.1:8012/metrics"


def test_init_from_an_onnx_file_writes_a_model_folder_validate_passes_unchanged(
    runner: CliRunner, tmp_path: Path
) -> None:
    source = onnx_classifier(tmp_path / "classifier.onnx")
    project = tmp_path / "project"
    result = runner.invoke(app, ["init", str(project), "--from", str(source), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["model"], doc["kind"]) == ("classifier", "onnx")
    assert set(files_under(project)) == {
        SETTINGS_FILE,
        "models/classifier/config.pbtxt",
        "models/classifier/1/model.onnx",
        "models/golden_inputs.py",
        "models/classifier.golden.json",
    }
    assert (project / "models/classifier/1/model.onnx").read_bytes() == source.read_bytes()
    config = load_config(project / "models/classifier/config.pbtxt")
    assert (config.name, config.platform, config.backend) == ("classifier", "onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == 4  # Triton's default-max-batch-size for a variable first dim
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("features", [4])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("scores", [4])]
    checked = runner.invoke(app, ["validate", str(project / "models"), "--json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["models"] == ["classifier"]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []


def test_init_golden_inputs_are_read_as_the_template_s_by_the_quality_gate(
    runner: CliRunner, tmp_path: Path
) -> None:
    source = onnx_classifier(tmp_path / "classifier.onnx")
    project = tmp_path / "project"
    assert runner.invoke(app, ["init", str(project), "--from", str(source)]).exit_code == 0
    settings = Settings.from_env(env={"MLREG_TEMPLATE_DIR": str(project / "models")})
    assert has_golden_inputs(settings, "classifier")
    config_text = (project / "models/classifier/config.pbtxt").read_text()
    inputs = golden_inputs(settings, "classifier", config_text)
    assert list(inputs) == ["features"]
    assert inputs["features"].dtype == np.float32
    assert inputs["features"].shape == (1, 4)  # one request of the batching model
    assert inputs["features"].tolist() == [[0.0, pytest.approx(1 / 3, abs=1e-6), pytest.approx(2 / 3), 1.0]]
    assert not has_golden_inputs(settings, "another_model")


def test_init_from_a_python_model_reads_its_auto_complete_config(runner: CliRunner, tmp_path: Path) -> None:
    source = tmp_path / "tokenizer" / "model.py"
    source.parent.mkdir()
    source.write_text(PYTHON_MODEL)
    project = tmp_path / "project"
    result = runner.invoke(app, ["init", str(project), "--from", str(source)])
    assert result.exit_code == 0, result.output
    config = load_config(project / "models/tokenizer/config.pbtxt")  # named by model.py's folder
    assert (config.backend, config.default_model_filename, config.max_batch_size) == ("python", "model.py", 8)
    assert [(t.name, data_type_name(t.data_type), list(t.dims)) for t in config.input] == [
        ("text", "STRING", [1])
    ]
    assert [t.name for t in config.output] == ["length"]
    assert (project / "models/tokenizer/1/model.py").read_text() == PYTHON_MODEL
    golden = json.loads((project / "models/tokenizer.golden.json").read_text())
    assert golden["inputs"]["text"] == {"dtype": "bytes", "shape": [1, 1], "data": ["mlreg"]}
    assert runner.invoke(app, ["validate", str(project / "models")]).exit_code == 0


def test_a_python_model_without_declared_tensors_is_refused_with_the_fix(
    runner: CliRunner, tmp_path: Path
) -> None:
    source = tmp_path / "model.py"
    source.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    result = runner.invoke(app, ["init", str(tmp_path / "p"), "--from", str(source), "--name", "m"])
    assert result.exit_code == 2
    assert "declares no inputs or outputs mlreg can read" in result.stderr
    assert "fix: add an auto_complete_config that calls add_input(" in result.stderr
    assert not (tmp_path / "p").exists()  # nothing written


def test_init_overwrites_nothing_without_force(runner: CliRunner, tmp_path: Path) -> None:
    source = onnx_classifier(tmp_path / "classifier.onnx")
    project = tmp_path / "project"
    assert runner.invoke(app, ["init", str(project), "--from", str(source)]).exit_code == 0
    (project / "models/classifier/config.pbtxt").write_text('name: "classifier"\n# edited by hand\n')
    (project / SETTINGS_FILE).write_text("# my own settings\n")
    before = files_under(project)
    again = runner.invoke(app, ["init", str(project), "--from", str(source)])
    assert again.exit_code == 2
    assert "models/classifier/config.pbtxt, models/classifier/1/model.onnx" in again.stderr
    assert "already exist(s); mlreg init overwrites nothing" in again.stderr
    assert "fix: pass --force to overwrite them, or choose another PATH or --name" in again.stderr
    assert files_under(project) == before
    assert runner.invoke(app, ["init", str(project)]).exit_code == 2  # mlreg.toml alone: refused too
    assert files_under(project) == before
    forced = runner.invoke(app, ["init", str(project), "--from", str(source), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "# edited by hand" not in (project / "models/classifier/config.pbtxt").read_text()
    assert (project / SETTINGS_FILE).read_text() != "# my own settings\n"  # --force: rewritten


def test_a_second_model_keeps_the_project_s_settings(runner: CliRunner, tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert runner.invoke(app, ["init", str(project)]).exit_code == 0
    (project / SETTINGS_FILE).write_text("# my own settings\n")
    source = onnx_classifier(tmp_path / "ranker.onnx")
    result = runner.invoke(app, ["init", str(project), "--from", str(source)])
    assert result.exit_code == 0, result.output
    assert f"kept {project / SETTINGS_FILE}" in result.stdout
    assert (project / SETTINGS_FILE).read_text() == "# my own settings\n"
    assert (project / "models/ranker/config.pbtxt").is_file()


@pytest.mark.parametrize(
    ("name", "said"),
    [("missing.onnx", "does not exist"), ("weights.bin", "is none of them")],
)
def test_a_source_init_cannot_read_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, name: str, said: str
) -> None:
    if name == "weights.bin":
        (tmp_path / name).write_bytes(b"\0")
    result = runner.invoke(app, ["init", str(tmp_path / "p"), "--from", str(tmp_path / name)])
    assert result.exit_code == 2
    assert f"error: --from '{tmp_path / name}' {said}: mlreg init takes an ONNX file" in result.stderr
    assert not (tmp_path / "p").exists()


def test_init_then_validate_then_register_on_the_embedded_registry(
    runner: CliRunner, tmp_path: Path, registry_home: Path, mlreg_cli: CliRuns
) -> None:
    source = onnx_classifier(tmp_path / "classifier.onnx")
    project = tmp_path / "project"
    assert runner.invoke(app, ["init", str(project), "--from", str(source)]).exit_code == 0
    assert runner.invoke(app, ["validate", str(project / "models")]).exit_code == 0
    [registered] = mlreg_cli(registry_home, ["register", "classifier", str(project / "models/classifier")])
    assert registered["exit_code"] == 0, registered
    assert "classifier: registered version 1 (validation passed)" in registered["stdout"]
    record = sqlite.registered_model(f"sqlite:///{registry_home / 'mlflow.db'}", "classifier")
    assert record is not None
    [(version, _, tags)] = record.versions
    assert version == "1"
    assert (tags["validation"], tags["platform"], tags["git_commit"]) == (
        "passed",
        "onnxruntime_onnx",
        "unknown",
    )
    assert "git_dirty" not in tags  # outside a git checkout nothing is known to be dirty (issue 48)


def test_init_from_a_savedmodel_folder_reads_its_serving_signature(runner: CliRunner, tmp_path: Path) -> None:
    """A SavedModel as Keras' ``model.export`` writes it (its ``saved_model.pb`` only: the stand-in
    export of tests/unit/standins.py), read without TensorFlow."""
    declared = parse_config(
        'name: "ranker" max_batch_size: 8 input [{ name: "query", data_type: TYPE_FP32, dims: [16] }] '
        'output [{ name: "output_0", data_type: TYPE_FP32, dims: [1] }]'
    )
    source = tmp_path / "export" / "ranker"
    standins.write_saved_model(declared, source)
    project = tmp_path / "project"
    result = runner.invoke(app, ["init", str(project), "--from", str(source)])
    assert result.exit_code == 0, result.output
    config = load_config(project / "models/ranker/config.pbtxt")  # named by the SavedModel's folder
    assert (config.platform, config.default_model_filename) == ("tensorflow_savedmodel", "model.savedmodel")
    assert config.max_batch_size == 4  # the batch dimension is variable: Triton's default
    assert [(t.name, list(t.dims)) for t in config.input] == [("query", [16])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("output_0", [1])]
    assert (project / "models/ranker/1/model.savedmodel/saved_model.pb").is_file()
    assert runner.invoke(app, ["validate", str(project / "models")]).exit_code == 0
