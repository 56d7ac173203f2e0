"""``mlreg rollback MODEL [--to-version N]``: serve an earlier version again."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mlreg.ops.context import context
from mlreg.ops.promote import promote
from pipelines.core.options import Options
from pipelines.ledger.recorder import operation
from registry.errors import UsageError
from registry.ports import RegistryReader, RegistryView
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.core.reports import PromotionResult


def rollback(
    settings: Settings,
    env_name: str,
    model: str,
    to_version: str | None = None,
    options: Options | None = None,
) -> PromotionResult:
    """Serve an earlier version again: a promotion without the quality gate (breaking allowed),
    otherwise as ``options`` say (``dry_run``, ``on_stage``, ``on_start``).  Without ``to_version``:
    the newest version promoted in the environment that is not the one serving now (a UsageError
    when there is none)."""
    if to_version is None:
        to_version = rollback_version(settings, env_name, model)
    returning = replace(options or Options(), allow_breaking=True, skip_quality=True, rollback=True)
    with operation("rollback"):  # the ledger's events say which verb sent the calls
        return promote(settings, env_name, model, to_version, returning)


def rollback_version(settings: Settings, env_name: str, model: str) -> str:
    """The version ``rollback`` returns to without ``--to-version``."""
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


@dataclass(frozen=True)
class RollbackTarget:
    """Where `mlreg rollback MODEL` (no --to-version) goes, and what it leaves."""

    version: str | None  # the newest version promoted in the environment that is not serving now
    serving: tuple[str, ...]  # what serves now, as MLflow records it (the alias, the last promotion)


def rollback_target(registry: RegistryView, model: str, env: str, alias: str) -> RollbackTarget:
    """The newest successful promotion in ``env`` to a version other than what serves now.

    What serves is the version ``alias`` names and the one the newest successful promotion
    went to (they differ when a promotion was cut short after moving the alias); a repair rerun
    (``N -> N``) and a failed attempt are never a way back.  A version that arrived as a member of
    an ensemble's promotion (no run of its own: its ``promoted_<env>`` stamp) counts too, when it
    is newer than the model's own promotion found."""
    done = [h for h in registry.runs.promotions(model, env) if h.get("result") == "promoted" and h.get("to")]
    serving = {str(done[0]["to"])} if done else set()
    if named := registry.models.aliases(model).get(alias):
        serving.add(str(named))
    earlier = next(((str(h["to"]), h.get("when")) for h in done if str(h["to"]) not in serving), None)
    arrived = member_arrival(registry.models, model, env, serving)
    if arrived is not None and (earlier is None or _ms(arrived[1]) > _number(earlier[1])):
        earlier = (arrived[0], None)
    return RollbackTarget(
        earlier[0] if earlier else None, tuple(sorted(serving, key=lambda v: int(v) if v.isdigit() else -1))
    )


def member_arrival(
    registry: RegistryReader, model: str, env: str, serving: set[str]
) -> tuple[str, str] | None:
    """The newest version of ``model`` stamped ``promoted_<env>`` (every model a promotion moved
    is: members brought along by an ensemble's too) that does not serve now and is older than
    what serves (a stamp newer than the serving one's is a failed attempt's), with its stamp."""
    tag = f"promoted_{env}"
    stamps = {
        str(found.version): str(dict(getattr(found, "tags", None) or {}).get(tag, ""))
        for found in registry.find_by_tag(model, tag, "%", like=True)
    }
    newest_serving = max((stamps.get(v, "") for v in serving), default="")
    older = [
        (stamp, v) for v, stamp in stamps.items() if v not in serving and stamp and stamp <= newest_serving
    ]
    if not older or not newest_serving:
        return None
    stamp, version = max(older)
    return version, stamp


def _ms(stamp: str) -> float:
    """A ``promoted_<env>`` stamp (registry.lineage.deployment_stamp) as epoch milliseconds."""
    try:
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) * 1000 + int(fraction or 0) / 1000
    except ValueError:
        return 0.0


def _number(value: object) -> float:
    """A history row's ``when`` (epoch ms; absent: the oldest)."""
    return float(value) if isinstance(value, int | float) else -1.0


__all__ = ["RollbackTarget", "member_arrival", "rollback", "rollback_target", "rollback_version"]
