"""``mlreg versions MODEL``, ``mlreg show MODEL VERSION`` and ``mlreg alias ls|set|rm``: a
registered model's versions, one version's lineage, contract and files, and its aliases."""

from __future__ import annotations

from typing import Any

from mlreg.ops.context import open_registry
from registry.settings import Settings


def versions(settings: Settings, model: str) -> list[dict[str, Any]]:
    """One row per version (created, aliases, validation, signer, where promoted); an unknown
    model is an error (a NotFound, exit 4), a model with no versions an empty list."""
    from registry.mlflow.queries import list_versions  # lazy: MLflow (~1 s), when run

    rows = list_versions(settings, model)
    if not rows:
        open_registry(settings).models.require_model(model)
    return rows


def show(settings: Settings, model: str, version: str) -> dict[str, Any]:
    """One version: lineage, contract, files and who signed it ("" when unsigned)."""
    from registry.mlflow.queries import show_version  # lazy: MLflow (~1 s), when run

    data = show_version(settings, model, version)
    data.setdefault("signed_by", "")
    return data


def aliases(settings: Settings, model: str) -> dict[str, str]:
    """alias -> version, sorted by alias; read from the registry's file (no MLflow import)."""
    from registry.mlflow.reads import open_reads  # lazy: the embedded registry's file, no MLflow

    return dict(sorted(open_reads(settings).require_model(model).items()))


def set_alias(settings: Settings, model: str, alias: str, version: str) -> None:
    open_registry(settings).models.set_alias(model, alias, version)


def remove_alias(settings: Settings, model: str, alias: str) -> None:
    open_registry(settings).models.delete_alias(model, alias)


__all__ = ["aliases", "remove_alias", "set_alias", "show", "versions"]
