"""``mlflow deployments delete -t mlreg --name MODEL``: a model retired from an environment.

Its servers unload it, its desired state (``config.pbtxt``) goes, its versions move to the store's
archive, then its alias goes; refused while an ensemble there uses it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from mlreg.ops.context import context
from mlreg.ops.context import fleet as fleet_of
from pipelines.ledger.recorder import operation
from pipelines.storage.locking import model_lock
from registry.errors import MlregError, PromotionError, StorageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.promote.environments import Environment
    from pipelines.storage.base import Repository


def ensemble_users(store: Repository, name: str) -> list[str]:
    """The ensembles in ``store`` whose steps name ``name`` (platform "ensemble" read from each
    parsed config, in the store's order)."""
    from pipelines.core.plan import ensembles_pinning  # lazy: protobuf

    return list(ensembles_pinning(store, [name]))


def retire(settings: Settings, env_name: str, name: str) -> None:
    """Unload ``name`` from every target of the environment and remove its desired state (its
    config.pbtxt), then its folder (:func:`clear_folder`: its versions to the store's archive),
    then its alias; refused while an ensemble there uses it.  Any exit before the servers are done
    -- a target that fails to unload, an interrupt -- replays the undo log: the config back in the
    store, each replica back to what it held.  A folder left by a retire that stopped after the
    unload is cleared by the next one."""
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    ctx = context(settings, env_name)
    env = ctx.env
    store = open_store(env.store)
    config = store.read_config(name)
    if config is None and not store.objects.list_prefix(f"{name}/"):
        raise PromotionError(
            f"{name} is not deployed in '{env.name}' ({env.store} has no {name}/config.pbtxt)",
            fix=f"see 'mlflow deployments list -t mlreg:/{env.name}'",
        )
    users = ensemble_users(store, name)
    if users:
        raise PromotionError(
            f"{name} is used by ensemble(s) {', '.join(users)} in '{env.name}'; retiring it would break them",
            fix="retire the ensemble first, or promote an ensemble version that does not use it",
        )
    with model_lock(store.session, name, settings):
        if config is not None:  # None: unloaded by a retire that stopped before its folder was gone
            with operation("retire"):  # the ledger's events say which verb sent the calls
                _unload_everywhere(settings, env, store, name, config)
        unfinished = clear_folder(store, name)
    with contextlib.suppress(MlregError):  # the servers are done; the registry's record is best effort
        if env.alias in ctx.registry.models.aliases(name):
            ctx.registry.models.delete_alias(name, env.alias)
        ctx.registry.deployed.forget_deployment(name, env.name)
    if unfinished is not None:
        raise unfinished


def _unload_everywhere(
    settings: Settings, env: Environment, store: Repository, name: str, config: str
) -> None:
    """The config deleted, then ``name`` unloaded on every target; any exit before the end replays
    the undo log (the config back, each replica back to what it held) and says what it put back."""
    from pipelines.core.plan import serving_versions  # lazy: protobuf
    from pipelines.core.undo import UndoLog  # lazy: the promotion package
    from pipelines.fleet.fleet import Change  # lazy: tritonclient (~0.5 s)
    from pipelines.promote.failure import signals_held  # lazy: the promotion package

    undo = UndoLog(env.gpu, store.session)  # each replica's before-state and the config's write
    undo.track(name, config, serving_versions(config))
    with fleet_of(settings, env, store, undo) as fleet:
        try:
            fleet.apply(Change(name, None))
        except BaseException as exc:
            with signals_held():  # a second signal cannot cut the way back short
                report = undo.replay(fleet, store)
            if isinstance(exc, MlregError):  # the error says whether the way back worked
                exc.message += (
                    f"; put back: {', '.join(report.restored)}"
                    if report.ok
                    else f"; NOT put back: {'; '.join(report.failed)}"
                )
            raise


def clear_folder(store: Repository, name: str) -> StorageError | None:
    """A retired model's folder gone from the store (so no list shows it): each whole version
    moved to the archive beside the store (never lost; its registered bytes stay in MLflow too),
    one that is not whole (an upload that did not finish) and every other file deleted.  A store
    at a bucket's root has no archive: its versions are deleted, MLflow keeping their bytes.
    Returns, rather than raises, what stopped it: the servers are done by then."""
    from pipelines.storage.archive import archive_of, complete, move_to_archive  # lazy: storage

    try:
        archive: Repository | None = archive_of(store)
    except StorageError:
        archive = None
    try:
        for version in store.list_versions(name):
            if archive is not None and complete(store.versions, name, version) is not None:
                move_to_archive(store, archive, name, version)
            else:
                store.versions.delete_version(name, version)
        for key in store.objects.list_prefix(f"{name}/"):
            store.objects.delete(key)
    except StorageError as exc:
        return StorageError(
            f"{name} is unloaded and its config removed, but its folder is not gone from {store.uri}: "
            f"{exc.message}",
            fix=f"{exc.fix + '; then ' if exc.fix else ''}delete it again: that finishes the move of its "
            "versions to the archive",
            model=name,
        )
    return None


__all__ = ["clear_folder", "ensemble_users", "retire"]
