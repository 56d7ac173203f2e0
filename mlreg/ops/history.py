"""``mlreg history MODEL [--env E]``: every promotion of a model, newest first.

Each row's ``result`` says one thing: ``promoted`` (a version went live), ``rolled back`` (a
version earlier than what served went live again: ``mlreg rollback``, or a promotion back to it),
``refused`` (a check stopped it before anything changed), ``aborted (undone)`` (it failed after a
change, and every change was put back) or ``aborted (undo failed)``.  A promotion's run records
its outcome as ``promoted``, ``refused``, ``rolled back`` (its own changes undone) or ``rollback
failed``; the words are read here, so runs recorded before this reading show the same way.
"""

from __future__ import annotations

from typing import Any

from mlreg.ops.context import context
from registry.settings import Settings

RECORDED = {  # a promotion run's ``result`` tag -> what history says of it
    "refused": "refused",
    "rolled back": "aborted (undone)",  # the attempt's own changes were put back
    "rollback failed": "aborted (undo failed)",
}


def history(settings: Settings, model: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (newest first); an unknown model is an error."""
    from pipelines.promote.status import history as promotions  # lazy: tritonclient, numpy

    registry = context(settings, env_name or "local").registry
    rows = [row | {"result": result_of(row)} for row in promotions(registry, model, env_name)]
    if not rows:
        registry.require_model(model)
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
