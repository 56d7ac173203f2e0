"""What a model artifact really declares: one reader per format, one common structure.

``TensorSpec.shape`` is the artifact's full shape (batch dimension included);
an unknown dimension is ``-1`` and a named symbolic one (ONNX ``dim_param``)
keeps its name.  Data types use Triton's names (``FP32``, ``INT8``, ...).
Neither reader imports TensorFlow or ``onnx``, nor loads ONNX external weights.
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
    initializers: tuple[str, ...] = ()  # ONNX: the graph's initializer (weight) names, sorted

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "source": self.source,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.initializers:
            found["initializers"] = list(self.initializers)
        return found


# -- minimal protobuf schemas -------------------------------------------------------------------
#
# Importing ``onnx`` (and TensorFlow's ``saved_model_pb2``) costs more than the whole validation:
# the two readers parse the files with message classes built at runtime from the few fields they
# read, numbered as in onnx/onnx.proto and tensorflow's saved_model.proto / meta_graph.proto.
# Every other field (weights, graph nodes) is skipped as an unknown field.

# (name, number, type, repeated, message type): one field of a minimal message
Field = tuple[str, int, str, bool, str]
_SCALAR = {"int64": 3, "int32": 5, "bool": 8, "string": 9, "message": 11}


def _add_message(container: Any, name: str, fields: list[Field], package: str) -> Any:
    from google.protobuf import descriptor_pb2  # lazy: ~20 ms, signatures only

    F = descriptor_pb2.FieldDescriptorProto
    msg = container.add(name=name)
    for fname, number, ftype, repeated, type_name in fields:
        msg.field.add(
            name=fname,
            number=number,
            type=_SCALAR[ftype],
            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL,
            type_name=f".{package}.{type_name}" if type_name else None,
        )
    return msg


def _map_entry(parent: Any, name: str, value_type: str, package: str) -> None:
    key_value: list[Field] = [("key", 1, "string", False, ""), ("value", 2, "message", False, value_type)]
    _add_message(parent.nested_type, name, key_value, package).options.map_entry = True


def _message_class(package: str, messages: dict[str, list[Field]], root: str, maps: Any = None) -> Any:
    """A message class for ``package.root`` from ``messages``; ``maps(file)`` adds map entries."""
    from google.protobuf import (
        descriptor_pb2,
        descriptor_pool,
        message_factory,
    )  # lazy: ~20 ms, signatures only

    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package)
    for name, fields in messages.items():
        _add_message(file.message_type, name, fields, package)
    if maps is not None:
        maps(file)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{root}"))


# -- ONNX --------------------------------------------------------------------------------------

ONNX_MESSAGES: dict[str, list[Field]] = {
    "ModelProto": [("ir_version", 1, "int64", False, ""), ("graph", 7, "message", False, "GraphProto")],
    "GraphProto": [
        ("initializer", 5, "message", True, "TensorProto"),
        ("input", 11, "message", True, "ValueInfoProto"),
        ("output", 12, "message", True, "ValueInfoProto"),
        ("sparse_initializer", 15, "message", True, "SparseTensorProto"),
    ],
    "TensorProto": [("name", 8, "string", False, "")],
    "SparseTensorProto": [("values", 1, "message", False, "TensorProto")],
    "ValueInfoProto": [("name", 1, "string", False, ""), ("type", 2, "message", False, "TypeProto")],
    "TypeProto": [("tensor_type", 1, "message", False, "TensorType")],
    "TensorType": [
        ("elem_type", 1, "int32", False, ""),
        ("shape", 2, "message", False, "TensorShapeProto"),
    ],
    "TensorShapeProto": [("dim", 1, "message", True, "Dimension")],
    "Dimension": [("dim_value", 1, "int64", False, ""), ("dim_param", 2, "string", False, "")],
}


@lru_cache(maxsize=1)
def _onnx_model_class() -> Any:
    """A minimal ModelProto: graph inputs, outputs and initializer names (onnx.proto numbers)."""
    return _message_class("mlreg_onnx", ONNX_MESSAGES, "ModelProto")


def _onnx_tensor(value: Any) -> TensorSpec:
    if not value.type.HasField("tensor_type"):
        return TensorSpec(value.name, "UNSUPPORTED(not a tensor)", None)
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


def _onnx_unreadable(path: Path, why: str) -> ContractError:
    return ContractError(
        f"{path}: not a readable ONNX model: {why}",
        fix="re-export the model (tf2onnx / torch.onnx.export) and check the file is complete",
        file=str(path),
    )


def _parse_onnx(path: Path) -> Any:
    from google.protobuf.message import DecodeError  # lazy: ~20 ms, signatures only

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _onnx_unreadable(path, exc.strerror or str(exc)) from exc
    if not data:
        raise _onnx_unreadable(path, "the file is empty (0 bytes)")
    try:
        model = _onnx_model_class().FromString(data)
    except DecodeError as exc:
        raise _onnx_unreadable(path, "its bytes do not parse as an ONNX ModelProto (truncated?)") from exc
    if not model.HasField("graph") or not model.ir_version:
        raise _onnx_unreadable(path, "the file holds no ONNX graph (no ir_version or graph)")
    return model


def read_onnx(path: Path) -> Signature:
    """Graph inputs (minus initializers) and outputs of an ONNX file or a folder holding model.onnx.

    Initializer names are kept in ``Signature.initializers`` (a graph input of the same name is
    a weight with a default, not a request input).  External weights are never opened.
    """
    if path.is_dir():
        path = path / "model.onnx"
    graph = _parse_onnx(path).graph
    names = [init.name for init in graph.initializer]
    names += [sparse.values.name for sparse in graph.sparse_initializer]
    initializers = frozenset(names)
    inputs = tuple(_onnx_tensor(v) for v in graph.input if v.name not in initializers)
    outputs = tuple(_onnx_tensor(v) for v in graph.output)
    return Signature(inputs, outputs, str(path), initializers=tuple(sorted(initializers)))


# -- SavedModel --------------------------------------------------------------------------------

SAVED_MODEL_MESSAGES: dict[str, list[Field]] = {
    "Dim": [("size", 1, "int64", False, ""), ("name", 2, "string", False, "")],
    "TensorShapeProto": [("dim", 2, "message", True, "Dim"), ("unknown_rank", 3, "bool", False, "")],
    "TensorInfo": [
        ("name", 1, "string", False, ""),
        ("dtype", 2, "int32", False, ""),
        ("tensor_shape", 3, "message", False, "TensorShapeProto"),
    ],
    "SignatureDef": [
        ("inputs", 1, "message", True, "SignatureDef.InputsEntry"),
        ("outputs", 2, "message", True, "SignatureDef.OutputsEntry"),
        ("method_name", 3, "string", False, ""),
    ],
    "MetaGraphDef": [("signature_def", 5, "message", True, "MetaGraphDef.SignatureDefEntry")],
    "SavedModel": [
        ("saved_model_schema_version", 1, "int64", False, ""),
        ("meta_graphs", 2, "message", True, "MetaGraphDef"),
    ],
}


def _saved_model_maps(file: Any) -> None:
    by_name = {m.name: m for m in file.message_type}
    _map_entry(by_name["SignatureDef"], "InputsEntry", "TensorInfo", "mlreg_tf")
    _map_entry(by_name["SignatureDef"], "OutputsEntry", "TensorInfo", "mlreg_tf")
    _map_entry(by_name["MetaGraphDef"], "SignatureDefEntry", "SignatureDef", "mlreg_tf")


@lru_cache(maxsize=1)
def _saved_model_class() -> Any:
    """A minimal SavedModel message class (field numbers from TensorFlow's .proto files)."""
    return _message_class("mlreg_tf", SAVED_MODEL_MESSAGES, "SavedModel", _saved_model_maps)


def _tf_tensor(key: str, info: Any) -> TensorSpec:
    dtype = TF_TYPES.get(info.dtype, f"UNSUPPORTED({info.dtype})")
    if info.tensor_shape.unknown_rank:
        return TensorSpec(key, dtype, None)
    return TensorSpec(key, dtype, tuple(int(d.size) for d in info.tensor_shape.dim))


def saved_model_signatures(path: Path) -> dict[str, Signature]:
    """Every serving signature of a SavedModel folder (the init op skipped)."""
    from google.protobuf.message import DecodeError  # lazy: ~20 ms, signatures only

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
