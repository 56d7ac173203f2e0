"""Files a config makes Triton or a backend read besides the version's model files (origin mlreg).

mlreg hashes, signs and loads only what lies in a version folder, and the store's model folder
holds nothing else (:mod:`pipelines.storage.closed_world`).  So:

- ``output[*].label_filename`` and ``sequence_batching.state[*].initial_state[*].data_file``:
  Triton core joins them to the *model* folder as given (``JoinPath``, no normalising: core
  model.cc, sequence_batch_scheduler.cc), so ``../../etc/passwd`` reads any file, and labels go
  back to clients in a classification answer.  mlreg never stores such a file (nothing covers it
  beside the version folders), so a config naming one is refused here, with why and the fix:
  labels and initial state belong in the version folder, read by the model itself.
- parameters: an allow-list of where a parameter may name a file.  Only the python backend's
  ``EXECUTION_ENV_PATH``, as ``$$TRITON_MODEL_DIRECTORY/<version>/<file>`` (checked in
  :mod:`registry.contracts.rules`).  A key another backend reads as a path (``KNOWN_PATH_KEYS``:
  OpenVINO's ``CPU_EXTENSION_PATH`` dlopens it) is refused whatever its value, and a value that
  looks like a path or a file name (``looks_like_path``) under any other key is refused too: a
  model's own parameters (read by its ``model.py``) are kept to values that name no file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from registry.contracts.findings import Finding, error

RULE = "paths"  # rules.PATHS_RULE (a file Triton would read that mlreg never verified)
ENV_KEY = "EXECUTION_ENV_PATH"
# backend -> the parameter keys that backend reads as a path mlreg can cover (checked elsewhere)
PATH_KEYS: dict[str, frozenset[str]] = {"python": frozenset({ENV_KEY})}
# parameter keys Triton backends read as a file or a library to load: never allowed
KNOWN_PATH_KEYS = frozenset(
    {
        "CPU_EXTENSION_PATH",  # openvino: a library it dlopens
        "CONFIG_PATH",  # openvino: a plugin config file
        "ep_context_file_path",  # onnxruntime's EP context model
        "trt_engine_cache_path",  # onnxruntime's TensorRT EP caches (read and written)
        "trt_timing_cache_path",
        "TRITON_PLUGIN_PATH",
        "plugins",
    }
)
FILE_SUFFIX = re.compile(
    r"[^/\\]+\.(so|so\.\d+|dll|dylib|py|pyc|pth|tar|gz|tgz|zip|whl|egg|onnx|plan|engine|pt|pb|"
    r"savedmodel|txt|json|csv|bin|dat|npy|npz|yaml|yml|cfg|ini|sh)",
    re.IGNORECASE,
)


def looks_like_path(value: str) -> bool:
    """A value a backend or a model could open as a file: a separator, a home or dot start, or a
    file name with a file's suffix (``libevil.so``, ``labels.txt``)."""
    value = value.strip()
    return bool(value) and (
        "/" in value
        or "\\" in value
        or value.startswith(("~", ".", "$"))
        or FILE_SUFFIX.fullmatch(value) is not None
    )


def check_config_files(model: str, config: Any) -> Iterator[Finding]:
    """Refuse every label or initial-state file a config names (mlreg never stores one)."""
    for output in config.output:
        if output.label_filename:
            yield _named_file(
                model,
                f"output '{output.name}' label_filename '{output.label_filename}'",
                "Triton reads labels beside the config and sends their lines to clients",
                "drop label_filename and have the model return its labels (a file in the version folder "
                "it reads itself, e.g. os.path.join(args['model_repository'], args['model_version'], "
                "'labels.txt'))",
                output.label_filename,
            )
    if config.HasField("sequence_batching"):
        for state in config.sequence_batching.state:
            for initial in state.initial_state:
                if initial.WhichOneof("state_data") == "data_file":
                    yield _named_file(
                        model,
                        f"sequence_batching state '{state.input_name}' initial_state '{initial.name}' "
                        f"data_file '{initial.data_file}'",
                        "Triton reads it from the model folder's initial_state/",
                        "use zero_data: true for the initial state, or set it from the model",
                        initial.data_file,
                    )


def _named_file(model: str, what: str, reads: str, fix: str, value: str) -> Finding:
    leaves = value.startswith(("/", "~", "\\")) or ".." in re.split(r"[/\\]", value)
    where = "leaves the model folder: Triton would read any file" if leaves else "names a file"
    return error(
        RULE,
        model,
        f"{what} {where} ({reads}); mlreg stores and verifies only version folders, so no manifest "
        "the registry knows could cover it",
        fix,
        origin="mlreg",
        actual=value,
    )


def check_parameters(model: str, backend: str, config: Any) -> Iterator[Finding]:
    """Parameters naming a file where ``PATH_KEYS`` does not allow one (see the module doc): the
    model's own and its execution accelerators' (``trt_engine_cache_path`` of onnxruntime's
    TensorRT provider)."""
    allowed = PATH_KEYS.get(backend, frozenset())
    named = [(f"parameter {k}", k, p.string_value) for k, p in sorted(config.parameters.items())]
    accelerators = config.optimization.execution_accelerators
    for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator"):
        for accelerator in getattr(accelerators, kind):
            named += [
                (f"{kind} '{accelerator.name}' parameter {k}", k, v)
                for k, v in sorted(accelerator.parameters.items())
            ]
    for where, key, value in named:
        why = _why(backend, key, value) if key not in allowed or not where.startswith("parameter ") else ""
        if why:  # EXECUTION_ENV_PATH of the python backend: rules._parameter_paths/_env_version
            yield error(
                RULE,
                model,
                f"{where} '{value}' {why}: Triton would read a file mlreg never verified (only the "
                f"python backend's {ENV_KEY} may name a file, in the version folder)",
                f"remove {where}, or give it a value that names no file; files the model needs "
                "belong in its version folder, opened by the model itself",
                origin="mlreg",
                actual=value,
            )


def _why(backend: str, key: str, value: str) -> str:
    """Why parameter ``key`` = ``value`` names a file mlreg cannot cover ("" when it does not)."""
    if key.lower() in {k.lower() for k in KNOWN_PATH_KEYS}:
        return f"is a file the {backend or 'model'}'s backend reads or loads"
    if key == ENV_KEY:
        return f"is read only by the python backend (this model's backend: {backend or 'none'})"
    if value and looks_like_path(value):
        leaves = value.startswith(("/", "~", "\\")) or ".." in re.split(r"[/\\]", value)
        return "leaves the version folder" if leaves else "names a file"
    return ""
