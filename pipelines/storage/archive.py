"""The store's archive: where versions outside an environment's retention window go, never lost.

Triton (2.51, S3 and local) localizes the whole model folder -- every version in it -- for each
load, so a version nobody serves still costs every load its bytes.  Retention moves such versions
out of the prefix Triton reads into the archive *beside* the store, in the same bucket or on the
same file system:

    <parent>/.mlreg-archive/<store name>/<model>/<version>/      (manifest included)

e.g. ``s3://bucket/models/staging`` archives to ``s3://bucket/models/.mlreg-archive/staging/`` and
``.mlreg/model_repository`` to ``.mlreg/.mlreg-archive/model_repository/``.  Not inside the store:
Triton lists every folder at its repository root as a model (measured on 2.51: ``.mlreg-archive``
shows in the repository index, its load fails, and ``--load-model=*`` would try it).  A store at
the very root of a bucket has no place beside it: retention refuses it, saying so.

A move keeps the version whole in at least one place at every instant: locally one ``rename``; on
S3 a server-side copy of every file, the manifest last, the copy checked against the manifest,
then the live files deleted (the manifest last).  A local archive on another file system (its
folder a mount of its own: ``rename`` fails with ``EXDEV``) is moved as S3 is, each file copied
and hashed as it is written, so the check compares every sha256 with the manifest before the live
copy goes -- both ways.  A crash leaves the live copy, or both: the next move (a promotion's
retention, ``mlreg store gc``) finishes it.  Bringing a version back copies it
(the archive keeps its copy until the version is live and complete again), then the caller verifies
it against the digest registered in MLflow before any load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipelines.storage.base import ARCHIVE, ObjectStore, Repository
from pipelines.storage.verify import MANIFEST, Verification
from pipelines.storage.versions import Versions
from registry.errors import StorageError

__all__ = [
    "ARCHIVE",
    "Placed",
    "archive_of",
    "bring_back",
    "complete",
    "drop_archived",
    "move_to_archive",
    "placements",
]
OnCopied = Callable[[str, str], None]  # (model, version): the copy is complete, the live one not yet gone


@dataclass(frozen=True)
class Placed:
    """Where one version of a model is: live (the prefix Triton reads), archived, or both."""

    model: str
    version: str
    live: Verification | None
    archived: Verification | None

    @property
    def where(self) -> str:
        if self.live is not None and self.archived is not None:
            return "both"
        return "live" if self.live is not None else "archived"


def archive_of(store: Repository) -> Repository:
    """The archive beside ``store`` (a StorageError for a store at the root of a bucket)."""
    return store.archive()


def complete(versions: Versions, model: str, version: str) -> Verification | None:
    """The version's check (sizes against its manifest, nothing hashed) when it is whole there:
    manifest present, every file at its size, nothing missing; None otherwise."""
    # no manifest: "incomplete"; the version's own wholeness only (the archive is never read by Triton)
    check = versions.check_version(model, version, hashing="none", closed_world=False)
    return check if not check.problems else None


def move_to_archive(
    store: Repository,
    archive: Repository,
    model: str,
    version: str,
    on_copied: OnCopied | None = None,
) -> int:
    """Move ``model``/``version`` from ``store`` into ``archive``; returns the bytes moved.

    Refuses (StorageError) a live copy that is not whole: an incomplete version is not archived
    (the archive must never be the one copy of something broken)."""
    live = complete(store.versions, model, version)
    if live is None:
        if complete(archive.versions, model, version) is not None:
            store.versions.delete_version(model, version)  # a move a crash cut short: the archive is whole
            return 0
        raise StorageError(
            f"{store.uri}: {model}/{version} is incomplete or does not match its manifest; "
            f"not moved to {archive.uri}",
            fix=f"check it with 'mlreg store verify {model} {version}', push it again, then rerun",
            model=model,
            version=version,
        )
    if not store.objects.move_version_to(archive.objects, model, version):
        if not _same_copy(store.versions, archive.versions, model, version):  # a crash after the copy
            _copy_version(store.objects, archive.objects, model, version)  # (not sent again)
        if complete(archive.versions, model, version) is None:
            raise StorageError(
                f"{archive.uri}: the archived copy of {model}/{version} is not whole; the live copy is kept",
                fix="rerun 'mlreg store gc' (the live copy is untouched)",
                model=model,
                version=version,
            )
        if on_copied is not None:
            on_copied(model, version)
        store.versions.delete_version(model, version)  # files first, the manifest last
    return live.bytes


def bring_back(store: Repository, archive: Repository, model: str, version: str) -> bool:
    """Copy ``model``/``version`` from the archive into the live store (server-side on S3); False
    when the archive holds no whole copy.  The caller verifies the live copy before any load."""
    if complete(archive.versions, model, version) is None:
        return False
    _copy_version(archive.objects, store.objects, model, version)
    return True


def drop_archived(archive: Versions, model: str, version: str) -> None:
    """Remove the archive's copy of a version that is live and whole again."""
    archive.delete_version(model, version)


def _same_copy(store: Versions, archive: Versions, model: str, version: str) -> bool:
    """The archive already holds this very version, whole (the same manifest)."""
    there = archive.read_manifest(model, version)
    here = store.read_manifest(model, version)
    return (
        there is not None
        and here is not None
        and there.digest == here.digest
        and (complete(archive, model, version) is not None)
    )


def _copy_version(source: ObjectStore, dest: ObjectStore, model: str, version: str) -> None:
    """Every object of the version folder (a signature beside the manifest included), the manifest
    last: a copy is whole once it is there."""
    prefix = f"{model}/{version}/"
    dest.delete(prefix + MANIFEST)  # an earlier partial copy is incomplete until the end
    stamps = source.object_stamps(prefix)  # one listing: every key and its size
    for key, stamp in sorted(stamps.items()):
        if key != prefix + MANIFEST and not _bytecode(key):
            source.copy_object_to(key, dest, key, int(stamp[0]))
    source.copy_object_to(prefix + MANIFEST, dest, prefix + MANIFEST, int(stamps[prefix + MANIFEST][0]))


def _bytecode(key: str) -> bool:
    return "__pycache__" in key.split("/")


def placements(store: Repository, archive: Repository | None, model: str) -> list[Placed]:
    """Every version of ``model``, live or archived, with the check of each copy (nothing hashed)."""
    live = set(store.list_versions(model))
    stored = set(archive.list_versions(model)) if archive is not None else set()
    rows = []
    for version in sorted(live | stored, key=int):
        here = (
            store.versions.check_version(model, version, hashing="none", closed_world=False)
            if version in live
            else None
        )
        there = (
            archive.versions.check_version(model, version, hashing="none", closed_world=False)
            if archive is not None and version in stored
            else None
        )
        rows.append(Placed(model, version, here, there))
    return rows
