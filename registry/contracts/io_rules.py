"""Tensor rules of core ``ValidateModelIOConfig``: ``ValidateIOShape``, ``ValidateModelInput`` /
``ValidateModelOutput`` and ``ValidateBatchIO``.  Triton appends `` for <model>`` to each message."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from registry.contracts.config import model_config_pb2 as schema
from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.repository import ModelEntry

TENSORRT = "tensorrt_plan"


def check_io(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    for io_kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            yield from _check_tensor(entry, io_kind, tensor)
            yield from _check_format(entry, io_kind, tensor)
    yield from check_batch_io(entry)


def _fail(entry: ModelEntry, rule: str, text: str, fix: str, **where: Any) -> Finding:
    return error(rule, entry.name, f"{text} for {entry.name}", fix, **where)


def _check_tensor(entry: ModelEntry, io_kind: str, tensor: Any) -> Iterator[Finding]:
    assert entry.config is not None
    name = tensor.name
    prefix = f"model {io_kind} '{name}'"
    if not name:
        yield _fail(entry, "io-name", f"model {io_kind} must specify 'name'", f"give every {io_kind} a name")
        return
    if tensor.data_type == 0:
        yield _fail(
            entry,
            "data-type",
            f"{prefix} must specify 'data_type'",
            "add data_type: TYPE_FP32 (or the tensor's real type)",
            tensor=name,
        )
    dims = list(tensor.dims)
    if not dims:
        yield _fail(
            entry,
            "dims",
            f"{prefix} must specify 'dims'",
            "add dims: [ ... ] without the batch dimension",
            tensor=name,
        )
        return
    if tensor.HasField("reshape") and not tensor.reshape.shape and entry.config.max_batch_size == 0:
        yield _fail(
            entry,
            "reshape",
            f"{prefix} cannot have empty reshape for non-batching model as scalar tensors are not supported",
            "give reshape a shape, or set max_batch_size > 0",
            tensor=name,
        )
    if _not_dims(dims):
        yield _bad_dims(entry, "dims", f"{prefix} dimension", tensor=name, actual=shape_text(dims))
        return
    if tensor.HasField("reshape"):
        yield from _check_reshape(entry, prefix, tensor)
    elif math.prod(d for d in dims if d > 0) > 2**40:
        yield warning(
            "dims",
            entry.name,
            f"{prefix} is implausibly large",
            "check the dims",
            tensor=name,
            actual=shape_text(dims),
            origin="mlreg",
        )


def _not_dims(values: list[int]) -> bool:
    """A dimension that is neither >= 1 nor -1 (variable-size)."""
    return any(d < 1 and d != -1 for d in values)


def _bad_dims(entry: ModelEntry, rule: str, what: str, **where: Any) -> Finding:
    return _fail(
        entry,
        rule,
        f"{what} must be integer >= 1, or -1 to indicate a variable-size dimension",
        f"fix the {rule}",
        **where,
    )


def _element_count(dims: list[int]) -> int:
    """Triton's GetElementCount: -1 with any variable dimension, 0 for no dimension."""
    if -1 in dims:
        return -1
    return math.prod(dims) if dims else 0


def _segments(dims: list[int]) -> list[int]:
    """Element counts between variable-size (-1) dimensions."""
    counts, current = [], 1
    for dim in dims:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current *= dim
    return [*counts, current]


