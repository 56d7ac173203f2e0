"""`mlreg status` and `mlreg history`: registry alias vs the store's desired state vs what serves.

``model_status`` composes four reads, each on its own: the store (``read_store``), the servers
(``probe_targets``: model states and each loaded ensemble's pins), MLflow (``read_aliases``),
and the drift rules (``drift``).  A part that cannot be reached is drift, said per target,
within the configured timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.fanout import Fleet, ready_versions, triton_connector
from pipelines.promote.plan import config_facts, ensemble_pins, serving_versions
from pipelines.promote.ports import Registry
from pipelines.storage import open_store
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError
from registry.mlflow_registry import MlflowRegistry
from registry.settings import Settings

Serving = dict[str, list[str] | str]  # url -> READY versions, or why the target cannot say


@dataclass
class StoreView:
    """One model as the store holds it."""

    config: str | None
    desired: list[str]  # the versions its config serves
    missing: list[str]  # of those, versions with no folder in the store

    @property
    def is_ensemble(self) -> bool:
        return self.config is not None and config_facts(self.config).is_ensemble


def read_store(store: RepositoryStore, names: list[str]) -> dict[str, StoreView]:
    views = {}
    for model in names:
        config = store.read_config(model)
        desired = serving_versions(config)
        present = set(store.list_versions(model)) if desired else set()
        views[model] = StoreView(config, desired, [v for v in desired if v not in present])
    return views


Pins = dict[str, dict[str, dict[str, str]]]  # url -> ensemble -> member -> version pinned there


def probe_targets(
    settings: Settings, env: Environment, store: RepositoryStore, ensembles: Sequence[str] = ()
) -> tuple[dict[str, Any], Pins]:
    """url -> model states, or the reason the target cannot be asked (a string); and, over the
    same connections, the member versions each READY ensemble of ``ensembles`` pins there."""
    try:
        targets = resolve_targets(settings, env)
    except MlregError as exc:
        return {"local stack" if env.local_stack else "(no target)": f"unreachable: {exc.message}"}, {}
    with Fleet(store, targets, triton_connector(settings), settings.triton_timeout) as fleet:
        live = {
            url: f"unreachable: {found.message}" if isinstance(found, MlregError) else found
            for url, found in fleet.states().items()
        }
        return live, _live_pins(fleet, live, ensembles)


def _live_pins(fleet: Fleet, live: dict[str, Any], ensembles: Sequence[str]) -> Pins:
    """What each ensemble loaded on a reachable target pins (-1: the latest), probed in parallel;
    a target that stops answering meanwhile is left out (its states already say so)."""

    def probe(url: str) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        for model in (m for m in ensembles if ready_versions(live[url], m)):
            try:
                config = fleet.target(url).model_config(model)
            except MlregError:
                break
            steps = config.get("ensemble_scheduling", {}).get("step", [])
            found[model] = {s["model_name"]: str(int(s.get("model_version", -1))) for s in steps}
        return found

    urls = [url for url, states in live.items() if not isinstance(states, str)]
    if not urls or not ensembles:
        return {}
    with ThreadPoolExecutor(max(1, min(16, len(urls)))) as pool:
        return dict(zip(urls, pool.map(probe, urls), strict=True))


def pin_drift(stored: dict[str, str], live: Pins, model: str) -> list[str]:
    """Each target whose loaded ensemble pins a member to another version than the store's config."""
    found: list[str] = []
    for url, ensembles in live.items():
        pins = ensembles.get(model)
        if pins is None:
            continue
        found.extend(
            f"{url} pins {member} v{version}, the store's config pins v{stored.get(member, 'nothing')}"
            for member, version in sorted(pins.items())
            if stored.get(member) != version
        )
    return found


def read_aliases(
    settings: Settings, registry: Registry, names: list[str], alias: str
) -> tuple[dict[str, str], str]:
    """model -> the version ``alias`` names ("" when none), and why MLflow could not be asked."""
    from registry import mlflow_rest

    if registry.uri.startswith(("http://", "https://")):
        try:
            mlflow_rest.ping(registry.uri, settings.mlflow_timeout)
        except MlregError as exc:
            return dict.fromkeys(names, ""), exc.message
    found = {}
    for model in names:
        try:
            found[model] = registry.aliases(model).get(alias, "")
        except MlregError:
            found[model] = ""  # not registered (yet)
    return found, ""


