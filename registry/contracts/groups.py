"""Instance groups (core ``NormalizeInstanceGroup`` + ``ValidateInstanceGroup``) and the backend
``runtime`` library (``backend_model.cc``), checked offline.

The GPUs of the serving machine are not this machine's: pass their count (``mlreg validate
--gpus N`` or ``MLREG_GPUS``); unknown, only the rules that hold for any machine are checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from registry.contracts.findings import Finding, error, warning
from registry.contracts.repository import ModelEntry

MIN_COMPUTE_CAPABILITY = "6.000000"  # Triton's default --min-supported-compute-capability, as it prints it
KIND_GPU, KIND_CPU, KIND_MODEL, KIND_AUTO = 1, 2, 3, 0


def _group_error(entry: ModelEntry, label: str, text: str, fix: str, **where: Any) -> Finding:
    return error(
        "instance-group", entry.name, f"instance group {label} of model {entry.name} {text}", fix, **where
    )


def check_instance_groups(entry: ModelEntry, gpus: int | None) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    if config.HasField("ensemble_scheduling") or entry.resolved.platform == "ensemble":
        if len(config.instance_group):
            yield error(
                "ensemble-scheduling",
                entry.name,
                f"instance group should not be specified for ensemble '{entry.name}'",
                "remove instance_group: an ensemble runs in Triton's scheduler",
            )
        return
    for index, group in enumerate(config.instance_group):
        label = group.name or f"{entry.name}_{index}"
        if group.count < 0:
            yield warning(
                "instance-group",
                entry.name,
                f"instance group {label} of model {entry.name} has count {group.count}; Triton "
                "replaces a count below 1 with its default",
                "set count: 1 or more",
                actual=str(group.count),
                origin="mlreg",
            )
        yield from _check_kind(entry, label, group, gpus)
        yield from _check_profile(entry, label, group)


def _check_kind(entry: ModelEntry, label: str, group: Any, gpus: int | None) -> Iterator[Finding]:
    kind = group.kind
    ids = list(group.gpus)
    if kind == KIND_AUTO:
        if gpus is None:
            return
        kind = KIND_GPU if gpus > 0 and all(0 <= g < gpus for g in ids) else KIND_CPU
    if kind == KIND_GPU:
        yield from _check_gpus(entry, label, ids, gpus)
    elif ids:
        name = "KIND_MODEL" if kind == KIND_MODEL else "KIND_CPU"
        yield _group_error(
            entry,
            label,
            f"has kind {name} but specifies one or more GPUs",
            "remove gpus from the group, or make it kind: KIND_GPU",
            actual=str(ids),
        )


def _check_gpus(entry: ModelEntry, label: str, ids: list[int], gpus: int | None) -> Iterator[Finding]:
    if not ids:
        if gpus == 0:
            yield _group_error(
                entry,
                label,
                "has kind KIND_GPU but no GPUs are available",
                "use kind: KIND_CPU where no GPU is (or validate with --gpus N of the serving machine)",
            )
        return
    valid = range(gpus) if gpus is not None else None
    for gid in ids:
        if gid < 0 or (valid is not None and gid not in valid):
            shown = ", ".join(str(g) for g in valid) if valid is not None else ""
            yield _group_error(
                entry,
                label,
                f"specifies invalid or unsupported gpu id {gid}. GPUs with at least the minimum required "
                f"CUDA compute compatibility of {MIN_COMPUTE_CAPABILITY} are: {shown}",
                "list GPU ids from 0 to the GPU count - 1 (or leave gpus out: all GPUs)",
                actual=str(gid),
            )


def _check_profile(entry: ModelEntry, label: str, group: Any) -> Iterator[Finding]:
    platform = entry.resolved.platform
    if not group.profile:
        return
    if platform != "tensorrt_plan":
        yield _group_error(
            entry,
            label,
            # Triton's own message lacks the space before "specifies"
            f"and platform {platform}specifies profile field which is only supported for TensorRT models",
            "remove profile from the instance group",
        )
        return
    for profile in group.profile:
        if not profile.isdigit():
            yield _group_error(
                entry,
                label,
                f"and platform {platform} specifies invalid profile {profile}. The field should contain "
                "the string representation of a non-negative integer.",
                'use profile indexes such as "0"',
            )


def check_runtime(entry: ModelEntry) -> Iterator[Finding]:
    """``runtime`` names the backend library: it must stay in the backend directory (Triton refuses
    ``../x.so`` as an escape: a config must not load an arbitrary library) and exist."""
    config = entry.config
    assert config is not None
    runtime = config.runtime
    if not runtime or entry.resolved.platform == "ensemble":
        return
    backend = entry.resolved.backend
    path = PurePosixPath(runtime)
    if ".." in path.parts or path.is_absolute():
        yield error(
            "runtime",
            entry.name,
            f"backend library name '{runtime}' escapes backend directory '<backend directory>/{backend}', "
            f"for model '{entry.name}', check model config runtime field",
            f"set runtime to a library file name in the backend directory, e.g. libtriton_{backend}.so",
            actual=runtime,
        )
        return
    if runtime in (f"libtriton_{backend}.so", "model.py"):
        return
    folders = [entry.path, *(entry.path / v for v in entry.versions())]
    if any((folder / runtime).is_file() for folder in folders):
        return
    searched = (
        " ".join(f"'{f}'" for f in folders[1:][-1:] + folders[:1]) + f" '<backend directory>/{backend}'"
    )
    yield error(
        "runtime",
        entry.name,
        f"unable to find backend library '{runtime}' for model '{entry.name}', searched: {searched}",
        f"remove runtime (Triton then uses libtriton_{backend}.so), or put the library in the model folder",
        actual=runtime,
    )
