"""NVIDIA's mlflow-triton flavors read as mlreg versions, so its users switch with ``-t mlreg``.

NVIDIA's plugin (triton-inference-server/server ``deploy/mlflow-triton-plugin``) deploys two
kinds of registered versions:

- ``flavor="onnx"``: a model logged by ``mlflow.onnx.log_model(model, "triton", ...)``, maybe
  with a ``config.pbtxt`` logged beside it (``mlflow.log_artifact(path, "triton")``).  The Triton
  folder is ``1/model.onnx`` plus that config, or, without one, the config Triton's auto-complete
  would make of the graph (core ``AutoCompleteBackendFields``, then the ONNX Runtime backend's
  ``AutoCompleteMaxBatch``/``AutoCompleteIO``).
- ``flavor="triton"``: NVIDIA's ``mlflow_triton.log_model`` layout, a Triton model folder
  (``config.pbtxt`` + version folders) logged under the artifact path; ``data`` names the folder.

Neither carries what mlreg checks before a load (a manifest, a digest registered in MLflow), so
each is registered once as a new mlreg version of the same registered model (validated like any
export; identical bytes reuse their version) linked both ways to the version it came from, and
that version is what a promotion deploys.  mlreg's own versions pass through unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.contracts.autocomplete import resolve
from registry.contracts.config import CONFIG_NAME, format_config, model_config_pb2, parse_config
from registry.contracts.signature import Signature, TensorSpec, read_onnx
from registry.errors import ContractError, UsageError
from registry.ports import LoggedModels
from registry.register import Candidate, register

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

FLAVORS = ("triton", "onnx")
ONNX_FILE = "model.onnx"  # Triton's default_model_filename for onnxruntime
DEFAULT_MAX_BATCH_SIZE = 4  # tritonserver's --backend-config=default-max-batch-size default
SOURCE_TAG = "derived_from"  # on the mlreg version: the version it came from (as the ONNX conversion)
FLAVOR_TAG = "derived_flavor"  # on the mlreg version: "onnx" or "triton"
CONFIG_TAG = "derived_config"  # on the mlreg version: "logged", "generated" or "model folder"
IMPORTED_TAG = "mlreg_version"  # on the source version: the mlreg version made of it
# files MLflow writes beside a logged model: never part of the Triton version folder
MLFLOW_FILES = {
    "MLmodel",
    "conda.yaml",
    "python_env.yaml",
    "requirements.txt",
    "registered_model_meta",
    "input_example.json",
    "serving_input_example.json",
    CONFIG_NAME,
}


@dataclass(frozen=True)
class Deployable:
    """The mlreg version a promotion deploys for ``models:/<model>/<source_version>``."""

    model: str
    version: str
    source_version: str
    flavor: str
    config: str  # "registered" (an mlreg version), "logged", "generated" or "model folder"
    created: bool = False

    @property
    def imported(self) -> bool:
        return self.version != self.source_version or self.config != "registered"


def deployable(registry: LoggedModels, model: str, version: str, flavor: str | None) -> Deployable:
    """``model`` ``version`` as an mlreg version: itself when mlreg registered it, else the version
    made of NVIDIA's ``onnx`` or ``triton`` flavor (registered now, or found: same bytes)."""
    check_flavor(flavor)
    tags = registry.models.version_tags(model, version)
    if "artifact_digest" in tags:  # registered by mlreg: a Triton folder with manifest and digest
        _check_own(model, version, tags, flavor)
        return Deployable(model, version, version, flavor or "triton", "registered")
    with tempfile.TemporaryDirectory(prefix="mlreg-nvidia-") as tmp:
        logged = download_model(registry, model, version, Path(tmp) / "logged")
        found = flavors(logged)
        chosen = choose_flavor(model, version, found, flavor)
        folder = Path(tmp) / "triton" / model
        if chosen == "onnx":
            config_from = onnx_folder(model, logged, found["onnx"], folder, logged_config(registry, logged))
        else:
            config_from = triton_folder(model, logged, found["triton"], folder)
        return _register(registry, model, version, chosen, config_from, folder)


