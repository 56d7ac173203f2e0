"""Lineage facts about an export: git state, digests, contract, and the version's description."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.contracts.config import data_type_name, full_shape

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def deployment_stamp(now: float | None = None) -> str:
    """When a version was promoted (its ``promoted_<env>`` tag): UTC, to the microsecond, so that
    two promotions in one second still order (a failed attempt's tag is newer than what serves,
    retention ranks by it); the text sorts as the time does."""
    moment = time.time() if now is None else now
    seconds = int(moment)
    micros = min(999_999, int(round((moment - seconds) * 1_000_000)))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


@dataclass(frozen=True)
class GitState:
    commit: str
    dirty: bool


def git_state(folder: Path) -> GitState:
    """The commit of the checkout holding ``folder`` ("unknown" outside git)."""

    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", *args], cwd=folder, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return GitState("unknown", False)
    return GitState(commit, bool(git("status", "--porcelain", "--untracked-files=no")))


def contract_of(config: ModelConfig) -> dict[str, Any]:
    """The promises a config makes to callers: tensors with full shapes, batching, platform."""

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "dtype": data_type_name(t.data_type),
                "shape": list(full_shape(config, list(t.dims))),
            }
            for t in items
        ]

    return {
        "platform": config.platform or config.backend,
        "max_batch_size": config.max_batch_size,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
    }


def digest_of_contract(contract: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(contract, sort_keys=True).encode()).hexdigest()


@dataclass
class Lineage:
    model: str
    git: GitState
    artifact_digest: str
    contract_digest: str
    framework: str
    platform: str
    exporter_sha256: str = ""
    members: dict[str, str] = field(default_factory=dict)  # ensemble member -> registry version
    validation: str = "passed"

    def tags(self) -> dict[str, str]:
        tags = {
            "git_commit": self.git.commit,
            "git_dirty": str(self.git.dirty).lower(),
            "artifact_digest": self.artifact_digest,
            "contract_digest": self.contract_digest,
            "framework": self.framework,
            "platform": self.platform,
            "validation": self.validation,
            "mlreg": "1",
        }
        if self.exporter_sha256:
            tags["exporter_sha256"] = self.exporter_sha256
        tags.update({f"member_{name}": version for name, version in self.members.items()})
        return tags


def describe(lineage: Lineage, contract: dict[str, Any], findings: list[str]) -> str:
    """The version's markdown description, so the MLflow UI tells the story without mlreg."""
    rows = [
        f"| {io} | `{t['name']}` | {t['dtype']} | `{t['shape']}` |"
        for io, key in (("input", "inputs"), ("output", "outputs"))
        for t in contract[key]
    ]
    members = "".join(f"\n- `{m}` version {v}" for m, v in sorted(lineage.members.items()))
    problems = "".join(f"\n- {line}" for line in findings) or "\n- none"
    passed = lineage.validation == "passed"
    failed = [] if passed else ["⛔ **FAILED VALIDATION: this version cannot be promoted.**", ""]
    return "\n".join(
        [
            *failed,
            f"**{lineage.model}** — {lineage.platform}, max_batch_size {contract['max_batch_size']}",
            "",
            "| | tensor | type | shape |",
            "|---|---|---|---|",
            *rows,
            "",
            "**Lineage**",
            "",
            f"- git commit `{lineage.git.commit}`" + (" (dirty working tree)" if lineage.git.dirty else ""),
            f"- artifact sha256 `{lineage.artifact_digest}`",
            f"- contract sha256 `{lineage.contract_digest}`",
            f"- framework {lineage.framework}"
            + (f", exporter sha256 `{lineage.exporter_sha256}`" if lineage.exporter_sha256 else ""),
            *([f"- built against members:{members}"] if lineage.members else []),
            "",
            f"**Validation: {lineage.validation}**{problems}",
            "",
            f"Promote with `mlreg promote {lineage.model} --version <this version>`."
            if passed
            else "Not promotable: fix the problems above and register a new version "
            f"(`mlreg validate` names them; `mlreg show {lineage.model}` lists the versions).",
        ]
    )


# -- the version as an MLflow Model ----------------------------------------------------------------

# Triton's data types as numpy dtype names (MLflow's TensorSpec); BF16 has no numpy type
NUMPY_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "float32",
    "STRING": "object",
}
FLAVOR = "triton"
VERSION_FOLDER = "1"  # the version folder's name inside the logged Triton model folder


def tensor_specs(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A contract's tensors as MLflow tensor specs (name, numpy dtype, shape with -1 for batch)."""
    return [
        {"name": t["name"], "dtype": NUMPY_DTYPES.get(t["dtype"], "object"), "shape": list(t["shape"])}
        for t in tensors
    ]


def flavors_of(name: str, contract: dict[str, Any], model_file: str | None) -> dict[str, dict[str, Any]]:
    """The MLmodel flavors of a Triton model folder logged as ``<name>/config.pbtxt`` + ``<name>/1/``.

    ``triton`` keeps the layout NVIDIA's mlflow-triton plugin reads (``data`` names the model folder);
    the framework flavor is added where MLflow has one, pointing at the file inside the version folder.
    ``model_file`` is the file Triton loads, relative to the version folder (None for ensembles).
    """
    platform = contract["platform"]
    flavors: dict[str, dict[str, Any]] = {
        FLAVOR: {
            "data": name,
            "model_name": name,
            "version_folder": VERSION_FOLDER,
            "config": f"{name}/config.pbtxt",
            "platform": platform,
            "max_batch_size": contract["max_batch_size"],
        }
    }
    path = f"{name}/{VERSION_FOLDER}/{model_file}" if model_file else None
    if platform == "onnxruntime_onnx" and path:
        from importlib.metadata import version  # lazy: ~10 ms, only for an ONNX flavor

        flavors["onnx"] = {
            "onnx_version": version("onnx"),
            "data": path,
            "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        }
    elif platform == "tensorflow_savedmodel" and path:
        flavors["tensorflow"] = {
            "saved_model_dir": path,
            "model_type": "tf2-module",
            "meta_graph_tags": ["serve"],
            "signature_def_key": "serving_default",
        }
    elif platform == "python" and path:
        # metadata only: loading a TritonPythonModel needs Triton's triton_python_backend_utils
        flavors["python"] = {
            "model_file": path,
            "class": "TritonPythonModel",
            "runtime": "triton python backend",
        }
    return flavors
