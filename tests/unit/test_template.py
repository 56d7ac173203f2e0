"""``registry.template.build``: the layout it writes and the CPU rewrite (the exports themselves, with
TensorFlow: tests/integration/test_unit_moved_exports.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import template
from registry.contracts.config import load_config
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


def test_template_holds_the_six_seed_models() -> None:
    assert {p.name for p in template.template_models(TEMPLATE)} == SEED_MODELS


def test_build_writes_every_model_with_a_version_folder(standin_repository: Path) -> None:
    assert {p.name for p in standin_repository.iterdir()} == SEED_MODELS
    for model in SEED_MODELS:
        assert (standin_repository / model / "1").is_dir()
        assert not list((standin_repository / model).glob("*_exporter.py"))


def test_python_models_define_the_backend_entry_point(standin_repository: Path) -> None:
    for model in ("table_data_preprocess", "image_preprocess"):
        source = (standin_repository / model / "1" / "model.py").read_text()
        assert "class TritonPythonModel" in source
        assert "def execute(self, requests)" in source


def test_cpu_build_turns_gpu_instance_groups_into_cpu(standin_repository: Path) -> None:
    from tritonclient.grpc import model_config_pb2

    for model in ("image_model", "multi_modal_model"):
        original = load_config(TEMPLATE / model / "config.pbtxt")
        built = load_config(standin_repository / model / "config.pbtxt")
        assert original.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert built.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert built.input == original.input
        assert built.output == original.output


def test_build_refuses_unknown_models(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="no model named nope in the template"):
        template.build(TEMPLATE, tmp_path, models=["nope"])


def test_build_refuses_a_non_empty_folder_without_force(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(TemplateError, match="exists and is not empty"):
        template.build(TEMPLATE, tmp_path, models=["table_data_preprocess"])
    assert (tmp_path / "keep.txt").read_text() == "mine"