def check_flavor(flavor: str | None) -> str | None:
    if flavor not in (None, *FLAVORS):
        raise UsageError(
            f"flavor '{flavor}' is not deployable by mlreg",
            fix="use --flavor triton or --flavor onnx (NVIDIA's flavors), or leave it out",
        )
    return flavor


def _check_own(model: str, version: str, tags: dict[str, str], flavor: str | None) -> None:
    if flavor == "onnx" and tags.get("platform") != "onnxruntime_onnx":
        raise UsageError(
            f"models:/{model}/{version} is a {tags.get('platform', 'non-ONNX')} version, not ONNX",
            fix="deploy it with --flavor triton (or without --flavor)",
        )


def choose_flavor(model: str, version: str, found: dict[str, dict[str, Any]], flavor: str | None) -> str:
    """The flavor asked for (it must be logged), else ``triton`` before ``onnx``."""
    if flavor is None:
        flavor = next((f for f in FLAVORS if f in found), None)
        if flavor is None:
            raise UsageError(
                f"models:/{model}/{version} has neither the 'triton' nor the 'onnx' flavor "
                f"(its flavors: {', '.join(sorted(found)) or 'none'})",
                fix="log it with mlflow.onnx.log_model or mlflow_triton.log_model, or 'mlreg register' it",
            )
    if flavor not in found:
        raise UsageError(
            f"models:/{model}/{version} has no '{flavor}' flavor (its flavors: {', '.join(sorted(found))})",
            fix=f"use --flavor {next((f for f in FLAVORS if f in found), 'triton')}",
        )
    return flavor


# -- reading what NVIDIA's flows logged -------------------------------------------------------------


def download_model(registry: LoggedModels, model: str, version: str, dest: Path) -> Path:
    """The registered version's MLflow Model folder (MLmodel + its files), downloaded to ``dest``."""
    return registry.runs.download_model(model, version, dest)


def flavors(logged: Path) -> dict[str, dict[str, Any]]:
    """The MLmodel's flavors (name -> its settings); none without an MLmodel."""
    import yaml  # lazy: yaml (MLflow's dependency), ~20 ms: only when NVIDIA's flavors are read

    path = logged / "MLmodel"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    return {str(k): dict(v or {}) for k, v in (data.get("flavors") or {}).items()}


def logged_config(registry: LoggedModels, logged: Path) -> str | None:
    """The ``config.pbtxt`` logged with the model: beside MLmodel (MLflow 2 kept the run's artifact
    path and the model together), else under the model's name in its source run (MLflow 3 keeps
    ``mlflow.log_artifact(path, "triton")`` in the run, the model apart)."""
    if (logged / CONFIG_NAME).is_file():
        return (logged / CONFIG_NAME).read_text()
    import yaml  # lazy: yaml ~40 ms, only for an MLmodel file

    mlmodel = yaml.safe_load((logged / "MLmodel").read_text()) or {}
    run_id, model_id = mlmodel.get("run_id"), mlmodel.get("model_id")
    if not run_id or not model_id:
        return None
    name = registry.runs.logged_model_name(model_id)
    if f"{name}/{CONFIG_NAME}" not in registry.runs.artifact_paths(run_id, name):
        return None
    with tempfile.TemporaryDirectory(prefix="mlreg-config-") as tmp:
        got = registry.runs.download(run_id, f"{name}/{CONFIG_NAME}", Path(tmp))
        return got.read_text()


# -- building the Triton folder -----------------------------------------------------------------------


