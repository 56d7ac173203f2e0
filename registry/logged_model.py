"""The Triton model folder a registration logs as an MLflow Model, with its MLmodel facts.

``register()`` builds it; a ``Registrar``'s ``log_model`` logs it (``MlflowRegistry``: as an
MLflow 3 logged model, ``registry.mlflow.model.mlmodel`` writing its ``MLmodel``; a plan keeps
it in memory).  Plain data: nothing here imports MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoggedTritonModel:
    """What ``MlflowRuns.log_model`` logs: a Triton model folder with its MLmodel facts."""

    name: str
    config_path: Path
    version_dir: Path
    flavors: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]  # tensor specs: name, numpy dtype, shape (-1 = batch/variable)
    outputs: list[dict[str, Any]]
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
