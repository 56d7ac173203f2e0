"""What the MLflow deployments target (``mlreg/deployments.py``) reads and writes, without MLflow:
deployment names, ``-C`` options, predict inputs, deployment rows.  Kept apart so that what has
no need of MLflow (the unit tests, the CLI) does not import it (~1 s)."""

from __future__ import annotations

from typing import Any

from pipelines.core.options import Options
from registry.errors import UsageError

BOOL_KEYS = ("dry_run", "allow_breaking", "skip_quality")
CONFIG_KEYS = ("env", "serve_as", *BOOL_KEYS)
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}
NVIDIA_INPUTS = "inputs"  # NVIDIA's predict document: {"inputs": {"INPUT0": [...], ...}}


def check_name(name: str | None) -> str:
    """A deployment's name is a Triton model folder: not empty, not a path (NVIDIA's wording)."""
    if not name or not name.strip():
        raise UsageError(
            "Model name cannot be empty. Please enter a valid name to deploy.",
            fix="pass --name REGISTERED_MODEL_NAME",
        )
    if "/" in name or "\\" in name or name.strip() in (".", ".."):
        raise UsageError(
            f"Path traversal is not allowed in model's name: {name}",
            fix="a deployment is named after its registered model: pass --name without '/' or '..'",
        )
    return name


def _flag(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise UsageError(f"config '{key}={value}' is not a boolean", fix=f"use -C {key}=true or -C {key}=false")


def promote_options(config: dict[str, Any] | None) -> Options:
    """``-C`` keys as the promotion's options (unknown keys refused, booleans parsed)."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(
            f"unknown config key(s) for target 'mlreg': {', '.join(unknown)}",
            fix=f"use only: {', '.join(CONFIG_KEYS)} (see 'mlflow deployments help -t mlreg')",
        )
    options: dict[str, Any] = {key: _flag(key, config[key]) for key in BOOL_KEYS if key in config}
    if "serve_as" in config:
        if config["serve_as"] not in {"auto", "native", "onnx"}:
            raise UsageError(f"unknown serve_as '{config['serve_as']}'", fix="use auto, native or onnx")
        options["serve_as"] = str(config["serve_as"])
    return Options(**options)


def _deployment(env: str, row: dict[str, Any]) -> dict[str, Any]:
    serving = row["serving"] or {}
    ready = bool(row["desired"]) and not row["drift"] and all(v == row["desired"] for v in serving.values())
    return {
        "name": row["model"],
        "flavor": "triton",
        "environment": env,
        "version": row["alias"],
        "state": "READY" if ready and serving else "UNAVAILABLE",  # as NVIDIA's plugin lists it
        "desired": row["desired"],
        "serving": serving,
        "drift": row["drift"],
    }


def _arrays(inputs: Any) -> dict[str, Any]:
    """MLflow's predict input (a DataFrame or a dict) as input name -> values; ``mlreg.ops.predict``
    makes arrays of them, of the deployed config's dtypes.  NVIDIA's input document
    ``{"inputs": {"NAME": [...]}}`` is taken as a dict, or as the DataFrame the ``mlflow
    deployments predict`` CLI reads it into (one column ``inputs``, one row per input tensor)."""
    if hasattr(inputs, "columns"):
        if list(inputs.columns) == [NVIDIA_INPUTS]:  # NVIDIA's document read by pandas
            return {str(row): value for row, value in inputs[NVIDIA_INPUTS].items()}
        # one column per input tensor, one row per item
        return {str(col): inputs[col].tolist() for col in inputs.columns}
    if isinstance(inputs, dict):
        if set(inputs) == {NVIDIA_INPUTS} and isinstance(inputs[NVIDIA_INPUTS], dict):
            inputs = inputs[NVIDIA_INPUTS]
        return {str(k): v for k, v in inputs.items()}
    raise UsageError(
        f"predict takes a DataFrame or a dict of arrays, not {type(inputs).__name__}",
        fix="pass {'input_name': array, ...} or a JSON file whose keys are the input names",
    )
