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

Verifying bytes before a load (``Versions.verify_version``; the logic is in :mod:`pipelines.storage.verify`):
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
:mod:`pipelines.storage.manifest`.  A :class:`Repository` holds the objects, one session and
its versions (``open_store`` returns one); a caller takes the part it uses.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.storage.manifest import MANIFEST, DigestCache, Manifest, Stamp, file_stamp
from pipelines.storage.objects import (
    ARCHIVE,
    CHUNK,
    CONFIG,
    LOCK_PREFIX,
    NAME_PART,
    ROOT_MARKER,
    UNJOURNALED,
    ObjectStore,
    Progress,
    check_part,
    lock_key,
)
from pipelines.storage.session import LEASE_S, StoreSession, default_owner
from pipelines.storage.verify import root_marker
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
    "Repository",
    "Stamp",
    "StoreSession",
    "UploadResult",
    "check_part",
    "default_owner",
    "file_stamp",
    "local_files",
    "lock_key",
]


class Repository:
    """A Triton model repository in some storage: it holds the object primitives (``objects``: a
    local folder, S3) and, per repository object, one :class:`StoreSession` (``session``: locks,
    leases, the change journal; the objects' writes are fenced and journaled by it) and its
    :class:`Versions` (``versions``: manifests, uploads, verification) -- public parts a caller
    takes (``repo.session.lock``, ``repo.versions.put_version``, ``repo.objects.read``).  Its own:
    the models and versions it lists, a model's config, the root marker, the archive beside it."""

    def __init__(self, objects: ObjectStore, holder: StoreSession | None = None) -> None:
        if objects.journal is not UNJOURNALED:
            raise ValueError(f"{objects.uri}: these objects belong to another repository already")
        self.objects = objects
        self.session = StoreSession(objects, holder)
        self.versions = Versions(objects, self.session)
        objects.journal = self.session  # every write fenced and journaled by this session

    @classmethod
    def local(cls, root: Path, holder: StoreSession | None = None) -> Repository:
        """The repository in the local folder ``root`` (the embedded default)."""
        from pipelines.storage.local import LocalObjects  # lazy: ~7 ms an S3 store never pays

        return cls(LocalObjects(root), holder)

    @property
    def uri(self) -> str:
        return self.objects.uri

    def beside(self, folder: str) -> Repository:
        """The repository at ``<parent>/<folder>/<name>`` (``ObjectStore.beside``): its own session
        and versions, fenced by this repository's leases (a model's lock lost, its copies there are
        not changed either)."""
        return Repository(self.objects.beside(folder), self.session.holder)

    def archive(self) -> Repository:
        """The archive beside this repository (:mod:`pipelines.storage.archive`): ``beside(ARCHIVE)``."""
        return self.beside(ARCHIVE)

    def list_models(self) -> list[str]:
        return sorted(self.objects.children(""))

    def list_versions(self, model: str) -> list[str]:
        return sorted((v for v in self.objects.children(f"{model}/") if v.isdigit()), key=int)

    def read_config(self, model: str) -> str | None:
        data = self.objects.read(f"{check_part(model, 'model name')}/{CONFIG}")
        return None if data is None else data.decode("utf-8")

    def init_root(self) -> bool:
        """Write the root marker (a file at the root: never a model for Triton) so that Triton
        can start on an empty S3 prefix; False when it was there already."""
        return self.objects.create(ROOT_MARKER, root_marker(self.uri))
