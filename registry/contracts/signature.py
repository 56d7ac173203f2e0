"""What a model artifact really declares: one reader per format, one common structure.

``TensorSpec.shape`` is the artifact's full shape (batch dimension included);
an unknown dimension is ``-1`` and a named symbolic one (ONNX ``dim_param``)
keeps its name.  Data types use Triton's names (``FP32``, ``INT8``, ...).
Neither reader imports TensorFlow nor loads ONNX external weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from registry.errors import ContractError

Dim = int | str

ONNX_TYPES = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}
TF_TYPES = {
    1: "FP32",
    2: "FP64",
    3: "INT32",
    4: "UINT8",
    5: "INT16",
    6: "INT8",
    7: "BYTES",
    9: "INT64",
    10: "BOOL",
    14: "BF16",
    17: "UINT16",
    19: "FP16",
    22: "UINT32",
    23: "UINT64",
}
SAVED_MODEL_INIT_OP = "__saved_model_init_op"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...] | None  # None: unknown rank

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


# -- ONNX --------------------------------------------------------------------------------------


def _onnx_tensor(value: Any) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = ONNX_TYPES.get(tensor_type.elem_type, f"UNSUPPORTED({tensor_type.elem_type})")
    if not tensor_type.HasField("shape"):
        return TensorSpec(value.name, dtype, None)
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or -1)
    return TensorSpec(value.name, dtype, tuple(dims))


def read_onnx(path: Path) -> Signature:
    """Graph inputs (minus initializers) and outputs of an ONNX file or a folder holding model.onnx."""
    import onnx

    if path.is_dir():
        path = path / "model.onnx"
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ContractError(
            f"{path}: not a readable ONNX model: {exc}",
            fix="re-export the model (tf2onnx / torch.onnx.export) and check the file is complete",
            file=str(path),
        ) from exc
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_onnx_tensor(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_onnx_tensor(v) for v in model.graph.output)
    return Signature(inputs, outputs, str(path))


# -- SavedModel --------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _saved_model_class() -> Any:
    """A minimal SavedModel message class (field numbers from TensorFlow's .proto files)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="mlreg_saved_model.proto", package="mlreg_tf")

    def message(name: str, fields: list[tuple[str, int, int, int, str]], parent: Any = None) -> Any:
        msg = (parent.nested_type if parent is not None else file.message_type).add(name=name)
        for fname, number, ftype, label, type_name in fields:
            msg.field.add(name=fname, number=number, type=ftype, label=label, type_name=type_name or None)
        return msg

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Dim", [("size", 1, F.TYPE_INT64, opt, ""), ("name", 2, F.TYPE_STRING, opt, "")])
    message(
        "TensorShapeProto",
        [("dim", 2, F.TYPE_MESSAGE, rep, ".mlreg_tf.Dim"), ("unknown_rank", 3, F.TYPE_BOOL, opt, "")],
    )
    message(
        "TensorInfo",
        [
            ("name", 1, F.TYPE_STRING, opt, ""),
            ("dtype", 2, F.TYPE_INT32, opt, ""),
            ("tensor_shape", 3, F.TYPE_MESSAGE, opt, ".mlreg_tf.TensorShapeProto"),
        ],
    )
    signature = message(
        "SignatureDef",
        [
            ("inputs", 1, F.TYPE_MESSAGE, rep, ".mlreg_tf.SignatureDef.InputsEntry"),
            ("outputs", 2, F.TYPE_MESSAGE, rep, ".mlreg_tf.SignatureDef.OutputsEntry"),
            ("method_name", 3, F.TYPE_STRING, opt, ""),
        ],
    )
    for entry in ("InputsEntry", "OutputsEntry"):
        nested = message(
            entry,
            [("key", 1, F.TYPE_STRING, opt, ""), ("value", 2, F.TYPE_MESSAGE, opt, ".mlreg_tf.TensorInfo")],
            parent=signature,
        )
        nested.options.map_entry = True
    meta = message(
        "MetaGraphDef",
        [("signature_def", 5, F.TYPE_MESSAGE, rep, ".mlreg_tf.MetaGraphDef.SignatureDefEntry")],
    )
    entry = message(
        "SignatureDefEntry",
        [("key", 1, F.TYPE_STRING, opt, ""), ("value", 2, F.TYPE_MESSAGE, opt, ".mlreg_tf.SignatureDef")],
        parent=meta,
    )
    entry.options.map_entry = True
    message(
        "SavedModel",
        [
            ("saved_model_schema_version", 1, F.TYPE_INT64, opt, ""),
            ("meta_graphs", 2, F.TYPE_MESSAGE, rep, ".mlreg_tf.MetaGraphDef"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("mlreg_tf.SavedModel"))


def _tf_tensor(key: str, info: Any) -> TensorSpec:
    dtype = TF_TYPES.get(info.dtype, f"UNSUPPORTED({info.dtype})")
    if info.tensor_shape.unknown_rank:
        return TensorSpec(key, dtype, None)
    return TensorSpec(key, dtype, tuple(int(d.size) for d in info.tensor_shape.dim))


def saved_model_signatures(path: Path) -> dict[str, Signature]:
    """Every serving signature of a SavedModel folder (the init op skipped)."""
    from google.protobuf.message import DecodeError

    pb = path / "saved_model.pb"
    try:
        data = pb.read_bytes()
        saved = _saved_model_class().FromString(data)
    except (OSError, DecodeError) as exc:
        raise ContractError(
            f"{pb}: not a readable SavedModel: {exc}",
            fix="re-export the model with tf.saved_model.save / keras model.export",
            file=str(pb),
        ) from exc
    found: dict[str, Signature] = {}
    for meta in saved.meta_graphs:
        for key, sig in meta.signature_def.items():
            if key == SAVED_MODEL_INIT_OP:
                continue
            inputs = tuple(_tf_tensor(k, v) for k, v in sorted(sig.inputs.items()))
            outputs = tuple(_tf_tensor(k, v) for k, v in sorted(sig.outputs.items()))
            found[key] = Signature(inputs, outputs, f"{path}#{key}")
    return found


def read_saved_model(path: Path, signature_key: str = "serving_default") -> Signature:
    signatures = saved_model_signatures(path)
    if signature_key not in signatures:
        raise ContractError(
            f"{path}: the SavedModel has no signature '{signature_key}' "
            f"(it has: {', '.join(sorted(signatures)) or 'none'})",
            fix="export with signatures={'serving_default': fn} or set the signature key",
            file=str(path),
        )
    return signatures[signature_key]
