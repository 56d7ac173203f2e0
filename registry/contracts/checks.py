"""A model artifact against its config.pbtxt: what Triton's backends check at load time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from registry.contracts.config import data_type_name, full_shape
from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.repository import ModelEntry
from registry.contracts.rules import kind, model_file
from registry.contracts.scheduling import control_tensors
from registry.contracts.signature import Signature, TensorSpec, read_onnx, read_saved_model
from registry.errors import ContractError

READERS = {
    "onnxruntime_onnx": read_onnx,
    "onnxruntime": read_onnx,
    "tensorflow_savedmodel": read_saved_model,
    "tensorflow": read_saved_model,
}


def read_signature(entry: ModelEntry, version: str) -> Signature | None:
    reader = READERS.get(kind(entry))
    path = model_file(entry, version)
    if reader is None or path is None or not path.exists():
        return None
    return reader(path)


def check_signature(entry: ModelEntry, version: str) -> Iterator[Finding]:
    try:
        signature = read_signature(entry, version)
    except ContractError as exc:
        yield error(
            "artifact",
            entry.name,
            exc.message,
            exc.fix or "",
            version=version,
            file=str(exc.context.get("file", "")),
        )
        return
    if signature is None:
        return
    config = entry.config
    assert config is not None
    if not config.input and not config.output and config.max_batch_size == 0:
        # the onnxruntime / tensorflow backends auto-complete max_batch_size, inputs and outputs
        # from the model when the config gives none of them: nothing to compare
        yield warning(
            "auto-complete",
            entry.name,
            f"no inputs, outputs or max_batch_size given: the {entry.resolved.backend} backend fills "
            "them from the model file",
            "declare them in config.pbtxt: ensembles and callers read the contract there",
            version=version,
            origin="mlreg",
        )
        return
    yield from _compare(entry, version, "input", config.input, signature.inputs, _overridable(signature))
    yield from _compare(entry, version, "output", config.output, signature.outputs)


def _dims(spec: TensorSpec) -> tuple[int, ...] | None:
    if spec.shape is None:
        return None
    return tuple(d if isinstance(d, int) else -1 for d in spec.shape)


def _config_type(dtype: str) -> str:
    """A signature's data type as config.pbtxt spells it: BYTES is TYPE_STRING in model_config.proto."""
    return "STRING" if dtype == "BYTES" else dtype


def _overridable(signature: Signature) -> set[str]:
    """ONNX initializers: a config may declare one as an input (ONNX lets a graph input override an
    initializer, and Triton's onnxruntime backend accepts it); it need not."""
    return set(getattr(signature, "initializers", ()))


def _compare(
    entry: ModelEntry,
    version: str,
    io_kind: str,
    declared: Sequence[Any],
    actual: Sequence[TensorSpec],
    overridable: set[str] | None = None,
) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    by_name = {t.name: t for t in actual}
    allowed = ", ".join(sorted(by_name))
    for tensor in declared:
        spec = by_name.get(tensor.name)
        if spec is None and tensor.name in (overridable or set()):
            continue  # an initializer overridden as an input: its type and shape are the weight's
        if spec is None:
            yield error(
                f"{io_kind}-name",
                entry.name,
                f"unexpected inference {io_kind} '{tensor.name}', allowed {io_kind}s are: {allowed}",
                f"rename the config {io_kind} to one of [{allowed}] (and every ensemble "
                f"mapping that uses it), or re-export the model with an {io_kind} named "
                f"'{tensor.name}'",
                tensor=tensor.name,
                version=version,
                expected=tensor.name,
                actual=allowed,
            )
            continue
        yield from _compare_tensor(entry, version, io_kind, tensor, spec)
    if io_kind == "input":
        real = [t for t in declared if t.name not in (overridable or set()) or t.name in by_name]
        yield from _undeclared_inputs(entry, version, real, actual)


def _undeclared_inputs(
    entry: ModelEntry, version: str, declared: Sequence[Any], actual: Sequence[TensorSpec]
) -> Iterator[Finding]:
    """Model inputs the config does not list; the sequence batcher's control tensors count as listed."""
    assert entry.config is not None
    controls = control_tensors(entry.config)
    declared_names = {t.name for t in declared} | controls
    missing = [t.name for t in actual if t.name not in declared_names]
    if missing:
        expects = len([t for t in declared if t.name]) + len(controls)
        yield error(
            "input-count",
            entry.name,
            f"unable to load model '{entry.name}', configuration expects {expects} "
            f"inputs, model provides {len(actual)}",
            f"declare the model input(s) {', '.join(missing)} in config.pbtxt",
            version=version,
            expected=str(len(actual)),
            actual=str(expects),
        )


def _compare_tensor(
    entry: ModelEntry, version: str, io_kind: str, tensor: Any, spec: TensorSpec
) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    want = data_type_name(tensor.data_type)
    has = _config_type(spec.dtype)
    if has != want:
        yield error(
            "data-type",
            entry.name,
            f"unexpected datatype TYPE_{want} for inference {io_kind} '{tensor.name}', expecting TYPE_{has}",
            f"set data_type: TYPE_{has} (or re-export the model with {want})",
            tensor=tensor.name,
            version=version,
            expected=f"TYPE_{has}",
            actual=f"TYPE_{want}",
        )
    model_dims = _dims(spec)
    if model_dims is None:
        return
    shown = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    config_dims = full_shape(config, shown)
    batching = config.max_batch_size > 0
    if batching and (not model_dims or model_dims[0] != -1):
        yield error(
            "batch-dim",
            entry.name,
            f"model '{entry.name}', tensor '{tensor.name}': for the model to support "
            f"batching the shape should have at least 1 dimension and the first dimension "
            f"must be -1; but shape expected by the model is {shape_text(model_dims)}",
            "set max_batch_size: 0 and put every dimension in dims, or re-export with a "
            "variable batch dimension",
            tensor=tensor.name,
            version=version,
            actual=shape_text(model_dims),
        )
        return
    if _dims_match(model_dims, config_dims, exact=(io_kind == "output")):
        return
    if batching:
        specified = (
            f"{len(config_dims)} dimensions (an initial batch dimension because "
            f"max_batch_size > 0 followed by the explicit tensor shape, making complete "
            f"shape {shape_text(config_dims)})"
        )
        fix = f"set dims: {shape_text(model_dims[1:])}"
    else:
        specified = f"{len(config_dims)} dimensions (shape {shape_text(config_dims)})"
        fix = (
            f"the model has a batch dimension: set max_batch_size > 0 with dims: {shape_text(model_dims[1:])}"
            if model_dims and model_dims[0] == -1 and len(model_dims) == len(config_dims) + 1
            else f"set dims: {shape_text(model_dims)}"
        )
    yield error(
        "shape",
        entry.name,
        f"model '{entry.name}', tensor '{tensor.name}': the model expects "
        f"{len(model_dims)} dimensions (shape {shape_text(model_dims)}) but the model "
        f"configuration specifies {specified}",
        fix,
        tensor=tensor.name,
        version=version,
        expected=shape_text(model_dims),
        actual=shape_text(config_dims),
    )


def _dims_match(model: tuple[int, ...], config: tuple[int, ...], exact: bool) -> bool:
    if len(model) != len(config):
        return False
    # inputs: a model -1 accepts any configured dim; outputs must agree exactly
    return all(m == c or (m == -1 and not exact) for m, c in zip(model, config, strict=True))


def check_artifacts(entry: ModelEntry, versions: Sequence[str] | None = None) -> Iterator[Finding]:
    if entry.config is None:
        return
    for version in versions or entry.versions():
        yield from check_signature(entry, version)
