"""NVIDIA's onnx/triton flavors as Triton folders: Triton's auto-complete rules, the folder layout,
the refusals, and the plugin's input/output shapes (no MLflow, no server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlreg.deployment_io import _arrays, _deployment, check_name
from registry.contracts.config import CONFIG_NAME, load_config, model_config_pb2, parse_config
from registry.contracts.signature import read_onnx
from registry.errors import ContractError, UsageError
from registry.nvidia_flavors import (
    check_flavor,
    choose_flavor,
    complete,
    complete_onnx_io,
    onnx_folder,
    source_of,
    triton_folder,
)
from tests.conftest import ROOT

EXAMPLES = ROOT / "tests" / "fixtures" / "nvidia_mlflow_triton"
EXAMPLE_ONNX = EXAMPLES / "onnx_float32_int32_int32" / "1" / "model.onnx"


def _onnx(path: Path, inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, list]]) -> Path:
    """A tiny ONNX graph (Identity from the first input to every output) with the given tensors."""
    import onnx
    from onnx import helper

    nodes = [helper.make_node("Identity", [inputs[0][0]], [name]) for name, _, _ in outputs]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _logged(tmp_path: Path) -> Path:
    """What mlflow.onnx.log_model writes: MLmodel's files beside model.onnx."""
    logged = tmp_path / "logged"
    logged.mkdir()
    shutil.copy2(EXAMPLE_ONNX, logged / "model.onnx")
    for name in ("MLmodel", "conda.yaml", "python_env.yaml", "requirements.txt"):
        (logged / name).write_text("x\n")
    return logged


# -- Triton's auto-complete -------------------------------------------------------------------------


def test_a_graph_with_a_variable_first_dim_batches_with_the_default_max_batch_size() -> None:
    config = model_config_pb2().ModelConfig()
    complete_onnx_io("m", config, read_onnx(EXAMPLE_ONNX))
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    dims = {t.name: (t.data_type, list(t.dims)) for t in [*config.input, *config.output]}
    fp32, int32 = (model_config_pb2().DataType.Value(n) for n in ("TYPE_FP32", "TYPE_INT32"))
    assert dims == {
        "INPUT0": (fp32, [16]),
        "INPUT1": (fp32, [16]),
        "OUTPUT0": (int32, [16]),
        "OUTPUT1": (int32, [16]),
    }


def test_a_configured_max_batch_size_is_kept_and_batching_of_one_adds_no_scheduler() -> None:
    config = parse_config("max_batch_size: 1")
    complete_onnx_io("m", config, read_onnx(EXAMPLE_ONNX))
    assert config.max_batch_size == 1
    assert not config.HasField("dynamic_batching")


