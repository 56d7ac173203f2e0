"""``mlreg store push``: upload model folders (or a whole repository) as versioned folders.

Every version folder goes up with a sha256 manifest; unchanged files are not sent again.  A stored
version is written once: one the store holds with other bytes is refused (naming each file), the
same bytes are a no-op (:mod:`pipelines.storage.push`).  Each model's lock is held while it is
pushed, with the lease the lock policy gives (:func:`pipelines.storage.locking.lease_of`).  A
version the store holds without a valid manifest is finished only with the bytes MLflow registered
for it: the project's registry is asked for its ``artifact_digest`` (only then: MLflow's import is
paid by that push alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import open_registry, open_store
from pipelines.storage.locking import lease_of
from pipelines.storage.push import push_path
from registry.errors import RegistryError
from registry.settings import Settings

DIGEST_TAG = "artifact_digest"  # mlreg.ops.store_verify.DIGEST_TAG (not imported: it loads the promotion)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipelines.storage.base import Repository, UploadResult
    from registry.mlflow import MlflowRegistry


@dataclass
class PushReport:
    store: str
    versions: list[UploadResult]

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.versions)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "versions": [r.to_dict() for r in self.versions]}


def push_target(uri: str | None) -> Repository:
    """The store a push writes to (``uri``, default: the local repository)."""
    return open_store(uri)


def store_push(target: Repository, path: Path, progress: Callable[[int], None] | None = None) -> PushReport:
    """Push every version folder under ``path`` into ``target`` (``progress``: bytes just sent)."""
    settings = Settings.from_env()
    results = push_path(
        target, path, progress, lease=lease_of(settings), registered=registered_digest(settings)
    )
    return PushReport(target.uri, results)


def registered_digest(settings: Settings) -> Callable[[str, str], str | None]:
    """(model, version) -> the ``artifact_digest`` MLflow recorded for it (None: a version MLflow
    does not know, or one registered without a digest); the registry opened on the first ask."""
    opened: list[MlflowRegistry] = []

    def digest(model: str, version: str) -> str | None:
        if not opened:
            opened.append(open_registry(settings))
        try:
            tags = opened[0].models.version_tags(model, version)
        except RegistryError as exc:
            if "DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
                raise
            return None
        return str(tags.get(DIGEST_TAG) or "") or None

    return digest


__all__ = ["PushReport", "push_target", "store_push"]
