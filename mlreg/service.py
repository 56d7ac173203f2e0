"""The application's operations on an environment: promote, rollback, status, history, retire, predict.

The CLI (``mlreg/cli/promote.py``) and the MLflow deployments plugin (``mlreg/deployments.py``)
both call these; each composes the registry (MLflow) with the pipelines (store, servers) and
returns a typed result that the caller renders.  Failures are ``MlregError``s; a failed promotion
is a ``PromotionFailed`` whose ``result`` holds the plan, the stage reports and what was undone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from registry.errors import MlregError, PromotionError, StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    import numpy as np

    from pipelines.promote.environments import Environment
    from pipelines.promote.fanout import Fleet
    from pipelines.promote.reports import PromotionResult
    from pipelines.promote.retention import RetentionReport
    from pipelines.promote.runner import OnStage
    from pipelines.storage.base import RepositoryStore
    from registry.mlflow import MlflowRegistry

SERVE_AS = ("auto", "native", "onnx")


@dataclass
class Context:
    settings: Settings
    env: Environment
    registry: MlflowRegistry


def environment(settings: Settings, name: str) -> Environment:
    """The environment ``name`` of the project; ``local`` targets every replica of the running
    local stack (none while it is down: the promotion then says to start it)."""
    from pipelines.promote.environments import environment as configured

    env = configured(settings, name)
    if not env.local_stack:
        return env
    from pipelines.devstack.stack import running_servers

    servers = running_servers(settings)  # `stack up --replicas N`
    urls = tuple(info.grpc_url for info in servers)
    metrics = tuple((info.grpc_url, info.metrics_url) for info in servers)
    return dataclasses.replace(env, targets=urls, metrics_urls=metrics)


def context(settings: Settings, env_name: str) -> Context:
    from registry.mlflow import MlflowRegistry

    return Context(settings, environment(settings, env_name), MlflowRegistry(settings))


def promote(
    settings: Settings,
    env_name: str,
    model: str,
    version: str,
    *,
    dry_run: bool = False,
    allow_breaking: bool = False,
    skip_quality: bool = False,
    serve_as: str = "auto",
    on_stage: OnStage | None = None,
    skip_perf: bool = False,
    no_way_back: bool = False,
    skip_shadow: bool = False,
) -> PromotionResult:
    """Promote ``model`` ``version`` to the environment (a PromotionFailed when it cannot)."""
    from pipelines.devstack.scratch import scratch_servers
    from pipelines.promote.runner import Options, Promotion

    if serve_as not in SERVE_AS:
        raise UsageError(f"unknown --serve-as '{serve_as}'", fix=f"use {', '.join(SERVE_AS)}")
    if not version.isdigit():
        raise UsageError(f"version '{version}' is not a number", fix="pass --version N (1, 2, 3, ...)")
    ctx = context(settings, env_name)
    options = Options(
        dry_run,
        allow_breaking,
        skip_quality,
        serve_as,
        on_stage,
        skip_perf=skip_perf,
        no_way_back=no_way_back,
        skip_shadow=skip_shadow,
    )
    promotion = Promotion(
        settings, ctx.env, ctx.registry, options, scratch=scratch_servers(settings, ctx.env.key(settings))
    )
    return promotion.run(model, version)


def rollback(
    settings: Settings,
    env_name: str,
    model: str,
    to_version: str | None = None,
    *,
    dry_run: bool = False,
    on_stage: OnStage | None = None,
) -> PromotionResult:
    """Serve an earlier version again: a promotion without the quality gate (breaking allowed).
    Without ``to_version``: the newest version promoted in the environment that is not the one
    serving now (a UsageError when there is none)."""
    if to_version is None:
        to_version = _rollback_version(settings, env_name, model)
    return promote(
        settings,
        env_name,
        model,
        to_version,
        dry_run=dry_run,
        allow_breaking=True,
        skip_quality=True,
        on_stage=on_stage,
    )


def _rollback_version(settings: Settings, env_name: str, model: str) -> str:
    from pipelines.promote.status import rollback_target

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


@dataclass
class StatusReport:
    environment: str
    models: list[dict[str, Any]]
    locks: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the store's, with leases
    store_error: str = ""  # why the store could not be read ("": it was); the rows say what serves
    store_fix: str = ""
    open_control: list[str] = dataclasses.field(default_factory=list)  # replicas anyone can drive

    @property
    def drift(self) -> bool:
        return bool(self.store_error) or any(row["drift"] for row in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "drift": self.drift,
            "models": self.models,
            "locks": self.locks,
            "store_error": self.store_error,
            "store_fix": self.store_fix,
            "open_control": self.open_control,
        }


def status(settings: Settings, env_name: str, model: str | None = None) -> StatusReport:
    """The alias, the store's desired versions and what each target serves, per model; drift flagged.
    A store that does not answer within seconds leaves what the targets serve, and says why."""
    from pipelines.promote.status import environment_status

    ctx = context(settings, env_name)
    found = environment_status(settings, ctx.env, ctx.registry, [model] if model else None)
    return StatusReport(
        env_name, found.rows, found.locks, found.store_error, found.store_fix, found.open_control
    )


def store_of(settings: Settings, store: str | None, env_name: str | None) -> RepositoryStore:
    """``--store URI``, else the store of ``--env``, else the local repository."""
    from pipelines.promote.environments import environment as configured
    from pipelines.storage import open_store

    if store and env_name:
        raise UsageError("--store and --env name the store twice", fix="pass one of them")
    uri = configured(settings, env_name).store if env_name else (store or settings.local_repository)
    return open_store(uri, digest_cache=settings.digest_cache)


def history(settings: Settings, model: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (newest first); an unknown model is an error."""
    from pipelines.promote.status import history as promotions

    registry = context(settings, env_name or "local").registry
    rows = promotions(registry, model, env_name)
    if not rows:
        registry.require_model(model)
    return rows


