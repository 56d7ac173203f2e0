"""What mlreg keeps in MLflow under its own names: its experiments and the logged Triton model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.settings import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT

__all__ = ["EXPORTS_EXPERIMENT", "PROMOTIONS_EXPERIMENT", "LoggedTritonModel"]


@dataclass
class LoggedTritonModel:
    """What ``MlflowRegistry.log_model`` logs: a Triton model folder with its MLmodel facts."""

    name: str
    config_path: Path
    version_dir: Path
    flavors: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]  # tensor specs: name, numpy dtype, shape (-1 = batch/variable)
    outputs: list[dict[str, Any]]
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def mlmodel(self, run_id: str, model_id: str) -> Any:
        """The ``MLmodel`` (an ``mlflow.models.Model``): flavors, the contract as its signature."""
        import numpy as np  # heavy, like MLflow: only when a version is registered
        from mlflow.models import Model, ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        def schema(specs: list[dict[str, Any]]) -> Any:
            return Schema([TensorSpec(np.dtype(s["dtype"]), tuple(s["shape"]), s["name"]) for s in specs])

        signature = None
        if self.inputs and self.outputs:
            signature = ModelSignature(schema(self.inputs), schema(self.outputs))
        mlmodel = Model(run_id=run_id, model_id=model_id, signature=signature, metadata=self.metadata)
        for flavor, conf in self.flavors.items():
            mlmodel.add_flavor(flavor, **conf)
        return mlmodel
