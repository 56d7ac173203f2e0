"""``mlreg store ls``: every stored version and the state of its bytes, live and archived.

Nothing is hashed (``hashing="none"``): sizes are checked now, digests only where the digest cache
proves them.  A version numbered below a stored one that is neither live nor archived is
``missing``: mlreg moves a version out of the store only into its archive, so such a gap is an
archived copy deleted (or a version this store never held).  A store read on S3 gives up on a
request the store does not answer within seconds, as ``mlreg status`` does (:func:`deadline`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlreg.ops import status_views
from registry.errors import StorageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.storage.base import ObjectStore, Repository
    from pipelines.storage.lease import LockInfo
    from pipelines.storage.versions import Versions


def deadline() -> str:
    """How soon a read of a remote store gives up (status's bounds, read when asked)."""
    tries, seconds = 1 + status_views.STORE_RETRIES, status_views.STORE_READ_TIMEOUT_S
    return f"gives up on a request after {tries} tries of {seconds:g} s"


@dataclass
class StoreListing:
    """What ``store ls`` found: one row per stored version (``location`` live or archived)."""

    store: str
    archive: str | None
    versions: list[dict[str, Any]]
    missing: dict[str, list[str]]
    archive_error: str = ""
    locks: list[LockInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "archive": self.archive,
            "versions": self.versions,
            "missing": self.missing,
            "archive_error": self.archive_error,
            "locks": [lock.to_dict() for lock in self.locks],
        }


def open_listed(uri: str | None, settings: Settings | None = None) -> Repository:
    """The store at ``uri`` (default: the local repository), with short S3 timeouts."""
    settings = settings or Settings.from_env()
    return status_views.status_store(uri or settings.local_repository, digest_cache=settings.digest_cache)


@contextmanager
def answering(target: ObjectStore) -> Iterator[None]:
    """A remote store that failed a read (it did not answer in time, or refused) ends ``store ls``
    with one error naming it and the fix."""
    try:
        yield
    except StorageError as exc:
        if not target.uri.startswith("s3://"):
            raise  # a local folder's error says which file and why
        raise StorageError(
            f"{exc.message} ('mlreg store ls' {deadline()})",
            fix=f"check that {target.uri} answers (endpoint up, credentials valid), then rerun "
            "'mlreg store ls'; 'mlreg status' says what each replica serves meanwhile",
        ) from exc


def store_ls(target: Repository) -> StoreListing:
    """Every version of ``target`` and of its archive, checked without hashing."""
    archive = archive_of(target)
    archived, archive_error = _archived(archive)
    rows = [_row(target.versions, model, version, "live") for model, version in _live(target)]
    if archive is not None:
        rows.extend(_row(archive.versions, model, version, "archived") for model, version in archived)
    return StoreListing(
        target.uri,
        archive.uri if archive is not None else None,
        rows,
        _missing(rows),
        archive_error,
        target.session.locks(),
    )


def _live(target: Repository) -> Iterator[tuple[str, str]]:
    """(model, version) of every live version; ``version`` "" for a model holding none."""
    for model in target.list_models():
        for version in target.list_versions(model) or [""]:
            yield model, version


def _row(store: Versions, model: str, version: str, location: str) -> dict[str, Any]:
    """A live copy is checked in the closed world of its model folder (an entry no manifest covers
    is named: Triton reads it); an archived one alone (Triton never reads the archive)."""
    closed = location == "live"
    check = store.check_version(model, version, hashing="none", closed_world=closed) if version else None
    return {
        "model": model,
        "version": version,
        "location": location,
        "state": check.status if check else "no versions",
        "files": check.files if check else 0,
        "problems": [p.line() for p in check.problems] if check else [],
    }


def archive_of(target: Repository) -> Repository | None:
    """The archive beside ``target`` (pipelines/storage/archive.py); None where it can have none."""
    try:
        return target.archive()
    except StorageError:
        return None


def _archived(archive: Repository | None) -> tuple[list[tuple[str, str]], str]:
    """(model, version) of every archived copy, and why the archive could not be listed ("")."""
    if archive is None:
        return [], ""
    try:
        return [(m, v) for m in archive.list_models() for v in archive.list_versions(m)], ""
    except StorageError as exc:
        return [], exc.message


def _missing(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """model -> the versions below its newest stored one (live or archived) that are in neither:
    a version leaves the store only for its archive, so such a gap is an archived copy deleted --
    or a version this store never held (registered but promoted elsewhere only)."""
    held: dict[str, set[int]] = {}
    for row in rows:
        version = str(row["version"])
        held.setdefault(str(row["model"]), set()).update({int(version)} if version.isdigit() else set())
    return {
        model: [str(v) for v in range(1, max(versions)) if v not in versions]
        for model, versions in sorted(held.items())
        if versions and len(versions) < max(versions)
    }


__all__ = ["StoreListing", "answering", "archive_of", "deadline", "open_listed", "store_ls"]