def _fleet(settings: Settings, env: Environment, store: RepositoryStore | None = None) -> Fleet:
    """The environment's targets (the local stack's must be running) and its store."""
    from pipelines.promote.environments import resolve_targets
    from pipelines.promote.fanout import Fleet
    from pipelines.promote.replicas import triton_connector
    from pipelines.storage import open_store

    targets = resolve_targets(settings, env)
    connect = triton_connector(settings, env.key(settings), env.load_deadline(settings))
    return Fleet(store or open_store(env.store), targets, connect, env.load_deadline(settings))


def _ensemble_users(store: RepositoryStore, name: str) -> list[str]:
    """The ensembles in ``store`` whose steps name ``name``."""
    from pipelines.promote.plan import ensemble_pins

    return [
        other
        for other in store.list_models()
        if 'platform: "ensemble"' in (text := store.read_config(other) or "") and name in ensemble_pins(text)
    ]


def retire(settings: Settings, env_name: str, name: str) -> None:
    """Unload ``name`` from every target of the environment and remove its desired state (its
    config.pbtxt), then its folder (:func:`_clear_folder`: its versions to the store's archive),
    then its alias; refused while an ensemble there uses it.  Any exit before the servers are done
    -- a target that fails to unload, an interrupt -- replays the undo log: the config back in the
    store, each replica back to what it held.  A folder left by a retire that stopped after the
    unload is cleared by the next one."""
    from pipelines.storage import open_store

    ctx = context(settings, env_name)
    env = ctx.env
    store = open_store(env.store)
    config = store.read_config(name)
    if config is None and not store.list_prefix(f"{name}/"):
        raise PromotionError(
            f"{name} is not deployed in '{env.name}' ({env.store} has no {name}/config.pbtxt)",
            fix=f"see 'mlflow deployments list -t mlreg:/{env.name}'",
        )
    users = _ensemble_users(store, name)
    if users:
        raise PromotionError(
            f"{name} is used by ensemble(s) {', '.join(users)} in '{env.name}'; retiring it would break them",
            fix="retire the ensemble first, or promote an ensemble version that does not use it",
        )
    with store.lock(name, wait=0):
        if config is not None:  # None: unloaded by a retire that stopped before its folder was gone
            _unload_everywhere(settings, env, store, name, config)
        unfinished = _clear_folder(store, name)
    with contextlib.suppress(MlregError):  # the servers are done; the registry's record is best effort
        if env.alias in ctx.registry.aliases(name):
            ctx.registry.delete_alias(name, env.alias)
        ctx.registry.forget_deployment(name, env.name)
    if unfinished is not None:
        raise unfinished


