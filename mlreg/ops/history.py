"""``mlreg history MODEL [--env E]``: every promotion of a model, newest first.

Each row's ``result`` says one thing: ``promoted`` (a version went live), ``rolled back`` (a
version earlier than what served went live again: ``mlreg rollback``, or a promotion back to it),
``refused`` (a check stopped it before anything changed), ``arrived with E vN`` (the version went
live as a member of ensemble E's promotion to vN: no run of its own), ``aborted (undone)`` (it failed after a
change, and every change was put back) or ``aborted (undo failed)``.  A promotion's run records
its outcome as ``promoted``, ``refused``, ``rolled back`` (its own changes undone) or ``rollback
failed``; the words are read here, so runs recorded before this reading show the same way.
"""

from __future__ import annotations

import re
from functools import partial
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import open_registry
from registry.settings import Settings

if TYPE_CHECKING:
    from registry.mlflow.reads import RegistryReads

RUN_TAG = "promotion_run_"  # a version's tag: the run that last deployed it in <env>
RUN_ID = re.compile(r"[0-9a-f]{32}")  # MLflow's run ids; a tag holding anything else is not asked about
MAX_VERSIONS = 500  # the newest versions read for arrivals, as many as history lists promotions
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
    rows += arrivals(reads, model, env_name, {str(row.get("run_id")) for row in rows})
    return sorted(rows, key=lambda row: _number(row.get("when")), reverse=True)


def arrivals(reads: RegistryReads, model: str, env_name: str | None, seen: set[str]) -> list[dict[str, Any]]:
    """The versions of ``model`` that went live as members of an ensemble's promotion (no run of
    their own): each version's ``promotion_run_<env>`` tag names a run of another model.  A tag is
    not trusted alone: the run must be an active run of the promotions experiment, of another
    model, in that environment, recorded ``promoted``."""
    found = []
    for record in reads.versions(model)[:MAX_VERSIONS]:
        for key, run_id in sorted(record.tags.items()):
            env = key.removeprefix(RUN_TAG)
            asked = key.startswith(RUN_TAG) and env_name in (None, env) and run_id not in seen
            run = reads.promotion(run_id) if asked and RUN_ID.fullmatch(run_id) else None
            if not run or run.get("model") in (None, model) or not _live_in(run, env):
                continue
            seen.add(run_id)
            found.append(
                run
                | {
                    "from": None,  # the ensemble's run records the ensemble's versions, not the member's
                    "to": record.version,
                    "result": f"arrived with {run['model']} v{run.get('to')}",
                    "through": {"model": run["model"], "version": run.get("to")},
                }
            )
    return found


def result_of(row: dict[str, Any]) -> str:
    """The row's result in history's words (see the module's docstring)."""
    recorded = str(row.get("result") or "")
    if recorded != "promoted":
        return RECORDED.get(recorded, recorded or "unknown")
    return "rolled back" if _went_back(row.get("from"), row.get("to")) else "promoted"


def _live_in(run: dict[str, Any], env: str) -> bool:
    """Whether promotion ``run`` went live in ``env`` (recorded ``promoted`` there)."""
    return run.get("environment") == env and run.get("result") == "promoted"


def _number(value: object) -> float:
    """A row's ``when`` (epoch ms; absent: the oldest)."""
    return float(value) if isinstance(value, int | float) else -1.0


def _went_back(before: Any, to: Any) -> bool:
    """Whether version ``to`` is older than the newest version that served before (``from``: the
    serving versions, comma-separated, or "none")."""
    served = [int(v) for v in str(before or "").split(",") if v.strip().isdigit()]
    target = str(to or "")
    return bool(served) and target.isdigit() and int(target) < max(served)


__all__ = ["arrivals", "history", "result_of"]