def onnx_folder(
    model: str, logged: Path, flavor: dict[str, Any], folder: Path, config_text: str | None
) -> str:
    """``folder`` = ``config.pbtxt`` + ``1/model.onnx`` (+ external data files); returns where the
    config came from: "logged" or "generated"."""
    source = logged / str(flavor.get("data") or ONNX_FILE)
    if not source.is_file():
        raise ContractError(
            f"the logged ONNX model of {model} has no file '{source.name}'",
            fix="log it again with mlflow.onnx.log_model",
        )
    version_dir = folder / "1"
    version_dir.mkdir(parents=True)
    shutil.copy2(source, version_dir / ONNX_FILE)
    for extra in logged.iterdir():  # external weights saved beside the graph
        if extra.is_file() and extra != source and extra.name not in MLFLOW_FILES and extra.suffix != ".txt":
            shutil.copy2(extra, version_dir / extra.name)
    if config_text is not None:
        config = parse_config(config_text, f"{model}/{CONFIG_NAME} (logged)")
        if complete(model, config, folder):
            (folder / CONFIG_NAME).write_text(format_config(config))
        else:  # complete as logged: its bytes stay as they are
            (folder / CONFIG_NAME).write_text(_renamed(config_text, config, model))
        return "logged"
    config = model_config_pb2().ModelConfig()
    config.backend, config.default_model_filename = "onnxruntime", ONNX_FILE  # as NVIDIA's plugin
    complete(model, config, folder, fields=True)
    (folder / CONFIG_NAME).write_text(format_config(config))
    return "generated"


def triton_folder(model: str, logged: Path, flavor: dict[str, Any], folder: Path) -> str:
    """``folder`` = the logged model folder's ``config.pbtxt`` and the version folder it serves
    (its ``version_policy``'s one specific version, else the latest, as Triton's default)."""
    source = logged / str(flavor.get("data") or "")
    if not flavor.get("data") or not (source / CONFIG_NAME).is_file():
        raise ContractError(
            f"the logged 'triton' flavor of {model} holds no {CONFIG_NAME} (under '{flavor.get('data')}')",
            fix="log the Triton model folder (config.pbtxt + version folders) with mlflow_triton.log_model",
        )
    text = (source / CONFIG_NAME).read_text()
    config = parse_config(text, f"{flavor['data']}/{CONFIG_NAME}")
    version = served_version(model, config, source)
    shutil.copytree(source / version, folder / version)
    if complete(model, config, folder):
        (folder / CONFIG_NAME).write_text(format_config(config))
    else:
        (folder / CONFIG_NAME).write_text(_renamed(text, config, model))
    return "model folder"


def served_version(model: str, config: ModelConfig, source: Path) -> str:
    versions = sorted((p.name for p in source.iterdir() if p.is_dir() and p.name.isdigit()), key=int)
    specific = [str(v) for v in config.version_policy.specific.versions]
    if len(specific) == 1 and specific[0] in versions:
        return specific[0]
    if not versions:
        raise ContractError(
            f"the logged Triton model folder of {model} has no version folder (1/, 2/, ...)",
            fix="log the model folder with its version folder(s)",
        )
    return versions[-1]


def _renamed(text: str, config: ModelConfig, model: str) -> str:
    """The config's text, renamed to the registered model where it names another (Triton requires
    the folder's name)."""
    if not config.name or config.name == model:
        return text
    config.name = model
    return format_config(config)


# -- Triton's auto-complete ------------------------------------------------------------------------------


def complete(model: str, config: ModelConfig, folder: Path, *, fields: bool = False) -> bool:
    """Fill what Triton's auto-complete would: the backend fields from the files (core; always with
    ``fields``, else only when nothing names the backend), then, for ONNX Runtime with inputs or
    outputs left out, batching and tensors from the graph (backend).  Returns whether it changed."""
    before = config.SerializeToString(deterministic=True)
    resolved = resolve(model, config, folder)
    if resolved.error:
        raise ContractError(resolved.error, fix="log a config.pbtxt naming the platform or backend")
    if fields or not (config.platform or config.backend):
        config.platform, config.backend = resolved.platform, resolved.backend
        config.default_model_filename = resolved.filename
    if resolved.backend == "onnxruntime" and not (config.input and config.output):
        version = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)[0]
        complete_onnx_io(model, config, read_onnx(version / resolved.filename))
    return config.SerializeToString(deterministic=True) != before


