"""Triton's per-model configuration rules (core ``model_config_utils.cc``), checked offline."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path

from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.repository import ModelEntry

PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "ensemble": "",
}
DEFAULT_FILENAME = {
    "onnxruntime_onnx": "model.onnx",
    "onnxruntime": "model.onnx",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
    "tensorflow": "model.savedmodel",
    "pytorch_libtorch": "model.pt",
    "pytorch": "model.pt",
    "tensorrt_plan": "model.plan",
    "tensorrt": "model.plan",
    "python": "model.py",
}


def kind(entry: ModelEntry) -> str:
    """The platform, else the backend ("ensemble", "onnxruntime_onnx", "python", ...)."""
    assert entry.config is not None
    return entry.config.platform or entry.config.backend


def check_model(entry: ModelEntry) -> Iterator[Finding]:
    if entry.config is None:
        return
    yield from check_name(entry)
    yield from check_platform(entry)
    yield from check_batching(entry)
    yield from check_io(entry)
    yield from check_instance_groups(entry)
    yield from check_versions(entry)


def check_name(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    if config.name and config.name != entry.name:
        yield error(
            "name",
            entry.name,
            f"unexpected directory name '{entry.name}' for model '{config.name}', "
            "directory name must equal model name",
            f"rename the folder to '{config.name}' or set name: \"{entry.name}\"",
            expected=entry.name,
            actual=config.name,
        )


def check_platform(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    platform, backend = config.platform, config.backend
    if not platform and not backend:
        yield error(
            "platform",
            entry.name,
            f"must specify 'platform' or 'backend' for '{entry.name}'",
            'add platform: "onnxruntime_onnx" (or backend: "python", ...)',
        )
    elif platform and platform not in PLATFORM_BACKEND:
        yield error(
            "platform",
            entry.name,
            f"unexpected platform type '{platform}' for {entry.name}",
            f"use one of: {', '.join(sorted(PLATFORM_BACKEND))}",
            actual=platform,
        )
    elif platform and backend and PLATFORM_BACKEND[platform] != backend:
        yield error(
            "platform",
            entry.name,
            f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}",
            f"drop 'backend' or set it to '{PLATFORM_BACKEND[platform]}'",
            expected=PLATFORM_BACKEND[platform],
            actual=backend,
        )


def check_batching(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    mbs = config.max_batch_size
    if mbs < 0:
        yield error(
            "max-batch-size",
            entry.name,
            f"'max_batch_size' must be non-negative value for {entry.name}",
            "use 0 (no batching) or the largest batch the model accepts",
            actual=str(mbs),
        )
    if not config.HasField("dynamic_batching"):
        return
    if mbs == 0:
        yield warning(
            "dynamic-batching",
            entry.name,
            "dynamic batching is configured but max_batch_size is 0, so nothing is batched",
            "set max_batch_size > 0 or remove dynamic_batching",
        )
    for size in config.dynamic_batching.preferred_batch_size:
        if size < 1:
            yield error(
                "preferred-batch-size",
                entry.name,
                f"dynamic batching preferred size must be positive for {entry.name}",
                "use sizes >= 1",
                actual=str(size),
            )
        elif mbs > 0 and size > mbs:
            yield error(
                "preferred-batch-size",
                entry.name,
                f"dynamic batching preferred size must be <= max batch size for {entry.name}",
                f"lower it to at most {mbs} or raise max_batch_size",
                expected=f"<= {mbs}",
                actual=str(size),
            )


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


def check_io(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    for io_kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            yield from _check_tensor(entry, io_kind, tensor)


def _check_tensor(entry: ModelEntry, io_kind: str, tensor: object) -> Iterator[Finding]:
    name = tensor.name  # type: ignore[attr-defined]
    dims = list(tensor.dims)  # type: ignore[attr-defined]
    if not name:
        yield error(
            "io-name", entry.name, f"model {io_kind} must specify 'name'", f"give every {io_kind} a name"
        )
    if tensor.data_type == 0:  # type: ignore[attr-defined]
        yield error(
            "data-type",
            entry.name,
            f"model {io_kind} '{name}' must specify 'data_type'",
            "add data_type: TYPE_FP32 (or the tensor's real type)",
            tensor=name,
        )
    if not dims:
        yield error(
            "dims",
            entry.name,
            f"model {io_kind} '{name}' must specify 'dims'",
            "add dims: [ ... ] without the batch dimension",
            tensor=name,
        )
    bad = [d for d in dims if d < -1 or d == 0]
    if bad:
        yield error(
            "dims",
            entry.name,
            f"model {io_kind} '{name}' dimension must be integer >= 1, or -1 to indicate a "
            f"variable-size dimension",
            "fix the dims",
            tensor=name,
            actual=shape_text(dims),
        )
    if tensor.HasField("reshape") and dims and not bad:  # type: ignore[attr-defined]
        reshape = list(tensor.reshape.shape)  # type: ignore[attr-defined]
        if dims.count(-1) != reshape.count(-1) or _segments(dims) != _segments(reshape):
            yield error(
                "reshape",
                entry.name,
                f"model {io_kind} '{name}' has different size for dims and reshape",
                "make dims and reshape hold the same number of elements, with -1 in matching places",
                tensor=name,
                expected=shape_text(dims),
                actual=shape_text(reshape),
            )
    elif math.prod(d for d in dims if d > 0) > 2**40:
        yield warning(
            "dims",
            entry.name,
            f"model {io_kind} '{name}' is implausibly large",
            "check the dims",
            tensor=name,
            actual=shape_text(dims),
        )


def check_instance_groups(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    for i, group in enumerate(config.instance_group):
        label = group.name or f"{entry.name}_{i}"
        if group.count < 0:
            yield error(
                "instance-group",
                entry.name,
                f"instance group {label} of model {entry.name} must have count >= 1",
                "set count: 1 or more",
                actual=str(group.count),
            )


def model_file(entry: ModelEntry, version: str) -> Path | None:
    """The file or folder Triton will load for ``version`` (None for ensembles)."""
    assert entry.config is not None
    if kind(entry) == "ensemble":
        return None
    name = entry.config.default_model_filename or DEFAULT_FILENAME.get(kind(entry), "model")
    if entry.config.backend == "python" and not entry.config.platform:
        name = "model.py"
    return entry.path / version / name


def check_versions(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    versions = entry.versions()
    if not versions and entry.exporter is not None:
        yield warning(
            "not-exported",
            entry.name,
            f"template model '{entry.name}' has no version folder yet; its artifact is "
            f"made by {entry.exporter.name}",
            "build a loadable repository with 'mlreg template build OUT' and validate OUT",
        )
        return
    if not versions:
        yield error(
            "versions",
            entry.name,
            f"at least one version must be available under the version policy of model '{entry.name}'",
            f"add a version folder such as {entry.path / '1'}",
        )
        return
    policy = config.version_policy
    if policy.HasField("specific"):
        missing = [str(v) for v in policy.specific.versions if str(v) not in versions]
        for version in missing:
            yield error(
                "version-policy",
                entry.name,
                f"version_policy of model '{entry.name}' names version {version}, which has no folder",
                f"add {entry.path / version} or drop it from the policy",
                version=version,
            )
        serving = [str(v) for v in policy.specific.versions if str(v) in versions]
    elif policy.HasField("all"):
        serving = versions
    else:
        n = policy.latest.num_versions if policy.HasField("latest") else 1
        serving = versions[-max(n, 1) :]
    for version in serving:
        yield from check_artifact(entry, version)


def check_artifact(entry: ModelEntry, version: str) -> Iterator[Finding]:
    path = model_file(entry, version)
    if path is None:
        return
    try:
        exists = path.exists()
    except OSError:
        exists = False
    if not exists:
        yield error(
            "model-file",
            entry.name,
            f"unable to find '{path}' for model '{entry.name}'",
            "export the model there, or set default_model_filename to the file's name",
            version=version,
            file=str(path),
        )
        return
    if entry.config is not None and entry.config.backend == "python" and not entry.config.platform:
        yield from check_python_model(entry, version, path)


def check_python_model(entry: ModelEntry, version: str, path: Path) -> Iterator[Finding]:
    """Static inspection: model.py defines TritonPythonModel with execute (user code is not run)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError) as exc:
        yield error(
            "python-model",
            entry.name,
            f"{path} is not valid Python: {exc}",
            "fix the syntax error",
            version=version,
            file=str(path),
        )
        return
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cls = classes.get("TritonPythonModel")
    if cls is None:
        yield error(
            "python-model",
            entry.name,
            f"{path} defines no class TritonPythonModel",
            "define class TritonPythonModel with execute(self, requests)",
            version=version,
            file=str(path),
        )
        return
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    if "execute" not in methods and not cls.bases:
        yield error(
            "python-model",
            entry.name,
            f"{path}: TritonPythonModel has no execute method",
            "add def execute(self, requests) returning one response per request",
            version=version,
            file=str(path),
        )
