"""``mlreg status [MODEL] --env E``: the alias, the store's desired versions and what serves.

The query composes four reads, each on its own: the store (``mlreg.ops.status_views``: a client
that gives up within seconds; a store that does not answer leaves the servers' columns as they
are), the servers (``mlreg.ops.status_replicas``: model states, each loaded ensemble's pins; a
replica whose repository index does not answer within ``INDEX_TIMEOUT_S`` is read from its
readiness, the rows marked so), MLflow (``read_aliases``), and the drift rules
(``mlreg.ops.status_rows``).  A part that cannot be reached is drift, said per target.  Every
column speaks one numbering, MLflow's versions; the Triton folders they serve from come beside
them.  A row is a ``ModelRow``; its ``to_dict()`` is the row of ``mlreg status --json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlreg.ops.context import context
from mlreg.ops.status_replicas import (
    KNOWN_VERSIONS,
    Known,
    aliased_models,
    bounded_connector,
    probe_targets,
    read_aliases,
    readiness_note,
    readiness_read,
    ready_outside_index,
    served_models,
    store_silent,
)
from mlreg.ops.status_rows import ModelRow, model_row
from mlreg.ops.status_views import STORE_FIX, listed_models, read_views, status_store, views_with_config
from pipelines.fleet.replicas import open_control
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.storage.base import Repository
from registry.errors import MlregError, StorageError
from registry.ports import RegistryReader, RegistryView
from registry.settings import Settings


@dataclass
class StatusReport:
    environment: str
    models: list[ModelRow]
    locks: list[dict[str, Any]] = field(default_factory=list)  # the store's, with leases
    store_error: str = ""  # why the store could not be read ("": it was); the rows say what serves
    store_fix: str = ""
    open_control: list[str] = field(default_factory=list)  # replicas anyone can drive
    readiness: str = ""  # which replicas were read from their readiness (their index did not answer), why
    unreachable: dict[str, str] = field(default_factory=dict)  # url -> why it cannot say

    @property
    def drift(self) -> bool:
        return bool(self.store_error or self.readiness) or any(row.drift for row in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "drift": self.drift,
            "models": [row.to_dict() for row in self.models],
            "locks": self.locks,
            "store_error": self.store_error,
            "store_fix": self.store_fix,
            "open_control": self.open_control,
            "readiness": self.readiness,
            "unreachable": self.unreachable,
        }


def status(settings: Settings, env_name: str, model: str | None = None) -> StatusReport:
    """The alias, the store's desired versions and what each target serves, per model; drift flagged.
    A store that does not answer within seconds leaves what the targets serve, and says why; a
    replica whose repository index does not answer is read from its readiness, and said so."""
    ctx = context(settings, env_name)
    found = environment_status(settings, ctx.env, ctx.registry, [model] if model else None)
    return StatusReport(
        env_name,
        found.rows,
        found.locks,
        found.store_error,
        found.store_fix,
        found.open_control,
        found.readiness,
        found.unreachable,
    )


def model_status(
    settings: Settings, env: Environment, registry: RegistryView, models: list[str] | None = None
) -> list[ModelRow]:
    """One row per model: the alias, the store's desired versions and what each target serves, as
    registered (MLflow) versions, with the Triton folders beside them; drift flagged."""
    return _model_rows(settings, env, registry, status_store(env.store), models)[0]


@dataclass
class EnvironmentStatus:
    """`mlreg status`: the rows, the store's locks, and why the store could not be read."""

    rows: list[ModelRow]
    locks: list[dict[str, Any]] = field(default_factory=list)  # the store's, with leases
    store_error: str = ""  # "": the store answered; else the rows' store columns are unknown
    store_fix: str = ""
    open_control: list[str] = field(default_factory=list)  # replicas whose control API takes anyone's calls
    readiness: str = ""  # "": every replica answered its index; else which were read from readiness, why
    unreachable: dict[str, str] = field(default_factory=dict)  # url -> why it cannot say what it serves


def environment_status(
    settings: Settings, env: Environment, registry: RegistryView, models: list[str] | None = None
) -> EnvironmentStatus:
    """``model_status`` and the store's locks; a store that does not answer within seconds leaves
    what the servers serve in the rows, and says why with a fix (the locks are then unknown)."""
    store = status_store(env.store)
    rows, why, read, lost = _model_rows(settings, env, registry, store, models)
    opened = _open_control(settings, env)
    if not why:
        try:
            found = store.session.locks()
        except StorageError as exc:
            why = exc.message
        else:
            locks = [lock.to_dict() for lock in found if not models or lock.model in models]
            note = readiness_note(str(env.store), read, "")
            return EnvironmentStatus(rows, locks, open_control=opened, readiness=note, unreachable=lost)
    note = readiness_note(str(env.store), read, why)
    return EnvironmentStatus(rows, [], why, STORE_FIX.format(uri=env.store), opened, note, lost)


def _open_control(settings: Settings, env: Environment) -> list[str]:
    try:
        targets = resolve_targets(settings, env)
    except MlregError:
        return []  # the rows say why
    return open_control(targets, min(5.0, settings.triton_timeout))


def _model_rows(
    settings: Settings,
    env: Environment,
    registry: RegistryView,
    store: Repository,
    models: list[str] | None,
) -> tuple[list[ModelRow], str, list[str], dict[str, str]]:
    """The rows, why the store could not be read ("" when it could), the targets read from
    their readiness (their repository index did not answer), and those that cannot say (why)."""
    names, why = (list(models), "") if models else listed_models(store)
    views, why = read_views(store, names, why)
    ensembles = None if why else [m for m in names if views[m].is_ensemble]
    known = _known(registry.models, env, names)
    live, live_pins = probe_targets(settings, env, store, ensembles, known, store_silent(why))
    if not models:  # what serves and what the alias names, though the store lost it, is drift too
        names = sorted(set(names) | served_models(live) | aliased_models(registry.models, env.alias))
        more, why = read_views(store, [m for m in names if m not in views], why)
        views.update(more)
    aliases, mlflow_error = read_aliases(registry.models, names, env.alias)
    lost = {m: a for m, a in aliases.items() if a and m not in views_with_config(views)}
    if lost:  # served, though the store lost its folder: asked by name
        ready_outside_index(bounded_connector(settings, env), live, lost, live_pins)
    rows = [
        model_row(env, registry, store, model, views[model], aliases[model], live, live_pins, mlflow_error)
        for model in names
    ]
    return rows, why, readiness_read(live), {u: s for u, s in live.items() if isinstance(s, str)}


def _known(registry: RegistryReader, env: Environment, names: list[str]) -> Known:
    """The models (and versions) a replica read without its index is asked about by name: those
    listed or given, and each version the environment's alias names (MLflow's, when it answers)."""

    def known() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {name: set() for name in names}
        try:
            named = registry.alias_versions(env.alias)
        except MlregError:
            named = {}
        for model, version in named.items():
            found.setdefault(model, set()).add(str(version))
        for model, versions in found.items():  # a re-pointed ensemble serves an older folder
            try:
                registered = sorted((str(v.version) for v in registry.versions(model)), key=int)
            except (MlregError, ValueError):
                continue
            versions.update(registered[-KNOWN_VERSIONS:])
        return found

    return known


__all__ = ["EnvironmentStatus", "ModelRow", "StatusReport", "environment_status", "model_status", "status"]