def complete_onnx_io(
    model: str, config: ModelConfig, signature: Signature, default_batch: int = DEFAULT_MAX_BATCH_SIZE
) -> None:
    """The ONNX Runtime backend's ``AutoCompleteMaxBatch`` + ``AutoCompleteIO``: a graph whose
    every tensor has a variable first dimension batches (max_batch_size = the default, dynamic
    batching on when above 1); tensors left out of the config are added from the graph."""
    tensors = (*signature.inputs, *signature.outputs)
    dims = {t.name: _dims(model, t) for t in tensors}
    if all(dims[t.name] and dims[t.name][0] == -1 for t in tensors):
        if config.max_batch_size == 0:
            config.max_batch_size = max(default_batch, 0)
        if config.max_batch_size > 1 and not (
            config.HasField("dynamic_batching") or config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ContractError(
            f"autofill failed for model '{model}': model does not support batching while "
            "non-zero max_batch_size is specified",
            fix="set max_batch_size: 0 in config.pbtxt, or export the graph with a variable first dimension",
        )
    if not config.input:
        for tensor in signature.inputs:
            _add_tensor(config, config.input.add(), tensor, dims[tensor.name])
    if not config.output:
        for tensor in signature.outputs:
            _add_tensor(config, config.output.add(), tensor, dims[tensor.name])


def _dims(model: str, tensor: TensorSpec) -> list[int]:
    """A graph tensor's dims as ONNX Runtime reports them (a symbolic dimension is -1)."""
    if tensor.shape is None:
        raise ContractError(
            f"{model}: the ONNX graph declares no shape for tensor '{tensor.name}'; Triton cannot "
            "auto-complete its dims",
            fix="log a config.pbtxt beside the model that declares the tensor's dims",
        )
    return [d if isinstance(d, int) else -1 for d in tensor.shape]


def _add_tensor(config: ModelConfig, io: Any, tensor: TensorSpec, dims: list[int]) -> None:
    data_type = "TYPE_STRING" if tensor.dtype == "BYTES" else f"TYPE_{tensor.dtype}"
    types = model_config_pb2().DataType
    if data_type not in types.keys():
        raise ContractError(
            f"tensor '{tensor.name}' has an ONNX type Triton does not serve ({tensor.dtype})",
            fix="export the graph with a supported type, or log a config.pbtxt",
        )
    io.name, io.data_type = tensor.name, types.Value(data_type)
    kept = dims[1:] if config.max_batch_size > 0 else dims
    io.dims.extend(kept or [1])
    if not kept and config.max_batch_size > 0:
        io.reshape.SetInParent()  # a scalar per item: shape [] reshaped to [1]


# -- registering the result ------------------------------------------------------------------------------


def _register(
    registry: LoggedModels, model: str, source: str, flavor: str, config_from: str, folder: Path
) -> Deployable:
    version_dir = next(p for p in folder.iterdir() if p.is_dir())
    info = {SOURCE_TAG: f"{model} v{source}", "source_flavor": flavor, "source_config": config_from}
    result = register(registry, Candidate(model, version_dir, folder / CONFIG_NAME), export_info=info)
    if result.validation == "failed":
        findings = "; ".join(result.findings) or "see the version's validation.json"
        raise ContractError(
            f"models:/{model}/{source} (flavor '{flavor}') is not a valid Triton model: {findings}",
            fix=f"log a {CONFIG_NAME} beside the model that matches it (mlflow.log_artifact(path, 'triton'))",
            model=model,
            version=result.version,
        )
    for key, value in ((SOURCE_TAG, source), (FLAVOR_TAG, flavor), (CONFIG_TAG, config_from)):
        registry.models.set_version_tag(model, result.version, key, value)
    registry.models.set_version_tag(model, source, IMPORTED_TAG, result.version)
    return Deployable(model, result.version, source, flavor, config_from, result.created)


def source_of(tags: dict[str, str]) -> tuple[str, str] | None:
    """(source version, flavor) of an mlreg version made of NVIDIA's flavors, else None."""
    if FLAVOR_TAG in tags and SOURCE_TAG in tags:
        return tags[SOURCE_TAG], tags[FLAVOR_TAG]
    return None


__all__ = [
    "FLAVORS",
    "Deployable",
    "check_flavor",
    "complete",
    "complete_onnx_io",
    "deployable",
    "source_of",
]
