"""`mlreg status` and `mlreg history`: registry alias vs the store's desired state vs what serves."""

from __future__ import annotations

from typing import Any

from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.plan import ensemble_pins, serving_versions
from pipelines.storage import open_store
from pipelines.triton import TritonControl
from registry.errors import MlregError
from registry.mlflow_registry import MlflowRegistry
from registry.settings import Settings


def model_status(  # noqa: C901 - split by the architecture issue
    settings: Settings, env: Environment, registry: MlflowRegistry, models: list[str] | None = None
) -> list[dict[str, Any]]:
    store = open_store(env.store)
    names = models or store.list_models()
    try:
        targets = resolve_targets(settings, env)
    except MlregError:
        targets = ()
    live: dict[str, dict[str, dict[str, str]] | str] = {}
    for url in targets:
        try:
            with TritonControl(url, timeout=5) as triton:
                live[url] = triton.model_states()
        except MlregError as exc:
            live[url] = f"unreachable: {exc.message}"
    rows = []
    for model in names:
        config = store.read_config(model) or ""
        desired = serving_versions(config)
        try:
            alias = registry.aliases(model).get(env.alias, "")
        except MlregError:
            alias = ""
        serving: dict[str, Any] = {}
        for url, states in live.items():
            serving[url] = (
                states
                if isinstance(states, str)
                else sorted((v for v, s in states.get(model, {}).items() if s == "READY"), key=int)
            )
        drift = []
        if 'platform: "ensemble"' in config:
            # an ensemble's Triton folder keeps its number when it is re-pointed; its registered
            # version changes: compare the member versions the alias's version pins instead
            if alias:
                drift.extend(_pin_drift(registry, model, alias, env.alias, config))
        elif alias and desired and desired != [alias]:
            drift.append(f"alias {env.alias}=v{alias} but the store serves v{','.join(desired)}")
        for url, versions in serving.items():
            if isinstance(versions, list) and versions != desired:
                drift.append(
                    f"{url} serves v{','.join(versions) or 'nothing'}, "
                    f"store wants v{','.join(desired) or 'nothing'}"
                )
            elif isinstance(versions, str):
                drift.append(f"{url} {versions}")
        row: dict[str, Any] = {
            "model": model,
            "alias": alias,
            "desired": desired,
            "serving": serving,
            "drift": drift,
        }
        if 'platform: "ensemble"' in config:
            row["pins"] = ensemble_pins(config)  # its alias names a registered version, not a folder
        rows.append(row)
    return rows


def _pin_drift(registry: MlflowRegistry, model: str, version: str, alias: str, config: str) -> list[str]:
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
