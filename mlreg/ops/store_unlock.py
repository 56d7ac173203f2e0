"""``mlreg store unlock``: remove a lock its holder left (a crashed or cut-off promotion).

Refused while the holder's lease is alive, judged by the store's clock (the lock's LastModified
plus its lease), unless ``force`` names the holder the lock names: another's lock stays
(``pipelines.storage.lease.remove_lock``).  The lock policy of the verbs that take locks is
:mod:`pipelines.storage.locking`; this is the one verb that removes another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import store_of
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.storage.lease import LockInfo


@dataclass
class UnlockReport:
    store: str
    model: str
    unlocked: LockInfo
    forced: bool

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "unlocked": self.unlocked.to_dict(), "forced": self.forced}

    def line(self) -> str:
        return f"{self.store}: removed the lock of '{self.model}' held by {self.unlocked.describe()}"


def store_unlock(
    settings: Settings, model: str, store: str | None = None, env_name: str | None = None, force: str = ""
) -> UnlockReport:
    """Remove ``model``'s lock from ``--store`` or ``--env``'s store (default: the local one)."""
    target = store_of(settings, store, env_name)
    held = target.session.unlock(model, force)
    return UnlockReport(target.uri, model, held, bool(force))


__all__ = ["UnlockReport", "store_unlock"]
