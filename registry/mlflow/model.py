"""What mlreg keeps in MLflow under its own names: its experiments and the logged Triton model
(``registry.logged_model``'s data, written here as MLflow's ``MLmodel``)."""

from __future__ import annotations

from typing import Any

from registry.logged_model import LoggedTritonModel
from registry.settings import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT

__all__ = ["EXPORTS_EXPERIMENT", "PROMOTIONS_EXPERIMENT", "LoggedTritonModel", "mlmodel"]


def mlmodel(model: LoggedTritonModel, run_id: str, model_id: str) -> Any:
    """``model``'s ``MLmodel`` (an ``mlflow.models.Model``): flavors, the contract as its signature."""
    import numpy as np  # lazy: numpy ~0.1 s, only when a version is registered
    from mlflow.models import Model, ModelSignature  # lazy: mlflow ~1.5 s of import
    from mlflow.types.schema import Schema, TensorSpec  # lazy: mlflow ~1.5 s of import

    def schema(specs: list[dict[str, Any]]) -> Any:
        return Schema([TensorSpec(np.dtype(s["dtype"]), tuple(s["shape"]), s["name"]) for s in specs])

    signature = None
    if model.inputs and model.outputs:
        signature = ModelSignature(schema(model.inputs), schema(model.outputs))
    logged = Model(run_id=run_id, model_id=model_id, signature=signature, metadata=model.metadata)
    for flavor, conf in model.flavors.items():
        logged.add_flavor(flavor, **conf)
    return logged
