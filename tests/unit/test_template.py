"""The built template: every artifact's tensors equal its config.pbtxt contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import template
from registry.contracts.config import data_type_name, full_shape, load_config
from registry.contracts.signature import read_onnx, read_saved_model
from registry.errors import TemplateError
from tests.conftest import TEMPLATE

SEED_MODELS = {
    "table_data_preprocess",
    "table_data_model",
    "image_preprocess",
    "image_model",
    "multi_modal_model",
    "ensemble_multi_modal_model",
}
ARTIFACT_READERS = {
    "onnxruntime_onnx": read_onnx,
    "tensorflow_savedmodel": read_saved_model,
}


def test_template_holds_the_six_seed_models() -> None:
    assert {p.name for p in template.template_models(TEMPLATE)} == SEED_MODELS


def test_build_writes_every_model_with_a_version_folder(built_repository: Path) -> None:
    assert {p.name for p in built_repository.iterdir()} == SEED_MODELS
    for model in SEED_MODELS:
        assert (built_repository / model / "1").is_dir()
        assert not list((built_repository / model).glob("*_exporter.py"))


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


def test_python_models_define_the_backend_entry_point(built_repository: Path) -> None:
    for model in ("table_data_preprocess", "image_preprocess"):
        source = (built_repository / model / "1" / "model.py").read_text()
        assert "class TritonPythonModel" in source
        assert "def execute(self, requests)" in source


def test_cpu_build_turns_gpu_instance_groups_into_cpu(built_repository: Path) -> None:
    from tritonclient.grpc import model_config_pb2

    for model in ("image_model", "multi_modal_model"):
        original = load_config(TEMPLATE / model / "config.pbtxt")
        built = load_config(built_repository / model / "config.pbtxt")
        assert original.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert built.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert built.input == original.input
        assert built.output == original.output


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


def test_build_refuses_unknown_models(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="no model named nope in the template"):
        template.build(TEMPLATE, tmp_path, models=["nope"])


def test_build_refuses_a_non_empty_folder_without_force(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(TemplateError, match="exists and is not empty"):
        template.build(TEMPLATE, tmp_path, models=["table_data_preprocess"])
    assert (tmp_path / "keep.txt").read_text() == "mine"
