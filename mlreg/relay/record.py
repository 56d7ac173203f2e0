"""What the relay deployed, per (environment, model), kept in the environment's store -- not in
memory: ``.mlreg-relay.<env>.<model>.json`` at the store's root (a file: Triton reads folders as
models and ignores files there; the ``.mlreg-`` prefix is mlreg's, as the lock and root marker).

    {"environment": "production", "model": "image_model", "deployed": "4", "previous": "3",
     "at": 1796540000.0, "history": [{"version": "4", "previous": "3", "at": ...}, ...]}

``previous`` is the rollback target the MLflow event does not carry: the version that served
before the relay's last deployment.  Every write is conditional (create-if-absent, or replace only
the bytes read): a concurrent writer makes this one re-read and apply its change on top, never
overwrite.  The relay writes it while holding the store lock ``mlreg-relay.<env>.<model>``, which
is also what makes two relays on one environment deploy once (``lock``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlreg.relay.wire import DIGITS
from registry.errors import StorageError

if TYPE_CHECKING:
    from pipelines.storage.base import ObjectStore
    from pipelines.storage.lease import Lease
    from pipelines.storage.session import StoreSession
    from registry.settings import Settings

PREFIX = ".mlreg-relay."
LOCK_PREFIX = "mlreg-relay."
KEEP = 20  # history entries kept
MAX_BYTES = 64 << 10
TRIES = 8


@dataclass
class Deployed:
    environment: str
    model: str
    deployed: str = ""
    previous: str = ""
    at: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "model": self.model,
            "deployed": self.deployed,
            "previous": self.previous,
            "at": self.at,
            "history": self.history,
        }


def key(env: str, model: str) -> str:
    return f"{PREFIX}{env}.{model}.json"


def lock_name(env: str, model: str) -> str:
    return f"{LOCK_PREFIX}{env}.{model}"


def read(store: ObjectStore, env: str, model: str) -> Deployed:
    found = store.read_versioned(key(env, model))
    return Deployed(env, model) if found is None else _parse(env, model, found[0])


def _parse(env: str, model: str, raw: bytes) -> Deployed:
    """The record's bytes, checked (a store is shared: what it holds is input we bound)."""
    try:
        doc = json.loads(raw[: MAX_BYTES + 1].decode()) if len(raw) <= MAX_BYTES else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        doc = None
    if (
        not isinstance(doc, dict)
        or doc.get("environment") != env
        or doc.get("model") != model
        or not all(_version(doc.get(name, "")) for name in ("deployed", "previous"))
    ):
        raise StorageError(
            f"the relay's record {key(env, model)} is not one the relay wrote",
            fix="remove it (the relay writes it again at its next deployment)",
        )
    found = doc.get("history")
    history: list[Any] = found if isinstance(found, list) else []
    at = doc.get("at")
    return Deployed(
        env,
        model,
        doc.get("deployed", ""),
        doc.get("previous", ""),
        float(at) if isinstance(at, int | float) else 0.0,
        [h for h in history if _entry(h)][:KEEP],
    )


def _version(value: object) -> bool:
    """ "" or a version number: what the relay writes (an allow-list; a record is shown and compared)."""
    return isinstance(value, str) and (value == "" or DIGITS.match(value) is not None)


def _entry(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == {"version", "previous", "at"}
        and _version(entry["version"])
        and _version(entry["previous"])
        and isinstance(entry["at"], int | float)
    )


def write(store: ObjectStore, env: str, model: str, version: str, previous: str, at: float) -> Deployed:
    """Record ``version`` as deployed (``previous`` served before it), conditionally."""
    for _ in range(TRIES):
        found = store.read_versioned(key(env, model))
        record = Deployed(env, model) if found is None else _parse(env, model, found[0])
        record.history = [{"version": version, "previous": previous, "at": at}, *record.history][:KEEP]
        record.deployed, record.previous, record.at = version, previous, at
        data = json.dumps(record.to_dict(), sort_keys=True).encode()
        if found is None and store.create(key(env, model), data):
            return record
        if found is not None and store.replace(key(env, model), data, found[1]):
            return record
    raise StorageError(
        f"the relay's record {key(env, model)} changed under every one of {TRIES} writes",
        fix="another writer rewrites it without pause: find it (two relays on one environment take turns)",
    )


@contextmanager
def lock(store: StoreSession, env: str, model: str, settings: Settings | None) -> Iterator[Lease]:
    """The store lock that decides which relay deploys (never waits: StorageError naming the holder)."""
    from pipelines.storage.locking import model_lock  # lazy: the store's lock policy

    with model_lock(store, lock_name(env, model), settings) as lease:
        yield lease


__all__ = ["Deployed", "key", "lock", "lock_name", "read", "write"]
