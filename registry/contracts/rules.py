"""Triton's per-model configuration rules (core ``model_config_utils.cc``), checked offline.

Messages use Triton's wording (``ValidateModelConfig`` and friends) so a user can search for them;
a finding with ``origin="mlreg"`` is a rule mlreg adds beyond Triton and is labelled so.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from registry.contracts.file_refs import check_config_files, check_parameters
from registry.contracts.findings import Finding, error, warning
from registry.contracts.groups import check_instance_groups, check_runtime
from registry.contracts.io_rules import check_io
from registry.contracts.repository import ModelEntry
from registry.contracts.scheduling import check_batching, check_scheduler_kind, check_sequence_batching
from registry.contracts.warmup import check_warmup

# backend type of each platform / backend Triton knows (GetBackendTypeFromPlatform / GetBackendType)
PLATFORM_TYPE = {
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
}
KNOWN_BACKEND_TYPES = {"tensorflow", "tensorrt", "onnxruntime", "pytorch"}


def kind(entry: ModelEntry) -> str:
    """The platform, else the backend ("ensemble", "onnxruntime_onnx", "python", ...), auto-completed."""
    assert entry.config is not None
    resolved = entry.resolved
    return resolved.platform or resolved.backend


def check_model(entry: ModelEntry, gpus: int | None = None) -> Iterator[Finding]:
    """Every per-model rule; ``gpus``: the GPUs the serving machine has (None: unknown)."""
    if entry.config is None:
        return
    yield from check_name(entry)
    yield from check_paths(entry)
    platform_ok = True
    for finding in check_platform(entry):
        platform_ok = platform_ok and not finding.is_error
        yield finding
    yield from check_batching(entry)
    yield from check_sequence_batching(entry)
    yield from check_scheduler_kind(entry)
    yield from check_io(entry)
    yield from check_warmup(entry.config, model=entry.name, model_dir=entry.path)
    yield from check_instance_groups(entry, gpus)
    if platform_ok:
        yield from check_runtime(entry)
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


PATHS_RULE = "paths"  # a file name leaving the version folder: refused even at register
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"  # Triton's stand-in for the model's folder in parameters
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def check_paths(entry: ModelEntry) -> Iterator[Finding]:
    """Every file name Triton resolves from the config stays inside a version folder, the only
    place mlreg hashes (and signs) what it loads (origin mlreg: Triton joins them as given, so
    ``default_model_filename: "../../../evil/model.py"`` runs a file nobody verified)."""
    config = entry.config
    assert config is not None
    yield from _backend_paths(entry.name, config)
    yield from _filename_paths(entry.name, config)
    yield from check_config_files(entry.name, config)
    backend = config.backend or PLATFORM_TYPE.get(config.platform, config.platform)
    yield from check_parameters(entry.name, backend, config)
    if backend == "python":
        yield from _parameter_paths(entry.name, config)
        yield from _env_version(entry)


def _not_plain(name: str) -> bool:
    return bool(name) and (not PLAIN_NAME.fullmatch(name) or not name.strip("."))


def _backend_paths(model: str, config: Any) -> Iterator[Finding]:
    """The backend and runtime: names, not paths."""
    if _not_plain(config.backend):
        yield error(
            PATHS_RULE,
            model,
            f"backend '{config.backend}' is not a backend name: Triton would look for "
            "libtriton_<backend>.so (or a python-based backend's model.py) at that path",
            'give the backend by name, e.g. backend: "python" or "onnxruntime"',
            origin="mlreg",
            actual=config.backend,
        )
    if _not_plain(config.runtime):
        yield error(
            PATHS_RULE,
            model,
            f"runtime '{config.runtime}' is not a file name in the backend's folder",
            "give a file name of the backend (e.g. model.py), without a path",
            origin="mlreg",
            actual=config.runtime,
        )


def _filename_paths(model: str, config: Any) -> Iterator[Finding]:
    """default_model_filename and cc_model_filenames: inside the version folder."""
    fix = "name a file inside the version folder (e.g. model.py), never an absolute path or '..'"
    named = [("default_model_filename", config.default_model_filename)]
    named += [(f"cc_model_filenames['{k}']", v) for k, v in sorted(config.cc_model_filenames.items())]
    for field, value in named:
        if value and _escapes(value):
            yield error(
                PATHS_RULE,
                model,
                f"{field} '{value}' leaves the version folder: Triton would load a file mlreg never verified",
                fix,
                origin="mlreg",
                actual=value,
            )


def _parameter_paths(model: str, config: Any) -> Iterator[Finding]:
    """The python backend's EXECUTION_ENV_PATH: in a version folder (every other parameter naming
    a file is refused by :func:`registry.contracts.file_refs.check_parameters`)."""
    for key, parameter in sorted(config.parameters.items()):
        value = parameter.string_value
        if not value or key != "EXECUTION_ENV_PATH":
            continue
        if _parameter_escapes(key, value):
            yield error(
                PATHS_RULE,
                model,
                f"parameter {key} '{value}' leaves the version folder: Triton would read a file "
                "mlreg never verified",
                f"put the file in a version folder and name it {MODEL_DIRECTORY}/<version>/<file>",
                origin="mlreg",
                actual=value,
            )


def _env_version(entry: ModelEntry) -> Iterator[Finding]:
    """EXECUTION_ENV_PATH inside the model's own version folder: Triton runs the archive's
    ``bin/activate``, so one in another version's folder (``$$TRITON_MODEL_DIRECTORY/99/...``,
    a folder this model does not hold) would run bytes no manifest of this version covers."""
    assert entry.config is not None
    parameter = entry.config.parameters.get("EXECUTION_ENV_PATH")
    value = parameter.string_value if parameter is not None else ""
    if not value.startswith(MODEL_DIRECTORY + "/") or _parameter_escapes("EXECUTION_ENV_PATH", value):
        return  # none, or refused above as leaving the version folder
    folder = value[len(MODEL_DIRECTORY) + 1 :].split("/", 1)[0]
    versions = entry.versions()
    if folder not in versions:
        held = ", ".join(f"{v}/" for v in versions) or "none"
        yield error(
            PATHS_RULE,
            entry.name,
            f"parameter EXECUTION_ENV_PATH '{value}' lies in version folder {folder}/, which this model "
            f"folder does not hold (its version folders: {held}): Triton would run another version's "
            "(or an unverified) execution environment",
            f"put the archive in the model's own version folder and name it {MODEL_DIRECTORY}/"
            f"{versions[-1] if versions else '<version>'}/{value.rsplit('/', 1)[-1]}",
            origin="mlreg",
            actual=value,
        )


def _parameter_escapes(key: str, value: str) -> bool:
    inside = value.startswith(MODEL_DIRECTORY + "/")
    rest = value[len(MODEL_DIRECTORY) + 1 :] if inside else value
    in_version = inside and rest.split("/", 1)[0].isdigit() and not _escapes(rest)
    return key == "EXECUTION_ENV_PATH" and not in_version or inside and _escapes(rest) or _escapes(value)


def _escapes(value: str) -> bool:
    """Absolute, or a '..' anywhere: it may leave the folder it is joined to."""
    return value.startswith(("/", "~", "\\")) or ".." in re.split(r"[/\\]", value)


def check_platform(entry: ModelEntry) -> Iterator[Finding]:
    """Auto-complete first (as Triton does), then ValidateModelConfig's platform/backend rules."""
    config = entry.config
    assert config is not None
    resolved = entry.resolved
    if resolved.error:
        yield error(
            "platform",
            entry.name,
            resolved.error,
            'add platform: "onnxruntime_onnx" (or backend: "python", ...), or put the model file '
            "(model.onnx, model.savedmodel, model.py, ...) in the version folder",
        )
        return
    platform, backend = resolved.platform, resolved.backend
    if not backend and platform != "ensemble":
        yield error(
            "platform",
            entry.name,
            f"unexpected platform type '{platform}' for {entry.name}",
            f"use one of: ensemble, {', '.join(sorted(PLATFORM_TYPE))}, or name a backend",
            actual=platform,
        )
        return
    if backend and platform == "ensemble":
        yield error(
            "platform",
            entry.name,
            f"Ensemble model '{entry.name}' must have platform type 'ensemble' and empty backend type",
            "remove 'backend' from the ensemble's config",
            actual=backend,
        )
        return
    if backend in KNOWN_BACKEND_TYPES and PLATFORM_TYPE.get(platform) != backend:
        yield error(
            "platform",
            entry.name,
            f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}",
            f"drop 'platform' or set the pair of backend '{backend}'",
            expected=backend,
            actual=platform,
        )
        return
    if not config.platform and not config.backend:
        yield warning(
            "platform",
            entry.name,
            f"no 'platform' or 'backend' given; Triton's auto-complete serves it with backend "
            f"'{backend}' (from {resolved.filled_from})",
            f'add backend: "{backend}" to config.pbtxt: explicit is better',
            origin="mlreg",
        )


def model_file(entry: ModelEntry, version: str) -> Path | None:
    """The file or folder Triton will load for ``version`` (None for ensembles)."""
    assert entry.config is not None
    resolved = entry.resolved
    if kind(entry) == "ensemble":
        return None
    name = resolved.filename or "model"
    if resolved.backend == "python" and not resolved.platform:
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
            origin="mlreg",
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
    if entry.resolved.backend == "python" and not entry.resolved.platform:
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
