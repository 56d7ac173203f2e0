"""An ONNX file's signature read twice: by mlreg's reader (``read``: a minimal protobuf schema, no
``import onnx``) and by the onnx package itself (``reference``), to compare (tests/unit/
test_signature.py on made-up models, tests/integration/test_unit_moved_exports.py on tf2onnx's)."""

from __future__ import annotations

from pathlib import Path

import onnx

from registry.contracts.signature import ONNX_TYPES, read_onnx


def reference(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], list[str]]:
    """What the onnx package reads: inputs minus initializers, outputs, initializer names."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer} | {s.values.name for s in graph.sparse_initializer}

    def spec(value: onnx.ValueInfoProto) -> tuple[object, ...]:
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in tensor.shape.dim
            )
        return value.name, ONNX_TYPES[tensor.elem_type], dims

    inputs = [spec(v) for v in graph.input if v.name not in weights]
    return inputs, [spec(v) for v in graph.output], sorted(weights)


def read(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], list[str]]:
    sig = read_onnx(path)
    as_tuples: list[list[tuple[object, ...]]] = [
        [(t.name, t.dtype, t.shape) for t in tensors] for tensors in (sig.inputs, sig.outputs)
    ]
    return as_tuples[0], as_tuples[1], list(sig.initializers)
