"""``mlreg relay register`` and ``mlreg relay status``.

``register`` creates the MLflow webhook named ``mlreg-relay`` (or updates the one of that name:
its URL, events and secret) through MLflow's own API.  MLflow 3.17 only sends to ``https`` unless
the *server* runs with ``MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https``, refuses private and loopback
addresses unless it runs with ``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true``, caches its webhook list 60 s
(``MLFLOW_WEBHOOK_CACHE_TTL``), and encrypts secrets with ``MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY``
(without it each server process makes its own key: a restarted server cannot read the secret).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlreg.relay.config import RelayConfig, load
from mlreg.relay.wire import EVENT_NAME
from registry.errors import RegistryError, UsageError

if TYPE_CHECKING:
    from mlreg.relay.core import Relay
    from registry.settings import Settings

WEBHOOK_NAME = "mlreg-relay"
MAX_PAGES = 50


@dataclass
class Registered:
    action: str  # "created" | "updated"
    webhook_id: str
    url: str
    events: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "webhook_id": self.webhook_id,
            "url": self.url,
            "events": self.events,
            "name": WEBHOOK_NAME,
        }


def register(settings: Settings, url: str, config: RelayConfig | None = None) -> Registered:
    """Create or update the webhook ``mlreg-relay`` to POST alias moves to ``url`` with the relay's secret."""
    if not url.startswith(("https://", "http://")) or len(url) > 500:
        raise UsageError(
            f"webhook URL {url!r} is not an http(s) URL",
            fix="pass the relay's URL, e.g. https://relay.example/webhook",
        )
    config = config or load(settings)
    secret = config.secret().decode()
    from mlreg.ops.context import open_registry  # lazy: MLflow (~1 s)

    client = open_registry(settings).connection.client
    try:
        found = _find(client)
        events = [EVENT_NAME]
        if found is None:
            hook = client.create_webhook(
                name=WEBHOOK_NAME,
                url=url,
                events=events,
                secret=secret,
                description="mlreg relay: environments follow aliases",
            )
            return Registered("created", str(hook.webhook_id), url, events)
        hook = client.update_webhook(found.webhook_id, url=url, events=events, secret=secret, status="ACTIVE")
        return Registered("updated", str(hook.webhook_id), url, events)
    except Exception as exc:  # MLflow's errors (RestException, MlflowException): named, never the secret
        message = str(exc).replace(secret, "[secret]")[:500]
        raise RegistryError(
            f"MLflow refused the webhook: {message}",
            fix="a loopback or private URL needs the MLflow server started with "
            "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true, http needs MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https; "
            "set MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY on the server",
        ) from None


def _find(client: Any) -> Any:
    token = None
    for _ in range(MAX_PAGES):
        page = client.list_webhooks(max_results=100, page_token=token)
        for hook in page:
            if hook.name == WEBHOOK_NAME:
                return hook
        token = page.token
        if not token:
            return None
    return None


def status(relay: Relay, read_serving: bool = True) -> dict[str, Any]:
    """Each followed alias and what its environment serves, the record, the last event, the last
    reconcile and the queue."""
    from mlreg.relay import record  # lazy: the store's record reader

    environments = []
    for env, alias in sorted(relay.config.follows.items()):
        entry: dict[str, Any] = {
            "environment": env,
            "follows": alias,
            "action": relay.config.target(env).action,
            "models": [],
        }
        try:
            holders = relay.aliases.holders(alias)
        except Exception as exc:
            entry["error"] = str(exc)[:300]
            holders = {}
        for model, version in sorted(holders.items()):
            row: dict[str, Any] = {"model": model, "alias": version}
            if read_serving:
                row["serving"] = _quiet(lambda e=env, m=model: relay.deployer_for(e).serving(e, m))
            deployed = _quiet(lambda e=env, m=model: record.read(relay.store_for(e).objects, e, m).to_dict())
            row["recorded"] = deployed
            entry["models"].append(row)
        environments.append(entry)
    mark = relay.queue.read_mark("reconcile")
    return {
        "environments": environments,
        "last_event": relay.queue.last_event(),
        "last_reconcile": json.loads(mark[0]) if mark else None,
        "queue": relay.queue.counts(),
        "jobs": relay.queue.recent_jobs(10),
    }


def _quiet(read: Any) -> Any:
    try:
        return read()
    except Exception as exc:
        return {"error": str(getattr(exc, "message", exc))[:300]}


__all__ = ["WEBHOOK_NAME", "Registered", "register", "status"]
