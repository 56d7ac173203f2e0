"""The one-shot deployer: each changed model's config written to the store, then loaded on every
target (canary first).  The swap keeps the old version serving: a member's new config names both
versions until ``finalize`` retires the old one; where old and new cannot share a config (a runtime
change), the ensembles over it first follow the latest loaded version (-1).  One load per target
per changed model, and one more per model to retire the old version.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.plan import Role, Step, desired_config, follow_latest
from pipelines.core.reports import FleetReport
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import Change
from registry.errors import PromotionError


def apply(
    ctx: FleetContext,
    step: Step,
    text: str,
    versions: list[str],
    override: bool = False,
    retired: tuple[str, ...] = (),
) -> None:
    """``step.model``'s config written to the store and loaded on every target, noted in the undo
    log before the write by ``Fleet.apply`` (each load tells it through ``Fleet.move``);
    ``retired`` versions waited for until unloaded."""
    ctx.fleet.apply(Change(step.model, text, tuple(versions), override=override, retired=retired))


def check_serves_from_store(ctx: FleetContext) -> None:
    """Each target serves from the environment's store: its repository index (Triton lists every
    model folder of the repository it serves from, loaded or not) names at least one of the store's
    other models -- or, when the store holds none (a new or emptied store, or only this promotion's
    models), no other model: a target whose repository holds models the store does not serves
    from elsewhere, and would load its own copy of a model, never verified.  A planned model a
    target holds proves nothing either way (a candidate an interrupted gate loaded from its files).
    Chosen over a marker object at the store's root because Triton's API cannot read a file, and
    a marker would have to be written by every existing store first; an empty store and a
    repository holding only this promotion's models cannot be told apart (a load from an empty
    one then fails: it has no such model), and the rollback never unloads what a target served
    before (``undo``).  Then each target's recorded repository (``_check_recorded``) and, on the
    local stack only, a marker folder read back through its index (``_check_marker``): what tells
    two copies of one repository apart."""
    planned = {s.model for s in ctx.plan.steps}
    stored = set(ctx.store.list_models()) - planned
    for url in ctx.fleet.urls:
        listed = set(ctx.fleet.states_of(url))
        if stored and not stored & listed:
            # the view may be older than the listing: another promotion's first model, uploaded
            # since, is in the store and not yet in what this one saw (Triton lists it live)
            ctx.fleet.refresh([url])
            listed = set(ctx.fleet.states_of(url))
        if stored and not stored & listed:
            problem = f"its repository lists none of the store's models ({', '.join(sorted(stored)[:5])})"
        elif not stored and listed - planned:
            foreign = ", ".join(sorted(listed - planned)[:5])
            problem = f"the store holds no other model, and its repository lists {foreign}"
        else:
            continue
        raise PromotionError(
            f"{url} does not serve from the store {ctx.store.uri}: {problem}",
            fix=f"check environment '{ctx.env.name}' in mlreg.toml: its store must be the "
            "--model-repository its targets serve from",
        )
    _check_recorded(ctx)  # read-only checks first; the marker writes (and removes) one object
    _check_marker(ctx)


def _check_recorded(ctx: FleetContext) -> None:
    """Where a target's own start is on record (the local stack's ``--model-repository``, in
    ``.mlreg/stack/*/triton.json``: ``Environment.served_from``), it must be the environment's
    store: the check that tells two copies of one repository apart (``stack up --s3`` serves an
    S3 copy of a local folder holding the same models), which the index cannot.  Its limit: it is
    the stack's record, not Triton's word (Triton's API does not name its repository)."""
    recorded = dict(ctx.env.served_from)
    for url in ctx.fleet.urls:
        where = recorded.get(url)
        if where is not None and not same_store(where, ctx.env.store):
            raise PromotionError(
                f"{url} does not serve from the store {ctx.store.uri}: it was started on {where} "
                "(its --model-repository, as the local stack recorded it); the promotion would "
                "write one store while Triton serves another",
                fix="restart the stack on the environment's store ('mlreg stack down', then "
                "'mlreg stack up'), or promote to the environment whose store it serves",
            )


MARKER = "mlreg-serves-from-"  # + 16 hex: the folder _check_marker writes at the store's root


def _check_marker(ctx: FleetContext) -> None:
    """The local stack (mlreg's own servers): a folder written at the environment's store's root
    and read back through each target's repository index -- Triton lists every folder of the
    repository it serves from (seen on 2.51, loaded or not, config or none) -- then removed.  A
    target that does not list it does not read this store, whatever any record says.  Limits: not
    on a dry run (a plan only reads) nor for a fleet (a replica restarting with --load-model=* in
    that moment would try to load the folder); it proves where Triton looks, not which bytes it
    loaded (the versions are verified against MLflow's digest right before each load)."""
    if not ctx.env.local_stack or ctx.options.dry_run:
        return
    name = f"{MARKER}{secrets.token_hex(8)}"
    key = f"{name}/README"
    ctx.store.objects.write(
        key, b"written by an mlreg promotion to see which store its targets read; removed at once\n"
    )
    try:
        missing = [url for url in ctx.fleet.urls if name not in ctx.fleet.target(url).model_states()]
    finally:
        ctx.store.objects.delete(key)
    if missing:
        raise PromotionError(
            f"{', '.join(missing)} does not serve from the store {ctx.store.uri}: the folder {name}/ "
            "written there is not in its repository index (Triton lists every folder of the repository "
            "it serves from); nothing was promoted",
            fix="restart the local stack on the environment's store ('mlreg stack down', then 'mlreg "
            "stack up'); 'mlreg stack status' names the repository it serves",
        )


def same_store(one: str, other: str) -> bool:
    """Two store URIs name one store (local paths compared resolved)."""
    if "://" in one or "://" in other:
        return one.rstrip("/") == other.rstrip("/")
    return Path(one).resolve() == Path(other).resolve()


@dataclass(frozen=True)
class AllAtOnce:
    name: str = "all at once"

    def deploy(self, ctx: FleetContext) -> FleetReport:
        first = len(ctx.fleet.rollouts)
        for step in ctx.plan.steps:
            if step.noop:
                continue
            # never a version this run found not the registered bytes (--no-way-back): a load
            # naming it would make Triton read it again, so the swap goes without overlap
            unverified = any(ctx.store.versions.refused(step.model, v) for v in step.previous_versions)
            overlap = not step.is_ensemble and not step.runtime_changes and not unverified
            versions = [step.version]
            if overlap:
                versions = sorted(set(step.previous_versions) | {step.version}, key=int)
            elif not step.is_ensemble:
                self._follow_latest(ctx, step)
            apply(ctx, step, desired_config(step.config_text, versions, ctx.env.gpu), [step.version])
        summary = ", ".join(f"{s.model} v{s.version}" for s in ctx.plan.steps if not s.noop)
        return FleetReport(summary, ctx.fleet.rollouts[first:])

    @staticmethod
    def _follow_latest(ctx: FleetContext, step: Step) -> None:
        """Before a swap without overlap, ensembles pinned to the old version follow the latest
        loaded version (-1): Triton keeps the old one until the new one is READY, so no request
        through them fails; they are pinned to the new version right after."""
        for other in ctx.plan.steps:
            if other.role is Role.ENSEMBLE and other.previous_config is not None:
                versions = other.previous_versions or [other.version]
                text = follow_latest(other.previous_config, versions, ctx.env.gpu, [step.model])
                apply(ctx, other, text, versions)  # its old folder(s): re-numbered only when pinned

    def finalize(self, ctx: FleetContext) -> FleetReport:
        """Only the new versions serve now: the old versions unload (waited for, as loads wait
        for READY: a rerun never says "retired" while the old version still serves)."""
        first, retired = len(ctx.fleet.rollouts), []
        for step in ctx.plan.steps:
            old = [v for v in step.previous_versions if v != step.version]
            if step.is_ensemble or not old:
                continue
            apply(ctx, step, step.config_text, [step.version], retired=tuple(old))
            retired.append(f"{step.model} v{','.join(old)}")
        return FleetReport("retired " + (", ".join(retired) or "nothing"), ctx.fleet.rollouts[first:])
