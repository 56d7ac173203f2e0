"""``mlreg store push``: upload model folders (or a whole repository) as versioned folders.

Every version folder goes up with a sha256 manifest; unchanged files are not sent again.  A stored
version is written once: one the store holds with other bytes is refused (naming each file), the
same bytes are a no-op (:mod:`pipelines.storage.push`).  Each model's lock is held while it is
pushed, with the lease the lock policy gives (:func:`pipelines.storage.locking.lease_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import open_store
from pipelines.storage.locking import lease_of
from pipelines.storage.push import push_path
from registry.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipelines.storage.base import RepositoryStore, UploadResult


@dataclass
class PushReport:
    store: str
    versions: list[UploadResult]

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.versions)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "versions": [r.to_dict() for r in self.versions]}


def push_target(uri: str | None) -> RepositoryStore:
    """The store a push writes to (``uri``, default: the local repository)."""
    return open_store(uri)


def store_push(
    target: RepositoryStore, path: Path, progress: Callable[[int], None] | None = None
) -> PushReport:
    """Push every version folder under ``path`` into ``target`` (``progress``: bytes just sent)."""
    results = push_path(target, path, progress, lease=lease_of(Settings.from_env()))
    return PushReport(target.uri, results)


__all__ = ["PushReport", "push_target", "store_push"]