def _unload_everywhere(
    settings: Settings, env: Environment, store: RepositoryStore, name: str, config: str
) -> None:
    """The config deleted, then ``name`` unloaded on every target; any exit before the end replays
    the undo log (the config back, each replica back to what it held) and says what it put back."""
    from pipelines.promote.failure import signals_held
    from pipelines.promote.fanout import Change
    from pipelines.promote.plan import serving_versions
    from pipelines.promote.undo import UndoLog

    with _fleet(settings, env, store) as fleet:
        undo = UndoLog(env.gpu)
        undo.track(name, config, serving_versions(config))
        fleet.on_touch = undo.touched  # each replica's before-state, at its first touch
        undo.wrote_config_of(name)
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


def _clear_folder(store: RepositoryStore, name: str) -> StorageError | None:
    """A retired model's folder gone from the store (so no list shows it): each whole version
    moved to the archive beside the store (never lost; its registered bytes stay in MLflow too),
    one that is not whole (an upload that did not finish) and every other file deleted.  A store
    at a bucket's root has no archive: its versions are deleted, MLflow keeping their bytes.
    Returns, rather than raises, what stopped it: the servers are done by then."""
    from pipelines.storage.archive import archive_of, complete, move_to_archive

    try:
        archive: RepositoryStore | None = archive_of(store)
    except StorageError:
        archive = None
    try:
        for version in store.list_versions(name):
            if archive is not None and complete(store, name, version) is not None:
                move_to_archive(store, archive, name, version)
            else:
                store.delete_version(name, version)
        for key in store.list_prefix(f"{name}/"):
            store.delete(key)
    except StorageError as exc:
        return StorageError(
            f"{name} is unloaded and its config removed, but its folder is not gone from {store.uri}: "
            f"{exc.message}",
            fix=f"{exc.fix + '; then ' if exc.fix else ''}delete it again: that finishes the move of its "
            "versions to the archive",
            model=name,
        )
    return None


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
    target asked; the local environment with its stack down serves nothing)."""
    from pipelines.promote.retention import collect, registry_stamp
    from pipelines.storage import open_store

    ctx = context(settings, env_name)
    env = ctx.env
    store = open_store(env.store, digest_cache=settings.digest_cache)
    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: a number of versions cannot be negative", fix="pass --keep 2")

    def ask() -> dict[str, Any]:
        if env.local_stack and not env.targets:
            return {}
        with _fleet(settings, env, store) as fleet:
            return dict(fleet.states())

    window = env.keep if keep is None else keep
    stamp = registry_stamp(ctx.registry, env.name)
    try:
        report = collect(store, ask, stamp, window, dry_run=dry_run, models=models)
    except MlregError as exc:  # an outage: each lock it could not release named
        exc.message += "".join(f"; {note}" for note in store.lock_notes)
        raise
    report.failed.extend(f"lock not released: {note}" for note in store.lock_notes)
    return report


def predict(settings: Settings, env_name: str, name: str, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Send ``inputs`` (input name -> array-like) to ``name`` on the environment's first target,
    checked against the config the store serves (names, dtypes: a UsageError naming the valid
    inputs) and cast to its dtypes; one item gets the batch dimension added."""
    from pipelines.storage import open_store
    from registry.contracts.config import parse_config

    env = environment(settings, env_name)
    text = open_store(env.store).read_config(name)
    if text is None:
        raise PromotionError(f"{name} is not deployed in '{env.name}'", fix="create the deployment first")
    config = parse_config(text)
    arrays = _typed(config, inputs, f"{name} in '{env.name}'")
    outputs = [t.name for t in config.output]
    with _fleet(settings, env) as fleet:
        return fleet.target(fleet.urls[0]).infer(name, arrays, outputs)