def test_a_fixed_first_dim_does_not_batch_and_keeps_every_dim(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", [("x", 1, [2, 3])], [("y", 1, [2, 3])])
    config = model_config_pb2().ModelConfig()
    complete_onnx_io("m", config, read_onnx(path))
    assert (config.max_batch_size, list(config.input[0].dims)) == (0, [2, 3])


def test_a_non_batching_graph_with_max_batch_size_is_refused_in_tritons_words(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", [("x", 1, [2, 3])], [("y", 1, [2, 3])])
    with pytest.raises(
        ContractError,
        match="autofill failed for model 'm': model does not support batching while non-zero max_batch_size",
    ):
        complete_onnx_io("m", parse_config("max_batch_size: 8"), read_onnx(path))


def test_a_scalar_per_item_becomes_dims_1_with_an_empty_reshape(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", [("x", 7, ["batch"])], [("y", 7, ["batch"])])
    config = model_config_pb2().ModelConfig()
    complete_onnx_io("m", config, read_onnx(path))
    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [1]
    assert config.input[0].HasField("reshape")
    assert list(config.input[0].reshape.shape) == []


def test_complete_fills_the_backend_fields_from_the_version_folder(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    shutil.copy2(EXAMPLE_ONNX, folder / "1" / "model.onnx")
    config = model_config_pb2().ModelConfig()
    assert complete("m", config, folder)
    assert (config.platform, config.backend, config.default_model_filename) == (
        "onnxruntime_onnx",
        "onnxruntime",
        "model.onnx",
    )
    assert len(config.input) == 2


# -- the folders --------------------------------------------------------------------------------------


def test_onnx_without_a_config_writes_the_autocompleted_one(tmp_path: Path) -> None:
    folder = tmp_path / "onnx_model"
    assert onnx_folder("onnx_model", _logged(tmp_path), {"data": "model.onnx"}, folder, None) == "generated"
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.onnx"]  # MLflow's files left out
    config = load_config(folder / CONFIG_NAME)
    assert (config.platform, config.max_batch_size, len(config.output)) == ("onnxruntime_onnx", 4, 2)


def test_onnx_with_a_logged_complete_config_keeps_its_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    text = (EXAMPLES / "onnx_float32_int32_int32" / CONFIG_NAME).read_text()
    assert onnx_folder("m", _logged(tmp_path), {"data": "model.onnx"}, folder, text) == "logged"
    assert (folder / CONFIG_NAME).read_text() == text


def test_a_logged_config_naming_another_model_is_renamed(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    text = (EXAMPLES / "onnx_float32_int32_int32" / CONFIG_NAME).read_text() + '\nname: "other"\n'
    onnx_folder("m", _logged(tmp_path), {"data": "model.onnx"}, folder, text)
    config = load_config(folder / CONFIG_NAME)
    assert (config.name, config.max_batch_size) == ("m", 8)


def test_onnx_without_its_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="has no file 'nope.onnx'"):
        onnx_folder("m", _logged(tmp_path), {"data": "nope.onnx"}, tmp_path / "m", None)


def test_triton_flavor_takes_the_folder_and_the_version_it_serves(tmp_path: Path) -> None:
    logged = tmp_path / "logged"
    source = logged / "onnx_float32_int32_int32"
    shutil.copytree(EXAMPLES / "onnx_float32_int32_int32", source)
    shutil.copytree(source / "1", source / "3")
    folder = tmp_path / "m"
    assert triton_folder("m", logged, {"data": source.name}, folder) == "model folder"
    assert sorted(p.name for p in folder.iterdir()) == ["3", CONFIG_NAME]  # latest, as Triton's default
    specific = tmp_path / "specific"
    config = (
        (source / CONFIG_NAME).read_text().replace("latest { num_versions: 1 }", "specific { versions: 1 }")
    )
    (source / CONFIG_NAME).write_text(config)
    triton_folder("m", logged, {"data": source.name}, specific)
    assert sorted(p.name for p in specific.iterdir()) == ["1", CONFIG_NAME]


def test_triton_flavor_without_a_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "logged" / "x" / "1").mkdir(parents=True)
    with pytest.raises(ContractError, match=r"(?s)holds no config\.pbtxt.*"):
        triton_folder("m", tmp_path / "logged", {"data": "x"}, tmp_path / "m")


# -- choosing and refusing -----------------------------------------------------------------------------


def test_the_flavor_is_chosen_or_refused_naming_what_was_logged() -> None:
    assert choose_flavor("m", "1", {"onnx": {}, "python_function": {}}, None) == "onnx"
    assert choose_flavor("m", "1", {"onnx": {}, "triton": {}}, None) == "triton"
    with pytest.raises(UsageError, match=r"has no 'triton' flavor \(its flavors: onnx, python_function\)"):
        choose_flavor("m", "1", {"onnx": {}, "python_function": {}}, "triton")
    with pytest.raises(UsageError, match="neither the 'triton' nor the 'onnx' flavor"):
        choose_flavor("m", "1", {"sklearn": {}}, None)
    with pytest.raises(UsageError, match="flavor 'sklearn' is not deployable by mlreg"):
        check_flavor("sklearn")


@pytest.mark.parametrize("name", ["", "   ", "\n", "\t"])
def test_empty_names_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="Model name cannot be empty. Please enter a valid name to deploy."):
        check_name(name)


@pytest.mark.parametrize(
    "name", ["/opt/sys/", "../../etc/passwd", "test_models/../identity_py", "..", "a\\b"]
)
def test_names_escaping_the_repository_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="Path traversal is not allowed in model's name"):
        check_name(name)


@pytest.mark.parametrize("name", ["model123", "model.version1", "...", "..my_model", "model..1"])
def test_nvidias_valid_names_pass_the_name_check(name: str) -> None:
    assert check_name(name) == name


def test_source_of_reads_the_lineage_tags() -> None:
    assert source_of({"derived_from": "1", "derived_flavor": "onnx"}) == ("1", "onnx")
    assert source_of({"derived_from": "1"}) is None  # an ONNX conversion of mlreg's own


# -- the plugin's input and output shapes ------------------------------------------------------------------


def test_nvidias_input_document_is_read_as_a_dict_and_as_the_clis_dataframe() -> None:
    import pandas as pd

    document = json.loads((EXAMPLES / "input.json").read_text())
    assert set(_arrays(document)) == {"INPUT0", "INPUT1"}
    frame = pd.read_json(EXAMPLES / "input.json")  # what `mlflow deployments predict` sends
    arrays = _arrays(frame)
    assert arrays["INPUT0"] == document["inputs"]["INPUT0"]
    columns = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
    assert _arrays(columns) == {"a": [1, 2], "b": [3, 4]}  # one column per input, as before


def test_a_deployment_is_ready_only_when_every_target_serves_what_is_desired() -> None:
    row = {"model": "m", "alias": "2", "desired": ["2"], "serving": {"a:8001": ["2"]}, "drift": []}
    assert _deployment("local", row)["state"] == "READY"
    assert _deployment("local", {**row, "serving": {"a:8001": ["1"]}})["state"] == "UNAVAILABLE"
    assert _deployment("local", {**row, "drift": ["x"]})["state"] == "UNAVAILABLE"
