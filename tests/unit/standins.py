"""Stand-in artifacts for the template's Keras models, written without TensorFlow.

A stand-in declares exactly the tensors of its model's ``config.pbtxt`` (names, types, the batch
dimension first where the model batches), laid out as the real exporters lay them out
(``1/model/model.onnx`` for tf2onnx, ``1/model/saved_model.pb`` for Keras' SavedModel export).
That is what the real exports declare too: tests/integration/test_unit_moved_exports.py checks
it on the real ones, so a unit test reading a stand-in reads what a real export would say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnx import helper, numpy_helper

from registry import template
from registry.contracts.config import data_type_name, load_config
from registry.contracts.signature import ONNX_TYPES, SAVED_MODEL_INIT_OP, TF_TYPES, _saved_model_class

ONNX_CODES = {name: code for code, name in ONNX_TYPES.items()}
TF_CODES = {name: code for code, name in TF_TYPES.items()}


def run_exporter(model_dir: Path, version_dir: Path, seed: int) -> dict[str, object]:
    """``registry.template.run_exporter``'s stand-in: same folder, no TensorFlow."""
    if template.exporter_path(model_dir) is None:
        return {}
    config = load_config(model_dir / "config.pbtxt")
    writers = {"onnxruntime_onnx": write_onnx, "tensorflow_savedmodel": write_saved_model}
    writers[config.platform](config, version_dir / config.default_model_filename)
    return {"standin": config.platform}


def _shape(config: Any, dims: Any, batch: str | int) -> list[str | int]:
    return ([batch] if config.max_batch_size > 0 else []) + [int(d) for d in dims]


def write_onnx(config: Any, folder: Path) -> Path:
    """Concat(inputs) -> MatMul(weights), the shape of what tf2onnx writes: symbolic batch dims
    (``unk__N``), real weights as initializers, opset 13."""
    import numpy as np

    inputs = [
        helper.make_tensor_value_info(
            t.name, ONNX_CODES[data_type_name(t.data_type)], _shape(config, t.dims, f"unk__{i}")
        )
        for i, t in enumerate(config.input)
    ]
    [out] = config.output
    width = sum(int(t.dims[-1]) for t in config.input)
    weights = numpy_helper.from_array(np.full((width, int(out.dims[-1])), 0.5, np.float32), "weights")
    output = helper.make_tensor_value_info(
        out.name, ONNX_CODES[data_type_name(out.data_type)], _shape(config, out.dims, "unk__out")
    )
    graph = helper.make_graph(
        [
            helper.make_node("Concat", [t.name for t in config.input], ["joined"], axis=-1),
            helper.make_node("MatMul", ["joined", "weights"], [out.name]),
        ],
        config.name,
        inputs,
        [output],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="standin")
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def write_saved_model(config: Any, folder: Path) -> Path:
    """A ``saved_model.pb`` whose ``serving_default`` signature is the config's tensors (batch
    dimension -1) beside the init op, as Keras' ``model.export`` writes it; no graph, no weights."""
    saved = _saved_model_class()(saved_model_schema_version=1)
    meta = saved.meta_graphs.add()
    serving = meta.signature_def["serving_default"]
    serving.method_name = "tensorflow/serving/predict"
    for declared, signature in ((config.input, serving.inputs), (config.output, serving.outputs)):
        for i, tensor in enumerate(declared):
            info = signature[tensor.name]
            info.name = f"serving_default_{tensor.name}:{i}"
            info.dtype = TF_CODES[data_type_name(tensor.data_type)]
            for size in _shape(config, tensor.dims, -1):
                info.tensor_shape.dim.add(size=int(size))
    meta.signature_def[SAVED_MODEL_INIT_OP].outputs[SAVED_MODEL_INIT_OP].name = "NoOp"
    (folder / "variables").mkdir(parents=True, exist_ok=True)
    (folder / "saved_model.pb").write_bytes(saved.SerializeToString())
    return folder / "saved_model.pb"
