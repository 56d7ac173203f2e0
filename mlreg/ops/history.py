"""``mlreg history MODEL [--env E]``: every promotion of a model, newest first."""

from __future__ import annotations

from typing import Any

from mlreg.ops.context import context
from registry.settings import Settings


def history(settings: Settings, model: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (newest first); an unknown model is an error."""
    from pipelines.promote.status import history as promotions  # lazy: tritonclient, numpy

    registry = context(settings, env_name or "local").registry
    rows = promotions(registry, model, env_name)
    if not rows:
        registry.require_model(model)
    return rows


__all__ = ["history"]
