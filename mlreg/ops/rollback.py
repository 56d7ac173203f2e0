"""``mlreg rollback MODEL [--to-version N]``: serve an earlier version again."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mlreg.ops.context import context
from mlreg.ops.promote import promote
from pipelines.ledger.recorder import operation
from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.core.reports import PromotionResult
    from pipelines.promote.runner import OnStage


def rollback(
    settings: Settings,
    env_name: str,
    model: str,
    to_version: str | None = None,
    *,
    dry_run: bool = False,
    on_stage: OnStage | None = None,
    on_start: Callable[[str], None] | None = None,
) -> PromotionResult:
    """Serve an earlier version again: a promotion without the quality gate (breaking allowed).
    Without ``to_version``: the newest version promoted in the environment that is not the one
    serving now (a UsageError when there is none)."""
    if to_version is None:
        to_version = rollback_version(settings, env_name, model)
    with operation("rollback"):  # the ledger's events say which verb sent the calls
        return promote(
            settings,
            env_name,
            model,
            to_version,
            dry_run=dry_run,
            allow_breaking=True,
            skip_quality=True,
            on_stage=on_stage,
            on_start=on_start,
            rollback=True,
        )


def rollback_version(settings: Settings, env_name: str, model: str) -> str:
    """The version ``rollback`` returns to without ``--to-version``."""
    from pipelines.promote.status import rollback_target  # lazy: tritonclient, numpy

    ctx = context(settings, env_name)
    target = rollback_target(ctx.registry, model, env_name, ctx.env.alias)
    if target.version is not None:
        return target.version
    serving = f"v{','.join(target.serving)} serves" if target.serving else "nothing was promoted"
    raise UsageError(
        f"{model} in '{env_name}': no earlier promoted version to return to ({serving}; "
        "a repair rerun or a failed attempt is not one)",
        fix=f"pass --to-version N (see 'mlreg history {model} --env {env_name}')",
    )


__all__ = ["rollback", "rollback_version"]