def _check_reshape(entry: ModelEntry, prefix: str, tensor: Any) -> Iterator[Finding]:
    dims, reshape = list(tensor.dims), list(tensor.reshape.shape)
    where = {"tensor": tensor.name, "expected": shape_text(dims), "actual": shape_text(reshape)}
    fix = "make dims and reshape hold the same number of elements, with -1 in matching places"
    if _not_dims(reshape):
        yield _bad_dims(entry, "reshape", f"{prefix} reshape dimensions", **where)
        return
    dims_size, reshape_size = _element_count(dims), _element_count(reshape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        yield _fail(entry, "reshape", f"{prefix} has different size for dims and reshape", fix, **where)
        return
    if dims_size != -1:
        return
    if len(_segments(dims)) != len(_segments(reshape)):
        yield _fail(
            entry,
            "reshape",
            f"{prefix} has different number of variable-size dimensions for dims and reshape",
            fix,
            **where,
        )
    elif _segments(dims) != _segments(reshape):
        yield _fail(entry, "reshape", f"{prefix} has different size for dims and reshape", fix, **where)


def _check_format(entry: ModelEntry, io_kind: str, tensor: Any) -> Iterator[Finding]:
    platform = entry.resolved.platform
    if io_kind == "input" and tensor.format in (1, 2) and len(tensor.dims) != 3:  # FORMAT_NHWC, FORMAT_NCHW
        yield _fail(
            entry,
            "dims",
            "model input NHWC/NCHW require 3 dims",
            "give dims: [ C, H, W ]",
            tensor=tensor.name,
        )
    if tensor.is_shape_tensor and platform != TENSORRT:
        yield _fail(
            entry,
            "shape-tensor",
            "shape tensors are only supported for TensorRT platform",
            "remove is_shape_tensor",
            tensor=tensor.name,
        )
    if tensor.is_non_linear_format_io:
        if platform != TENSORRT:
            yield _fail(
                entry,
                "non-linear-io",
                "Non-linear IO format is only supported for the TensorRT platform",
                "remove is_non_linear_format_io",
                tensor=tensor.name,
            )
        elif len(tensor.dims) != 3:
            yield _fail(
                entry,
                "non-linear-io",
                f"Non-linear IO format {io_kind} requires 3 dims",
                "give 3 dims",
                tensor=tensor.name,
            )


def check_batch_io(entry: ModelEntry) -> Iterator[Finding]:
    """``batch_input`` / ``batch_output``: kinds, source counts, sources and targets that exist."""
    config = entry.config
    assert config is not None
    if not config.batch_input and not config.batch_output:
        return
    model_config_pb2 = schema()
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    for batch_input in config.batch_input:
        kind = model_config_pb2.BatchInput.Kind.Name(batch_input.kind)
        yield from _sources(entry, "batch input", kind, batch_input.source_input, inputs)
        if batch_input.data_type not in (model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_FP32):
            yield _fail(
                entry,
                "batch-input",
                "batch input data type must be TYPE_INT32 or TYPE_FP32",
                "set data_type: TYPE_INT32 or TYPE_FP32",
                tensor=batch_input.target_name[0] if batch_input.target_name else None,
            )
    for batch_output in config.batch_output:
        kind = model_config_pb2.BatchOutput.Kind.Name(batch_output.kind)
        yield from _sources(entry, "batch output", kind, batch_output.source_input, inputs)
        seen: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                yield _fail(
                    entry,
                    "batch-output",
                    f"unknown target output name '{target}'",
                    f"name one of the model outputs: {', '.join(sorted(outputs)) or 'none declared'}",
                    tensor=target,
                )
            elif target in seen:
                yield _fail(
                    entry,
                    "batch-output",
                    f"target output name '{target}' can only be specified once",
                    "list each target once",
                    tensor=target,
                )
            seen.add(target)


def _sources(entry: ModelEntry, what: str, kind: str, sources: Any, inputs: set[str]) -> Iterator[Finding]:
    rule = what.replace(" ", "-")
    if len(sources) != 1:
        yield _fail(
            entry,
            rule,
            f"{what} kind '{kind}' expects 1 source input, got {len(sources)}",
            "give exactly one source_input",
            actual=str(len(sources)),
        )
    for source in sources:
        if source not in inputs:
            yield _fail(
                entry,
                rule,
                f"unknown source input name '{source}'",
                f"name one of the model inputs: {', '.join(sorted(inputs)) or 'none declared'}",
                tensor=source,
            )
