"""The repository store interface: Triton repository folders in a local folder or object storage.

Layout (Triton's own): ``<root>/<model>/config.pbtxt`` and ``<root>/<model>/<version>/...``.
mlreg adds two objects Triton ignores: ``<model>/<version>/.mlreg-manifest.json`` (sha256 and
size of every file, written last: a version without it is incomplete) and
``.mlreg-lock.<model>.json`` (the per-model lock) at the repository root.

Why the lock is a file at the root and not in the model folder: Triton (2.51, local folders) loads
*every* version of a model again when its folder holds an entry that was not there at the last load,
so a lock beside the versions would make each promotion load the old version a second time next to
the new one (measured: the swap took 1.6x as long on this machine).  Triton reads only folders at
the root as models; files there are ignored, locally and on S3.

Verifying bytes before a load (``verify_version``; the logic is in :mod:`pipelines.storage.verify`):
every file of ``<model>/<version>/`` must match the manifest (size and sha256, no file missing, none
added), the manifest's ``digest`` must match its own contents, and, when ``expected_digest`` is given
(the ``artifact_digest`` tag registration recorded in MLflow), the manifest's digest must equal it.
A mismatch raises :class:`StorageError` naming each file, and changes nothing.  A file is hashed
once: its digest is reused only while the bytes provably did not change -- locally while (size,
mtime_ns, inode, ctime_ns) are the same (ctime cannot be set back by a user), on S3 while the
object's (size, ETag, VersionId, LastModified) are the ones recorded when the digest was computed
(at upload or at the last verification); S3 metadata such as ``x-amz-meta-sha256`` is never trusted.

Symbolic links: a link under a model folder that leaves it is refused by ``put_version`` and
``push`` (:mod:`registry.contracts.links`, the rule ``register`` and ``validate`` apply too).

How it is built: :class:`~pipelines.storage.objects.ObjectStore` holds the primitives only (a
local folder, S3); :class:`~pipelines.storage.session.StoreSession` what one operation holds
(locks, leases, fencing, the change journal); :class:`~pipelines.storage.versions.Versions` the
manifests, uploads and checks; ``Manifest`` and ``Stamp`` sit in the leaf
:mod:`pipelines.storage.manifest`.  :class:`RepositoryStore` is the object store with one session
and its versions, and the one type callers use (``open_store`` returns one).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Self

from pipelines.storage.lease import Lease, LockInfo
from pipelines.storage.manifest import MANIFEST, DigestCache, Manifest, Stamp, file_stamp
from pipelines.storage.objects import (
    ARCHIVE,
    CHUNK,
    CONFIG,
    LOCK_PREFIX,
    NAME_PART,
    ROOT_MARKER,
    ObjectStore,
    Progress,
    check_part,
    lock_key,
)
from pipelines.storage.session import LEASE_S, StoreSession, default_owner
from pipelines.storage.verify import Verification, root_marker
from pipelines.storage.versions import UploadResult, Versions, local_files

__all__ = [
    "ARCHIVE",
    "CHUNK",
    "CONFIG",
    "LEASE_S",
    "LOCK_PREFIX",
    "MANIFEST",
    "NAME_PART",
    "ROOT_MARKER",
    "DigestCache",
    "Manifest",
    "ObjectStore",
    "Progress",
    "RepositoryStore",
    "Stamp",
    "StoreSession",
    "UploadResult",
    "check_part",
    "default_owner",
    "file_stamp",
    "local_files",
    "lock_key",
]


class RepositoryStore(ObjectStore):
    """A Triton model repository in some storage: the object primitives (subclasses implement
    them) and, per store object, one :class:`StoreSession` (locks, leases, the change journal)
    and its :class:`Versions` (manifests, uploads, verification): public parts a caller takes
    (``store.session.fence``, ``store.versions.get_version``...).  The methods below that still
    delegate to them are the ones not yet moved to their callers (issue 47 item 4)."""

    def __init__(self, holder: StoreSession | None = None) -> None:
        self.session = StoreSession(self, holder)
        self.versions = Versions(self, self.session)

    def note_change(self, key: str) -> bool:
        """Called before each write or delete: fenced (:meth:`fence`) under a locked model."""
        return self.session.note_change(key)

    def unsent_change(self, key: str) -> None:
        self.session.unsent_change(key)

    def beside(self, folder: str) -> Self:
        """The repository at ``<parent>/<folder>/<name>`` (``ObjectStore.beside``): its own session
        and versions, fenced by this store's leases (a model's lock lost, its copies there are not
        changed either)."""
        other = super().beside(folder)
        RepositoryStore.__init__(other, self.session.holder)
        return other

    def archive(self) -> RepositoryStore:
        """The archive beside this store (:mod:`pipelines.storage.archive`): ``beside(ARCHIVE)``."""
        return self.beside(ARCHIVE)

    # -- repository operations ---------------------------------------------------------------

    def list_models(self) -> list[str]:
        return sorted(self.children(""))

    def list_versions(self, model: str) -> list[str]:
        return sorted((v for v in self.children(f"{model}/") if v.isdigit()), key=int)

    def read_config(self, model: str) -> str | None:
        data = self.read(f"{check_part(model, 'model name')}/{CONFIG}")
        return None if data is None else data.decode("utf-8")

    def init_root(self) -> bool:
        """Write the root marker (a file at the root: never a model for Triton) so that Triton
        can start on an empty S3 prefix; False when it was there already."""
        return self.create(ROOT_MARKER, root_marker(self.uri))

    # -- versions (pipelines/storage/versions.py) ----------------------------------------------

    def read_manifest(self, model: str, version: str) -> Manifest | None:
        """The version's manifest; None when there is none or it is unreadable (truncated, not a
        manifest): either way the version has no usable manifest and counts as incomplete -- a
        promotion sends it again from the registry, ``check_version`` names a corrupt manifest."""
        return self.versions.load_manifest(model, version)[0]

    def check_version(
        self,
        model: str,
        version: str,
        expected_digest: str | None = None,
        hashing: str = "changed",
        *,
        closed_world: bool = True,
        loading: tuple[str, ...] = (),
    ) -> Verification:
        """Compare the stored version with its manifest (and ``expected_digest``); never raises on
        a mismatch: the problems are in the result.  ``hashing``: ``"all"`` re-hashes every file,
        ``"changed"`` only files whose digest the cache cannot prove, ``"none"`` hashes nothing
        (files it cannot prove are reported unverified).  ``closed_world`` (what Triton reads: the
        default) also judges every other entry of the model folder
        (:mod:`pipelines.storage.closed_world`), with ``loading`` the versions the load names
        (default: this one); False only where Triton never reads (the archive)."""
        return self.versions.check_version(
            model, version, expected_digest, hashing, closed_world=closed_world, loading=loading
        )

    def verify_version(
        self,
        model: str,
        version: str,
        expected_digest: str | None = None,
        *,
        full: bool = False,
        drop_bytecode: bool = False,
        loading: tuple[str, ...] = (),
    ) -> Verification:
        """Refuse (StorageError naming each bad file) unless every file of ``<model>/<version>/``
        matches the manifest and the manifest matches ``expected_digest`` (the version's
        ``artifact_digest`` in MLflow) when given, and nothing else is under ``<model>/`` (the
        closed world: :mod:`pipelines.storage.closed_world`; ``loading``: the versions the load
        names).  ``full`` re-hashes every file instead of reusing digests the cache proves.
        ``drop_bytecode`` (right before Triton reads the folder): a version that verifies then
        loses its Python bytecode caches."""
        return self.versions.verify_version(
            model, version, expected_digest, full=full, drop_bytecode=drop_bytecode, loading=loading
        )

    def verify_load(
        self, model: str, versions: tuple[str, ...] | list[str], config: str | None = None
    ) -> None:
        """Right before a load whose config names ``versions`` (the kept serving version too:
        Triton re-reads a loaded version whose files changed): each verified against its manifest
        in the closed world of the model folder (its bytecode caches dropped), the config's
        execution environment inside one of them, and held to what this store object learnt of it
        against MLflow's digest (the manifest digest that verified, or wrote; a version that did
        not verify is refused); StorageError naming what is wrong, nothing loaded.  ``config``:
        the load's config, whose version_policy names the versions Triton reads (all of them
        verified, whatever ``versions`` the caller waits READY for)."""
        self.versions.verify_load(model, tuple(versions), config)

    def refused(self, model: str, version: str) -> str:
        """Why this store object found ``model``/``version``'s bytes not the ones registered in
        MLflow earlier in this run ("" when it did not): such a version is never loaded again."""
        return self.versions.distrusted.get((model, version), "")

    def delete_version(self, model: str, version: str) -> None:
        """The files, then the manifest (an interrupted delete is incomplete)."""
        self.versions.delete_version(model, version)

    def put_version(
        self,
        model: str,
        version: str,
        folder: Path,
        progress: Progress | None = None,
        config: Path | None = None,
        *,
        write_once: bool = False,
    ) -> UploadResult:
        """Upload ``folder`` as ``<model>/<version>/``; only files not already stored are sent.

        ``config`` (default: ``folder``'s parent's config.pbtxt when there is one) is the model's
        registered config: recorded in the manifest, so that its digest is MLflow's
        ``artifact_digest``.  A file is skipped only when the stored bytes are proven equal (by the
        digest cache, else by hashing the stored copy), so a push also repairs a changed file.
        The manifest of a new version is created (:meth:`create`), never overwritten; the
        signature beside a version's manifest is kept.  ``write_once`` (``mlreg store push``): a
        version already stored keeps what was first written -- other files are refused
        (StorageError naming each), its manifest is never rewritten."""
        return self.versions.put_version(model, version, folder, progress, config, write_once)

    # -- the session (pipelines/storage/session.py): locks, leases, fencing, the journal ----------

    def lock(
        self, model: str, owner: str | None = None, ttl: float = LEASE_S, wait: float = 0.0
    ) -> AbstractContextManager[Lease]:
        """Hold ``model``'s lock; wait up to ``wait`` seconds for another holder, take stale ones.

        The lease (``ttl`` seconds, judged by the store's clock: the lock object's LastModified) is
        renewed by a thread every third of it while held, and by every config write of the model.
        A stale lock (lease run out, or its holder on this machine is gone) is taken over with a
        compare-and-swap on the lock object itself, so of two processes taking over the same
        stale lock exactly one wins.  A release that fails (the store unreachable) is noted in
        ``lock_notes``, never raised: it must not hide what the holder was doing.  While held, and
        after it was lost, every write under the model is fenced (:meth:`fence`)."""
        return self.session.lock(model, owner, ttl, wait)

    def read_lock(self, model: str) -> LockInfo | None:
        return self.session.read_lock(model)

    def locks(self) -> list[LockInfo]:
        """Every lock at the root, with its holder and its lease (the store's clock)."""
        return self.session.locks()

    def write_config(self, model: str, text: str) -> None:
        """Written only while this process still holds ``model``'s lock, when it took it: the lease
        is renewed first (compare-and-swap on the lock object), and a lost lock aborts the write."""
        self.session.write_config(model, text)

    def fenced(self, proven_only: bool = False) -> list[str]:
        """One line per model whose lock this store held and lost ("lock of scorer lost: now held
        by <holder>", "lock of scorer lost: lease ran out at <when>"); empty while every lease is
        held.  Asks the store (a renewal) only for leases not known lost; never raises: a store
        that cannot be reached proves nothing, and its lease counts as lost from then on ("lock of
        scorer lost: not proven, the store could not be reached (<why>)").  ``proven_only``: only
        the leases known lost to time or to another holder, not those the store could not be asked
        about (no one else can hold those before their end)."""
        return self.session.fenced(proven_only)

    @property
    def leases(self) -> dict[str, Lease]:
        return self.session.leases

    @property
    def lock_notes(self) -> list[str]:
        """Locks this store could not release (the store unreachable): where each was left."""
        return self.session.lock_notes
