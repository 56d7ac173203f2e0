"""``mlreg history MODEL [--env E]``: every promotion of a model, newest first.

Each row's ``result`` says one thing: ``promoted`` (a version went live), ``rolled back`` (a
version earlier than what served went live again: ``mlreg rollback``, or a promotion back to it),
``refused`` (a check stopped it before anything changed), ``aborted (undone)`` (it failed after a
change, and every change was put back) or ``aborted (undo failed)``.  A promotion's run records
its outcome as ``promoted``, ``refused``, ``rolled back`` (its own changes undone) or ``rollback
failed``; the words are read here, so runs recorded before this reading show the same way.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from mlreg.ops.context import open_registry
from registry.settings import Settings

RECORDED = {  # a promotion run's ``result`` tag -> what history says of it
    "refused": "refused",
    "rolled back": "aborted (undone)",  # the attempt's own changes were put back
    "rollback failed": "aborted (undo failed)",
}


def history(settings: Settings, model: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (newest first); an unknown model is an error.  Read through
    ``registry.mlflow.reads``: the embedded registry's file needs no MLflow import."""
    from registry.mlflow.reads import open_reads  # lazy: only this verb reads runs this way

    if env_name is not None:  # an unknown environment is named, not an empty history
        from pipelines.promote.environments import environment  # lazy: tomllib, the settings

        environment(settings, env_name)
    reads = open_reads(settings, partial(open_registry, settings))
    rows = [row | {"result": result_of(row)} for row in reads.promotions(model, env_name)]
    if not rows:
        reads.require_model(model)
    return rows


def result_of(row: dict[str, Any]) -> str:
    """The row's result in history's words (see the module's docstring)."""
    recorded = str(row.get("result") or "")
    if recorded != "promoted":
        return RECORDED.get(recorded, recorded or "unknown")
    return "rolled back" if _went_back(row.get("from"), row.get("to")) else "promoted"


def _went_back(before: Any, to: Any) -> bool:
    """Whether version ``to`` is older than the newest version that served before (``from``: the
    serving versions, comma-separated, or "none")."""
    served = [int(v) for v in str(before or "").split(",") if v.strip().isdigit()]
    target = str(to or "")
    return bool(served) and target.isdigit() and int(target) < max(served)


__all__ = ["history", "result_of"]
