"""`mlreg validate`: one minimal broken repository per rule, asserting what users see."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mlreg.cli.main import app
from registry.contracts.validate import validate_path
from tests.cli import CliRunner
from tests.conftest import TEMPLATE


@pytest.fixture
def repo(standin_repository: Path, tmp_path: Path) -> Path:
    """A private copy of the built template (stand-in artifacts, tests/unit/standins.py) to break."""
    target = tmp_path / "repo"
    shutil.copytree(standin_repository, target)
    return target


def edit(repo: Path, model: str, old: str, new: str) -> None:
    path = repo / model / "config.pbtxt"
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def lines(path: Path) -> list[str]:
    return [f"{f.severity}: {f.line()}" for f in validate_path(path).findings]


def errors(path: Path) -> list[str]:
    return [f.line() for f in validate_path(path).findings if f.is_error]


def test_the_built_template_passes_with_no_finding(standin_repository: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(standin_repository)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "6 model(s) checked: 0 error(s), 0 warning(s)"


def test_the_template_source_only_warns_that_artifacts_are_not_exported() -> None:
    report = validate_path(TEMPLATE)
    assert report.errors == []
    assert sorted(f.model for f in report.warnings) == [
        "image_model",
        "multi_modal_model",
        "table_data_model",
    ]


def test_missing_max_batch_size_is_the_seeds_fault(repo: Path) -> None:
    for model in ("table_data_preprocess", "table_data_model"):
        edit(repo, model, "max_batch_size: 256", "")
    report = validate_path(repo)
    found = [f.line() for f in report.errors]
    # Triton lets a batching ensemble hold non-batching members: no batch-size finding ...
    assert not [f for f in report.findings if f.rule == "ensemble-batch"]
    # ... but the full shapes disagree, which fails at inference: mlreg's own finding, labelled
    [fault] = [f for f in report.errors if f.rule == "ensemble-shape" and f.tensor == "table_data_input_1"]
    assert fault.origin == "mlreg"
    assert fault.line() == (
        "ensemble_multi_modal_model/table_data_input_1: [mlreg] in ensemble ensemble_multi_modal_model, "
        "tensor 'table_data_input_1' has full shape [-1,1] in ensemble_multi_modal_model "
        "('table_data_input_1') but [1] in table_data_preprocess ('table_data_input_1'): Triton loads "
        "this, but inference fails: ensemble_multi_modal_model batches (its full shape has the batch "
        "dimension) and table_data_preprocess does not — fix: set max_batch_size > 0 in "
        "table_data_preprocess/config.pbtxt (its dims stay without the batch dimension), or put the "
        "batch dimension in its dims: [-1,1]"
    )
    assert (
        "table_data_model/categorical_col_1: model 'table_data_model', tensor "
        "'categorical_col_1': the model expects 2 dimensions (shape [-1,3]) but the model "
        "configuration specifies 1 dimensions (shape [3]) — fix: the model has a batch "
        "dimension: set max_batch_size > 0 with dims: [3]"
    ) in found


def test_a_member_with_a_smaller_max_batch_size(repo: Path) -> None:
    edit(repo, "table_data_model", "max_batch_size: 256", "max_batch_size: 8")
    [finding] = [f for f in validate_path(repo).errors if f.rule == "ensemble-batch"]
    assert finding.origin == "triton"
    assert finding.line() == (
        "ensemble_multi_modal_model: ensemble ensemble_multi_modal_model allows maximum batch "
        "size 256, but it contains model table_data_model which only allows maximum batch size "
        "to be 8 — fix: set max_batch_size: 256 (or more) in table_data_model/config.pbtxt, or "
        "lower the ensemble's max_batch_size"
    )


def test_an_output_name_the_artifact_does_not_have(repo: Path) -> None:
    edit(repo, "image_model", 'name: "output"', 'name: "output_0"')
    found = errors(repo)
    assert any(
        line.startswith(
            "image_model/output_0: unexpected inference output 'output_0', "
            "allowed outputs are: output — fix: rename the config output"
        )
        for line in found
    )
    assert any(
        "in ensemble ensemble_multi_modal_model, ensemble tensor image_model_output is mapped from "
        "non-existing output output in model image_model — fix: use an output of image_model as "
        "output_map key: output_0" in line
        for line in found
    )


def test_a_data_type_that_differs_from_the_artifact(repo: Path) -> None:
    edit(repo, "table_data_model", "TYPE_FP32", "TYPE_INT8")
    found = errors(repo)
    assert (
        "table_data_model/categorical_col_1: unexpected datatype TYPE_INT8 for inference input "
        "'categorical_col_1', expecting TYPE_FP32 — fix: set data_type: TYPE_FP32 (or "
        "re-export the model with INT8)"
    ) in found
    assert any(
        "in ensemble ensemble_multi_modal_model, ensemble tensor preprocessed_table_data_1: inconsistent "
        "data type: TYPE_FP32 is inferred from model table_data_preprocess while TYPE_INT8 is inferred "
        "from model table_data_model" in line
        for line in found
    )


def test_a_malformed_config_names_file_line_and_column(repo: Path) -> None:
    (repo / "image_model" / "config.pbtxt").write_text('name: "image_model"\nplatform: [oops\n')
    found = lines(repo)
    assert any(
        line.startswith("error: image_model: ")
        and "config.pbtxt:2:" in line
        and "cannot parse model configuration" in line
        for line in found
    )


def test_an_empty_config_needs_a_platform(repo: Path) -> None:
    (repo / "table_data_model" / "config.pbtxt").write_text("")
    # Triton auto-completes first: the version folder holds 'model/' (not model.onnx), so nothing
    # tells the backend and the folder name is not of the form model.<backend>
    found = errors(repo)
    assert any(
        line.startswith(
            "table_data_model: Invalid model name: Could not determine backend for model "
            "'table_data_model' with no backend in model configuration. Expected model name of the "
            "form 'model.<backend_name>'. — fix: "
        )
        for line in found
    )


def test_a_config_without_platform_is_auto_completed_from_the_model_file(repo: Path) -> None:
    model = repo / "table_data_model"
    (model / "1" / "model" / "model.onnx").rename(model / "1" / "model.onnx")
    (model / "1" / "model").rmdir()
    edit(repo, "table_data_model", 'platform: "onnxruntime_onnx"', "")
    edit(repo, "table_data_model", 'default_model_filename: "model"', "")
    edit(repo, "table_data_model", 'name: "categorical_col_1"', 'name: "X"')
    report = validate_path(model)
    [notice] = report.warnings
    assert notice.origin == "mlreg"
    assert "Triton's auto-complete serves it with backend 'onnxruntime' (from 1/model.onnx)" in notice.line()
    assert any(
        "unexpected inference input 'X', allowed inputs are: categorical_col_1, categorical_col_2" in line
        for line in (f.line() for f in report.errors)
    )


def test_binary_garbage_where_the_onnx_model_should_be(repo: Path) -> None:
    (repo / "table_data_model/1/model/model.onnx").write_bytes(os.urandom(64) + b"\xff" * 64)
    assert any(
        line.startswith("table_data_model: ") and "not a readable ONNX model" in line for line in errors(repo)
    )


def test_a_truncated_saved_model(repo: Path) -> None:
    pb = repo / "image_model/1/model/saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:100])
    assert any("saved_model.pb: not a readable SavedModel" in line for line in errors(repo))


def test_a_missing_version_folder(repo: Path) -> None:
    shutil.rmtree(repo / "multi_modal_model" / "1")
    found = errors(repo)
    assert any(line.startswith("multi_modal_model: at least one version must be available") for line in found)
    assert any(
        "step 4 (multi_modal_model) of ensemble 'ensemble_multi_modal_model' pins version 1" in line
        for line in found
    )


def test_a_missing_model_file(repo: Path) -> None:
    shutil.rmtree(repo / "image_model" / "1" / "model")
    assert any(
        line.startswith("image_model: unable to find '")
        and "image_model/1/model' for model 'image_model'" in line
        for line in errors(repo)
    )


def test_reshape_with_a_different_element_count(repo: Path) -> None:
    edit(repo, "table_data_model", "dims: [ 10 ]", "dims: [ 10 ]\n    reshape: { shape: [ 3 ] }")
    assert any(
        "model output 'table_model_output' has different size for dims and reshape" in line
        for line in errors(repo)
    )


def test_preferred_batch_size_above_max_batch_size(repo: Path) -> None:
    edit(repo, "multi_modal_model", "preferred_batch_size: 4", "preferred_batch_size: 512")
    assert (
        "multi_modal_model: dynamic batching preferred size must be <= max batch size for "
        "multi_modal_model — fix: lower it to at most 256 or raise max_batch_size"
    ) in errors(repo)


def test_version_policy_naming_a_missing_version(repo: Path) -> None:
    edit(
        repo,
        "image_model",
        "max_batch_size: 256",
        "max_batch_size: 256\nversion_policy: { specific: { versions: [ 1, 3 ] } }",
    )
    assert any(
        line.startswith("image_model: version_policy of model 'image_model' names version 3")
        for line in errors(repo)
    )


def test_ensemble_wiring_faults(repo: Path) -> None:
    edit(
        repo,
        "ensemble_multi_modal_model",
        'input_map { key: "table_data_input_2" value: "table_data_input_2" }',
        "",
    )
    edit(
        repo,
        "ensemble_multi_modal_model",
        'output_map { key: "output" value: "image_model_output" }',
        'output_map { key: "output" value: "table_data_model_output" }',
    )
    found = errors(repo)
    assert (
        "ensemble_multi_modal_model/table_data_input_2: in ensemble ensemble_multi_modal_model, input "
        "table_data_input_2 in model table_data_preprocess is not mapped to any ensemble tensors — fix: "
        'add input_map { key: "table_data_input_2" value: "<tensor>" } to the step of table_data_preprocess'
    ) in found
    assert any(
        "ensemble tensor 'table_data_model_output' can appear in an output map only once for ensemble "
        "'ensemble_multi_modal_model' step 3" in line
        for line in found
    )
    assert any(
        "ensemble input 'table_data_input_2' for ensemble ensemble_multi_modal_model' is not used" in line
        for line in found
    )
    assert any(
        "ensemble tensor 'image_model_output' is unused in ensemble 'ensemble_multi_modal_model': it is "
        "read by a step but is neither an ensemble input nor written by any step" in line
        for line in found
    )


def test_a_missing_member_is_reported_once_without_a_cascade(repo: Path) -> None:
    shutil.rmtree(repo / "image_model")
    found = errors(repo)
    assert found == [
        "ensemble_multi_modal_model: ensemble ensemble_multi_modal_model contains models that are not "
        "available or ambiguous: image_model — fix: add the model(s) to the repository or fix the "
        "steps' model_name"
    ]


def test_ensembles_that_contain_each_other(repo: Path) -> None:
    for a, b in (("loop_a", "loop_b"), ("loop_b", "loop_a")):
        (repo / a / "1").mkdir(parents=True)
        (repo / a / "config.pbtxt").write_text(
            f'name: "{a}"\nplatform: "ensemble"\ninput [{{ name: "x" data_type: TYPE_FP32 dims: [1] }}]\n'
            f'output [{{ name: "y" data_type: TYPE_FP32 dims: [1] }}]\n'
            f'ensemble_scheduling {{ step [{{ model_name: "{b}" model_version: -1 '
            f'input_map {{ key: "x" value: "x" }} output_map {{ key: "y" value: "y" }} }}] }}\n'
        )
    assert any(
        "circular dependency between ensembles: loop_a -> loop_b -> loop_a" in line for line in errors(repo)
    )


def test_odd_folders_are_findings_not_tracebacks(repo: Path) -> None:
    (repo / "loop").symlink_to(repo / "loop")
    os.mkdir(os.fsencode(repo) + b"/bad_\xff_name")
    for i in range(100):  # many: the finding names a few and counts the rest
        (repo / f"empty_{i:05d}").mkdir()
    report = validate_path(repo)
    assert report.errors == []
    [warning] = report.warnings
    assert warning.message.startswith("101 folder(s) hold no config.pbtxt: bad_\\xff_name, ")
    assert "and 96 more" in warning.message


def test_cli_usage_error_and_json(tmp_path: Path, standin_repository: Path) -> None:
    missing = CliRunner().invoke(app, ["validate", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert f"error: '{tmp_path / 'nope'}' does not exist" in missing.output
    result = CliRunner().invoke(app, ["validate", str(standin_repository / "image_model"), "--json"])
    assert result.exit_code == 0
    assert '"ok": true' in result.output


def test_an_unknown_field_is_a_parse_finding(repo: Path) -> None:
    edit(repo, "image_preprocess", "max_batch_size: 256", "max_batch_size: 256\nmax_batchsize: 4")
    (repo / "image_model" / "1" / "model" / "loop").symlink_to(repo / "image_model/1/model/loop")
    found = errors(repo)
    assert any(
        line.startswith("image_preprocess: ")
        and "config.pbtxt:4:1: cannot parse model configuration" in line
        and "max_batchsize" in line
        for line in found
    )
    assert len(found) == 1


def _corpus_model(case: str, tmp_path: Path) -> Path:
    from tests.conformance.corpus import load_cases, materialize

    [found] = [c for c in load_cases() if c.name == case]
    materialize(found, tmp_path)
    return tmp_path


def test_the_gpu_count_comes_from_the_option_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _corpus_model("instance_group_gpu_without_gpus", tmp_path)
    unknown = CliRunner().invoke(app, ["validate", str(repo)])
    assert unknown.exit_code == 0, unknown.output  # GPU count unknown: KIND_GPU may be right
    none = CliRunner().invoke(app, ["validate", str(repo), "--gpus", "0"])
    assert none.exit_code == 1
    assert (
        "error: ig_gpu: instance group ig_gpu_0 of model ig_gpu has kind KIND_GPU but no GPUs are available"
        in none.output
    )
    monkeypatch.setenv("MLREG_GPUS", "0")
    assert CliRunner().invoke(app, ["validate", str(repo)]).exit_code == 1
    assert CliRunner().invoke(app, ["validate", str(repo), "--gpus", "1"]).exit_code == 0
    edit(repo, "ig_gpu", "kind: KIND_GPU", "kind: KIND_GPU gpus: [ 3 ]")
    [finding] = validate_path(repo, gpus=2).errors
    assert finding.message == (
        "instance group ig_gpu_0 of model ig_gpu specifies invalid or unsupported gpu id 3. GPUs with at "
        "least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1"
    )
    monkeypatch.setenv("MLREG_GPUS", "two")
    bad = CliRunner().invoke(app, ["validate", str(repo)])
    assert bad.exit_code == 2
    assert "error: MLREG_GPUS='two' is not a GPU count" in bad.output


def test_string_tensors_are_type_string_in_the_config(tmp_path: Path) -> None:
    repo = _corpus_model("onnx_string_initializer_and_sequence_controls", tmp_path)
    assert validate_path(repo).errors == []  # TYPE_STRING, the START control, the initializer W
    edit(repo, "onnx_mixed", 'name: "TEXT" data_type: TYPE_STRING', 'name: "TEXT" data_type: TYPE_INT32')
    config = repo / "onnx_mixed" / "config.pbtxt"
    config.write_text(config.read_text().split("sequence_batching")[0])
    assert errors(repo) == [
        "onnx_mixed/TEXT: unexpected datatype TYPE_INT32 for inference input 'TEXT', expecting "
        "TYPE_STRING — fix: set data_type: TYPE_STRING (or re-export the model with INT32)",
        "onnx_mixed: unable to load model 'onnx_mixed', configuration expects 1 inputs, model "
        "provides 2 — fix: declare the model input(s) START in config.pbtxt",
    ]


def test_findings_say_who_refuses_them_in_json(tmp_path: Path) -> None:
    repo = _corpus_model("ensemble_batch_shape_fault_beyond_triton", tmp_path)
    result = CliRunner().invoke(app, ["validate", str(repo), "--json"])
    assert result.exit_code == 1
    assert '"origin": "mlreg"' in result.output
    assert '"beyond_triton": 2' in result.output
    human = CliRunner().invoke(app, ["validate", str(repo)])
    assert human.output.splitlines()[-1] == (
        "2 model(s) checked: 2 error(s), 0 warning(s) (2 of them [mlreg]: beyond what Triton refuses)"
    )


def test_a_config_without_tensors_is_left_to_the_backends_auto_complete(tmp_path: Path) -> None:
    repo = _corpus_model("onnx_string_initializer_and_sequence_controls", tmp_path)
    (repo / "onnx_mixed" / "config.pbtxt").write_text('name: "onnx_mixed"\nplatform: "onnxruntime_onnx"\n')
    report = validate_path(repo)
    assert report.errors == []
    [notice] = report.warnings
    assert notice.line() == (
        "onnx_mixed: [mlreg] no inputs, outputs or max_batch_size given: the onnxruntime backend fills "
        "them from the model file — fix: declare them in config.pbtxt: ensembles and callers read the "
        "contract there"
    )