def _typed(config: Any, inputs: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """``inputs`` as arrays of the config's dtypes (a batching model's single item: batch of one);
    an unknown or missing input, or values of another kind than the input's, is a UsageError."""
    tensors = {t.name: t for t in config.input}
    valid = ", ".join(f"{t.name} {_describe(config, t)}" for t in config.input)
    unknown = sorted(str(key) for key in inputs if str(key) not in tensors)
    if unknown:
        raise UsageError(
            f"{where} has no input {', '.join(map(repr, unknown))}; its inputs: {valid}",
            fix="name the columns (or dict keys) after the model's inputs",
        )
    missing = [t.name for t in config.input if t.name not in inputs and not t.optional]
    if missing:
        raise UsageError(
            f"{where} needs input {', '.join(map(repr, missing))}, not sent; its inputs: {valid}",
            fix="send every input the model's config declares",
        )
    return {str(key): _cast(config, tensors[str(key)], value, where) for key, value in inputs.items()}


def _describe(config: Any, tensor: Any) -> str:
    """``TYPE_FP32 [-1,3]``: an input's type and shape as its config declares them."""
    from registry.contracts.config import data_type_name, full_shape

    shape = ",".join(map(str, full_shape(config, list(tensor.dims))))
    return f"TYPE_{data_type_name(tensor.data_type)} [{shape}]"


def _cast(config: Any, tensor: Any, value: Any, where: str) -> np.ndarray:
    """``value`` as an array of ``tensor``'s dtype: strings for a number or a bool, numbers that do
    not fit (1.5 or 300 for an INT8) and ragged rows are refused, naming the input."""
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    from registry.contracts.config import data_type_name

    triton_type = data_type_name(tensor.data_type)
    wanted = np.dtype(triton_to_np_dtype("BYTES" if triton_type == "STRING" else triton_type))

    def refuse(what: str) -> UsageError:
        return UsageError(
            f"input '{tensor.name}' of {where} is {_describe(config, tensor)}, but {what}",
            fix=f"send {'numbers' if wanted.kind != 'b' else 'true/false'} for '{tensor.name}' "
            f"(dims {list(tensor.dims)} per item)",
        )

    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise refuse(f"its values do not form an array (rows of different lengths?): {exc}") from exc
    if wanted.kind != "O":
        text = (v for v in array.flat if isinstance(v, (str, bytes))) if array.dtype.kind in "USO" else ()
        first = next(iter(text), None)  # np.str_ and np.bytes_ are str and bytes
        if first is not None:
            raise refuse(f"the values sent are strings (e.g. {str(first)!r})")
        try:
            with np.errstate(all="ignore"):
                cast = array.astype(wanted)
        except (ValueError, TypeError) as exc:
            raise refuse(f"the values sent cannot be {wanted.name}: {exc}") from exc
        if wanted.kind in "biu" and not np.array_equal(cast, array):
            raise refuse(f"the values sent do not fit {wanted.name} (e.g. fractions or out of range)")
        array = cast
    else:
        array = array.astype(wanted)
    if config.max_batch_size > 0 and array.ndim == len(tensor.dims):
        array = array[None, ...]  # one item: add the batch dim
    return array


__all__ = [
    "StatusReport",
    "environment",
    "history",
    "predict",
    "promote",
    "retire",
    "rollback",
    "status",
    "store_gc",
]