def drift(
    registry: Registry, env_alias: str, view: StoreView, alias: str, serving: Serving, model: str
) -> list[str]:
    """What disagrees: the alias and the store, the store and its own folders, the store and each target."""
    found: list[str] = []
    if view.is_ensemble:
        # an ensemble's Triton folder keeps its number when it is re-pointed; its registered
        # version changes: compare the member versions the alias's version pins instead
        if alias:
            assert view.config is not None
            found.extend(_pin_drift(registry, model, alias, env_alias, view.config))
    elif alias and view.desired and view.desired != [alias]:
        found.append(f"alias {env_alias}=v{alias} but the store serves v{','.join(view.desired)}")
    found.extend(
        f"the store has no folder {model}/{v}/ for the version its config serves" for v in view.missing
    )
    for url, versions in serving.items():
        if isinstance(versions, str):
            found.append(f"{url} {versions}")
        elif versions != view.desired:
            found.append(
                f"{url} serves v{','.join(versions) or 'nothing'}, "
                f"store wants v{','.join(view.desired) or 'nothing'}"
            )
    return found


def model_status(
    settings: Settings, env: Environment, registry: Registry, models: list[str] | None = None
) -> list[dict[str, Any]]:
    store = open_store(env.store)
    names = models or store.list_models()
    views = read_store(store, names)
    live, live_pins = probe_targets(settings, env, store, [m for m in names if views[m].is_ensemble])
    aliases, mlflow_error = read_aliases(settings, registry, names, env.alias)
    rows = []
    for model in names:
        view = views[model]
        serving: Serving = {
            url: states if isinstance(states, str) else ready_versions(states, model)
            for url, states in live.items()
        }
        row: dict[str, Any] = {
            "model": model,
            "alias": aliases[model],
            "desired": view.desired,
            "serving": serving,
            "drift": drift(registry, env.alias, view, aliases[model], serving, model)
            + ([f"MLflow unreachable: {mlflow_error}"] if mlflow_error else []),
        }
        if view.is_ensemble:
            assert view.config is not None
            row["pins"] = ensemble_pins(view.config)  # its alias names a registered version, not a folder
            row["target_pins"] = {u: p[model] for u, p in live_pins.items() if model in p}
            row["drift"].extend(pin_drift(row["pins"], live_pins, model))
        rows.append(row)
    return rows


def _pin_drift(registry: Registry, model: str, version: str, alias: str, config: str) -> list[str]:
    try:
        tags = registry.version(model, version).tags or {}
    except MlregError as exc:
        return [f"alias {alias}=v{version} cannot be read: {exc.message}"]
    pins = ensemble_pins(config)
    drift = []
    for key, wanted in sorted(tags.items()):
        member = key.removeprefix("member_")
        stored = pins.get(member)
        if key.startswith("member_") and stored is not None and int(stored) > 0 and stored != wanted:
            drift.append(
                f"alias {alias}=v{version} pins {member} v{wanted}, the store's config pins v{stored}"
            )
    return drift


def history(registry: MlflowRegistry, model: str, env: str | None) -> list[dict[str, Any]]:
    from pipelines.promote.runner import PROMOTIONS_EXPERIMENT

    query = f"tags.mlreg_model = '{model}'" + (f" and tags.environment = '{env}'" if env else "")
    exp = registry.experiment_id(PROMOTIONS_EXPERIMENT)
    runs = registry._call(
        "history",
        lambda: registry.client.search_runs(
            [exp], filter_string=query, order_by=["attributes.start_time DESC"], max_results=500
        ),
    )
    return [
        {
            "when": run.info.start_time,
            "environment": run.data.tags.get("environment"),
            "from": run.data.params.get("from_version"),
            "to": run.data.params.get("to_version"),
            "result": run.data.tags.get("result"),
            "user": run.data.tags.get("user"),
            "run_id": run.info.run_id,
        }
        for run in runs
    ]


def previous_version(registry: MlflowRegistry, model: str, env: str) -> str | None:
    """The version promoted in ``env`` before the current one (what `mlreg rollback` returns to)."""
    done = [h for h in history(registry, model, env) if h["result"] == "promoted"]
    return str(done[1]["to"]) if len(done) > 1 else None
