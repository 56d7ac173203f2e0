"""``mlreg store gc --env E [--keep N]``: the environment's retention policy applied to its store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlreg.ops.context import context
from mlreg.ops.context import fleet as fleet_of
from pipelines.storage.locking import noting_unreleased
from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.promote.retention import RetentionReport


def store_gc(
    settings: Settings,
    env_name: str,
    keep: int | None = None,
    *,
    dry_run: bool = False,
    models: list[str] | None = None,
) -> RetentionReport:
    """The environment's retention policy (``keep`` overrides it) applied to its store: versions
    beyond the window moved to the archive, never one an ensemble pins or a target holds (every
    target asked; the local environment with its stack down serves nothing).  ``collect`` takes
    each model's lock without waiting; one it could not release is named in the error
    (:func:`pipelines.storage.locking.noting_unreleased`), or listed as failed."""
    from pipelines.promote.retention import collect, registry_stamp  # lazy: the promotion package
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    ctx = context(settings, env_name)
    env = ctx.env
    store = open_store(env.store, digest_cache=settings.digest_cache)
    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: a number of versions cannot be negative", fix="pass --keep 2")

    def ask() -> dict[str, Any]:
        if env.local_stack and not env.targets:
            return {}
        with fleet_of(settings, env, store) as fleet:
            return dict(fleet.states())

    window = env.keep if keep is None else keep
    stamp = registry_stamp(ctx.registry.models, env.name)
    with noting_unreleased(store.session):  # an outage: each lock it could not release named
        report = collect(store, ask, stamp, window, dry_run=dry_run, models=models)
    report.failed.extend(f"lock not released: {note}" for note in store.session.lock_notes)
    return report


__all__ = ["store_gc"]
