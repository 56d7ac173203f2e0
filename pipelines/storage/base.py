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
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.storage.lease import Lease, LockInfo, parse_lock, remove_lock
from pipelines.storage.verify import (
    MANIFEST,
    SIGNATURE_FILE,
    bytecode_cache,
    bytecode_guard,
    check_version,
    other_bytes,
    rewrite_refused,
    root_marker,
)
from registry.contracts.links import refuse_outside_links
from registry.errors import StorageError
from registry.manifest import CONFIG_ENTRY, digest_of_manifest, sha256_file

LOCK_PREFIX = ".mlreg-lock."
ARCHIVE = ".mlreg-archive"  # beside the store, never in it: see pipelines/storage/archive.py
ROOT_MARKER = ".mlreg-root.json"  # written by `mlreg store init`: a file at the root, never a model
CONFIG = "config.pbtxt"
NAME_PART = re.compile(r"^[0-9A-Za-z.\-_]+$")
CHUNK = 1 << 20
LEASE_S = 900.0  # a lock's lease; renewed every third of it while held
Progress = Callable[[int], None]  # bytes just sent

if TYPE_CHECKING:
    from pipelines.storage.verify import Verification


def lock_key(model: str) -> str:
    """The model's lock: a file at the root, outside the model folder (see above)."""
    return f"{LOCK_PREFIX}{model}.json"


def check_part(part: str, what: str) -> str:
    """Triton reads S3 paths whose parts use only [0-9a-zA-Z.-_]; refuse anything else."""
    if not NAME_PART.match(part) or part in {".", ".."}:
        raise StorageError(
            f"{what} '{part}' cannot be stored: path parts may only use letters, digits, '.', '-' "
            "and '_' (Triton's rule for S3 repositories)",
            fix="rename it with only those characters",
        )
    return part


def local_files(folder: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every file under the version folder ``folder`` (names
    checked; links leaving the model folder, ``folder``'s parent, refused)."""
    refuse_outside_links(folder.parent, folder, StorageError)
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            rel = path.relative_to(folder).as_posix()
            for part in rel.split("/"):
                check_part(part, f"file name in {folder}")
            files[rel] = path
    return files


Stamp = list[Any]  # what identifies one state of a file's bytes (JSON-serialisable)


def file_stamp(st: os.stat_result) -> Stamp:
    """A local file's bytes are unchanged while size, mtime_ns, inode and ctime_ns are."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


class DigestCache:
    """sha256 of files and objects, keyed by a stamp that changes whenever the bytes may have.

    Local files: ``str(path.resolve()) -> [size, mtime_ns, inode, ctime_ns, sha256]``; objects:
    ``"s3:<endpoint>/<bucket>/<key>" -> [size, etag, version_id, last_modified_s, sha256]``.
    Stored as JSON in ``path``; a missing or corrupt cache only costs re-hashing.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        if path is not None:
            try:
                self.entries = dict(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                self.entries = {}
        self.dirty = False

    def lookup(self, key: str, stamp: Stamp) -> str | None:
        """The digest recorded for exactly this ``stamp``, else None."""
        cached = self.entries.get(key)
        if isinstance(cached, list) and len(cached) == len(stamp) + 1 and cached[:-1] == stamp:
            return str(cached[-1])
        return None

    def remember(self, key: str, stamp: Stamp, digest: str) -> None:
        self.entries[key] = [*stamp, digest]
        self.dirty = True

    def forget(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.dirty = True

    def sha256(self, file: Path) -> str:
        key = str(file.resolve())
        stamp = file_stamp(file.stat())
        cached = self.lookup(key, stamp)
        if cached is not None:
            return cached
        digest = sha256_file(file)
        if file_stamp(file.stat()) == stamp:  # not changed while it was read
            self.remember(key, stamp, digest)
        return digest

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.entries))
            tmp.replace(self.path)
        except OSError:
            pass  # a cache that cannot be written is only slower next time
        self.dirty = False


@dataclass
class Manifest:
    """A version's bytes: every file's sha256 and size, and the config it was pushed with.

    ``digest`` is :func:`registry.manifest.digest_of_manifest` over the files plus a
    ``config.pbtxt`` entry for ``config``: the ``artifact_digest`` MLflow holds for the version.
    The JSON carries it as ``"digest"``, so an edited manifest no longer matches itself."""

    files: dict[str, dict[str, Any]]  # rel path -> {"sha256": ..., "size": ...}
    created_at: float = field(default_factory=time.time)
    config: dict[str, Any] | None = None  # {"sha256": ..., "size": ...} of the model's config.pbtxt
    recorded_digest: str | None = None  # the "digest" field as read (None: written before digests)

    @property
    def digest(self) -> str:
        files = dict(self.files)
        if self.config is not None:
            files[CONFIG_ENTRY] = self.config
        return digest_of_manifest(files)

    def to_json(self) -> str:
        data: dict[str, Any] = {"files": self.files, "created_at": self.created_at, "digest": self.digest}
        if self.config is not None:
            data["config"] = self.config
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        data = json.loads(text)
        config = data.get("config")
        return cls(
            files=dict(data["files"]),
            created_at=float(data.get("created_at", 0)),
            config=dict(config) if config is not None else None,
            recorded_digest=str(data["digest"]) if data.get("digest") else None,
        )

    @classmethod
    def of_folder(
        cls, files: dict[str, Path], cache: DigestCache | None = None, config: Path | None = None
    ) -> Manifest:
        digest = cache.sha256 if cache is not None else sha256_file

        def entry(path: Path) -> dict[str, Any]:
            return {"sha256": digest(path), "size": path.stat().st_size}

        manifest = cls(
            {rel: entry(p) for rel, p in files.items()}, config=entry(config) if config is not None else None
        )
        if cache is not None:
            cache.save()
        return manifest


@dataclass
class UploadResult:
    model: str
    version: str
    sent: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_sent: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "sent": self.sent,
            "skipped": self.skipped,
            "bytes_sent": self.bytes_sent,
        }


def default_owner() -> str:
    return f"{os.environ.get('USER', 'user')}@{socket.gethostname()}:{os.getpid()}"


class RepositoryStore(ABC):
    """A Triton model repository in some storage. Subclasses implement the primitives."""

    uri: str
    digests: DigestCache
    clock_grain = 0.0  # how coarse the store's clock is (lock times): S3's are whole seconds

    # -- primitives --------------------------------------------------------------------------

    @abstractmethod
    def read(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write only if ``key`` does not exist; False when it does (atomic)."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and a token that changes with every write; None when absent."""

    @abstractmethod
    def replace(self, key: str, data: bytes, token: str) -> bool:
        """Write only if the object is still the one ``token`` names; False otherwise (atomic)."""

    @abstractmethod
    def delete_if_unchanged(self, key: str, token: str) -> None:
        """Delete only if the object is still the one ``token`` names."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursively), relative to the store root."""

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """Immediate folder names under ``prefix``."""

    @abstractmethod
    def put_file(self, key: str, path: Path, sha256: str, progress: Progress | None) -> None:
        """Upload one file (streaming), then verify it is stored (size, digest where known)."""

    @abstractmethod
    def stored_digest(self, key: str) -> str | None:
        """The sha256 recorded with the stored object, None when absent or unknown (a hint only:
        metadata is not proof of the bytes)."""

    @abstractmethod
    def object_stamps(self, prefix: str) -> dict[str, Stamp]:
        """Key -> stamp (``stamp[0]`` is the size) of every object under ``prefix``, in one listing."""

    @abstractmethod
    def hash_object(self, key: str) -> tuple[str, Stamp] | None:
        """Read the object once: its sha256 and the stamp of the bytes read; None when absent."""

    @abstractmethod
    def cache_key(self, key: str) -> str:
        """The object's key in the digest cache."""

    def before_upload(self, prefix: str) -> None:
        """Called before the first file of a version under ``prefix`` is sent (S3: incomplete
        multipart uploads an interrupted push left there are aborted)."""
        return None

    def outside_links(self, model: str, version: str) -> list[str]:
        """Links in the stored version that leave its model folder (only a local folder has links)."""
        return []

    def archive(self) -> RepositoryStore:
        """The archive beside this store (:mod:`pipelines.storage.archive`), sharing its digest cache."""
        raise StorageError(f"{self.uri}: this store has no archive", fix="set keep = 0 for its environment")

    def copy_object_to(self, key: str, dest: RepositoryStore, dest_key: str, size: int | None = None) -> None:
        """Copy one object (``size`` bytes, when known) into ``dest`` (stores of one kind override
        this: server-side, a link)."""
        data = self.read(key)
        if data is None:
            raise StorageError(f"{self.uri}: '{key}' vanished while it was copied", fix="rerun", key=key)
        dest.write(dest_key, data)

    def move_version_to(self, dest: RepositoryStore, model: str, version: str) -> bool:
        """Move a whole version folder into ``dest`` in one step where the storage can (a local
        rename); False when it cannot: the caller copies, checks, then deletes."""
        return False

    # -- repository operations ---------------------------------------------------------------

    def list_models(self) -> list[str]:
        return sorted(self.children(""))

    def list_versions(self, model: str) -> list[str]:
        return sorted((v for v in self.children(f"{model}/") if v.isdigit()), key=int)

    def read_config(self, model: str) -> str | None:
        data = self.read(f"{check_part(model, 'model name')}/{CONFIG}")
        return None if data is None else data.decode("utf-8")

    def read_manifest(self, model: str, version: str) -> Manifest | None:
        """The version's manifest; None when there is none or it is unreadable (truncated, not a
        manifest): either way the version has no usable manifest and counts as incomplete -- a
        promotion sends it again from the registry, ``check_version`` names a corrupt manifest."""
        return self.load_manifest(model, version)[0]

    def load_manifest(self, model: str, version: str) -> tuple[Manifest | None, str]:
        """The version's manifest, or why the one stored cannot be read ("": none is stored)."""
        data = self.read(f"{model}/{version}/{MANIFEST}")
        if data is None:
            return None, ""
        try:
            return Manifest.from_json(data), ""
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return None, f"{len(data)} bytes, {type(exc).__name__}: {exc}"

    def get_version(self, model: str, version: str, dest: Path, expected_digest: str | None = None) -> Path:
        """Download ``<model>/<version>/`` into ``dest`` (the manifest left out); return dest.  The
        stored bytes are verified first (against ``expected_digest`` too, when given): StorageError
        naming the file when they do not match -- nothing unverified leaves the store."""
        self.verify_version(model, version, expected_digest)
        dest.mkdir(parents=True, exist_ok=True)
        prefix = f"{model}/{version}/"
        for key in self.list_prefix(prefix):
            rel = key[len(prefix) :]
            if rel == MANIFEST or bytecode_cache(key) or bytecode_guard(key):  # nothing unhashed
                continue
            data = self.read(key)
            if data is None:
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
        return dest

    def check_version(
        self, model: str, version: str, expected_digest: str | None = None, hashing: str = "changed"
    ) -> Verification:
        """Compare the stored version with its manifest (and ``expected_digest``); never raises on
        a mismatch: the problems are in the result.  ``hashing``: ``"all"`` re-hashes every file,
        ``"changed"`` only files whose digest the cache cannot prove, ``"none"`` hashes nothing
        (files it cannot prove are reported unverified)."""
        return check_version(self, model, version, expected_digest, hashing)

    def verify_version(
        self,
        model: str,
        version: str,
        expected_digest: str | None = None,
        *,
        full: bool = False,
        drop_bytecode: bool = False,
    ) -> Verification:
        """Refuse (StorageError naming each bad file) unless every file of ``<model>/<version>/``
        matches the manifest and the manifest matches ``expected_digest`` (the version's
        ``artifact_digest`` in MLflow) when given.  ``full`` re-hashes every file instead of
        reusing digests the cache proves.

        ``drop_bytecode`` (right before Triton reads the folder): a version that verifies then
        loses its Python bytecode caches (``drop_bytecode``); without it, nothing is changed."""
        result = self.check_version(model, version, expected_digest, "all" if full else "changed")
        result.raise_if_bad()
        if drop_bytecode:
            for key in result.bytecode:
                self.delete(key)
            self.guard_bytecode(model, version)
        return result

    def drop_bytecode(self, model: str, version: str) -> list[str]:
        """Remove the Python bytecode caches (``__pycache__/*.pyc``) of ``<model>/<version>/``: no
        manifest covers them, and Python runs a valid one in place of the verified ``model.py``
        (Triton's python stub imports it; on S3 Triton copies the folder, cache and all). Removed
        right before a load, so what Triton reads is exactly what was hashed; the stub compiles the
        verified source again. Returns the keys removed."""
        keys = [k for k in self.list_prefix(f"{model}/{version}/") if bytecode_cache(k)]
        for key in keys:
            self.delete(key)
        self.guard_bytecode(model, version)
        return keys

    def guard_bytecode(self, model: str, version: str) -> list[str]:
        """Where Triton reads the store's own folders (a local store), keep Python from writing
        bytecode into ``<model>/<version>/``: an empty file named ``__pycache__`` in each folder
        holding ``.py`` source (``verify.bytecode_guard``), so a served version's files never
        change after its load and a swap never re-creates it.  Returns the keys written (none
        when every guard is in place: nothing changes). Object stores: Triton copies the folder
        elsewhere to load it; nothing to guard."""
        return []

    def is_empty(self) -> bool:
        """True when the repository holds no object (S3: Triton cannot start on it)."""
        return False

    def init_root(self) -> bool:
        """Write the root marker (a file at the root: never a model for Triton) so that Triton
        can start on an empty S3 prefix; False when it was there already."""
        return self.create(ROOT_MARKER, root_marker(self.uri))

    def _stored_matches(self, key: str, digest: str, stamps: dict[str, Stamp]) -> bool:
        """Whether the stored object holds exactly ``digest``: proven by the cache, else hashed."""
        stamp = stamps.get(key)
        if stamp is None:
            return False
        cached = self.digests.lookup(self.cache_key(key), stamp)
        if cached is None:
            found = self.hash_object(key)
            if found is None:
                return False
            cached, read_stamp = found
            self.digests.remember(self.cache_key(key), read_stamp, cached)
        return cached == digest

    def delete_version(self, model: str, version: str) -> None:
        for key in self.list_prefix(f"{model}/{version}/"):
            if not key.endswith(MANIFEST):
                self.delete(key)
        self.delete(f"{model}/{version}/{MANIFEST}")  # last: an interrupted delete is incomplete

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
        The manifest of a new version is created, never overwritten (:meth:`_create_manifest`);
        the signature beside a version's manifest is kept.  ``write_once`` (``mlreg store push``):
        a version already stored keeps what was first written -- other files are refused
        (StorageError naming each), its manifest is never rewritten."""
        check_part(model, "model name")
        check_part(version, "version")
        if not version.isdigit():
            raise StorageError(f"version '{version}' is not a number", fix="use 1, 2, 3, ...")
        files = local_files(folder)
        if config is None and (folder.parent / CONFIG).is_file():
            config = folder.parent / CONFIG
        manifest = Manifest.of_folder(files, self.digests, config)
        stored = self._stored_manifest(model, version, write_once)
        kept = write_once and stored is not None  # the stored manifest stays as it is
        lines = other_bytes(stored.files, manifest.files) if kept and stored is not None else []
        if lines:
            raise rewrite_refused(self.uri, model, version, lines)
        stamps = self.object_stamps(f"{model}/{version}/")
        result = UploadResult(model, version)
        try:
            for rel, path in files.items():
                key = f"{model}/{version}/{rel}"
                digest = manifest.files[rel]["sha256"]
                known = stored.files.get(rel, {}).get("sha256") if stored else self.stored_digest(key)
                if known == digest and self._stored_matches(key, digest, stamps):
                    result.skipped.append(rel)
                    continue
                if not result.sent:
                    self.fence(model, f"{model}/{version}/")  # before aborting stale uploads
                    self.before_upload(f"{model}/{version}/")
                    if stored is not None and not kept:  # the version is incomplete from here
                        self.delete(f"{model}/{version}/{MANIFEST}")
                self.put_file(key, path, digest, progress)
                result.sent.append(rel)
                result.bytes_sent += int(manifest.files[rel]["size"])
        finally:
            self.digests.save()
        for key in stamps:
            rel = key.split("/", 2)[2]
            if rel not in {MANIFEST, SIGNATURE_FILE} and rel not in files and not bytecode_guard(key):
                self.delete(key)  # files the version lacks
        if stored is None:
            self._create_manifest(model, version, manifest)
        elif not kept and (result.sent or _differs(stored, manifest)):
            self.write(f"{model}/{version}/{MANIFEST}", manifest.to_json().encode())
        self.guard_bytecode(model, version)
        return result

    def _stored_manifest(self, model: str, version: str, write_once: bool) -> Manifest | None:
        """The stored manifest an upload starts from.  One that cannot be read proves nothing: it
        is removed (the version is incomplete until this upload writes it again, every file proven
        or sent).  A write-once push refuses it: it cannot tell whether its files are the stored
        version's; the registry can (``mlreg store repair``)."""
        stored, why = self.load_manifest(model, version)
        if not why:
            return stored
        if write_once:
            raise StorageError(
                f"{self.uri}: the manifest of {model} v{version} is unreadable ({why}); a stored "
                "version never changes, and without its manifest this push cannot tell whether its "
                "files are that version's; nothing was sent",
                fix=f"put the registered bytes back: 'mlreg store repair {model} {version}'",
                model=model,
                version=version,
            )
        self.delete(f"{model}/{version}/{MANIFEST}")  # fenced: a lost lock stops it here
        return None

    def _create_manifest(self, model: str, version: str, manifest: Manifest) -> None:
        """A new version's manifest, created only where none is (S3: a put with If-None-Match), so
        that of two writers of one new version exactly one makes it; the other, when its files
        differ, gets a StorageError (they may have mixed the files: verify says)."""
        if self.create(f"{model}/{version}/{MANIFEST}", manifest.to_json().encode()):
            return
        first = self.read_manifest(model, version)
        lines = other_bytes(first.files, manifest.files) if first is not None else ["the manifest vanished"]
        if not lines:
            return  # the other writer stored the same bytes
        raise StorageError(
            f"{self.uri}: {model} v{version} was created by another writer while this push sent it "
            "(its manifest was written first), with other bytes; the files stored now may mix both "
            "uploads:\n  " + "\n  ".join(lines[:10]),
            fix=f"check it with 'mlreg store verify {model} {version}' ('mlreg store repair {model} "
            f"{version}' puts the registered bytes back); to store other bytes, register and push a "
            "new version",
            model=model,
            version=version,
        )

    # -- locking (pipelines/storage/lease.py: the lease, renewed while held) ----------------------

    def lock_state(self, key: str) -> tuple[bytes, str, float | None, float | None] | None:
        """The lock object's bytes, its token, when the store last wrote it and the store's clock
        now (epoch seconds; None where the store cannot tell: the host's clock is used then)."""
        found = self.read_versioned(key)
        return None if found is None else (found[0], found[1], None, None)

    def lock_models(self) -> list[str]:
        """Every model with a lock object at the root."""
        return []

    def read_lock(self, model: str) -> LockInfo | None:
        found = self.lock_state(lock_key(model))
        return None if found is None else parse_lock(model, *found)

    def locks(self) -> list[LockInfo]:
        """Every lock at the root, with its holder and its lease (the store's clock)."""
        return [info for model in self.lock_models() if (info := self.read_lock(model)) is not None]

    def unlock(self, model: str, force: str = "") -> LockInfo:
        """Remove ``model``'s lock once its holder's lease ran out, or with ``force`` naming its
        holder (``lease.remove_lock``); StorageError while the lease is alive."""
        return remove_lock(self, lock_key(check_part(model, "model name")), model, force)

    def write_config(self, model: str, text: str) -> None:
        """Written only while this process still holds ``model``'s lock, when it took it: the lease
        is renewed first (compare-and-swap on the lock object), and a lost lock aborts the write."""
        key = f"{check_part(model, 'model name')}/{CONFIG}"
        lease = self.leases.get(model)
        if lease is not None:
            lease.renew(key)
        self.write(key, text.encode("utf-8"))
        self.written_configs[model] = text

    @property
    def written_configs(self) -> dict[str, str]:
        """The last config this store object wrote for each model (what a store that cannot be
        read now lists, as far as this process knows)."""
        if "_configs" not in self.__dict__:
            self.__dict__["_configs"] = {}
        return self.__dict__["_configs"]  # type: ignore[no-any-return]

    def renew_leases(self) -> None:
        """Renew every lease this store holds now; StorageError when one was lost."""
        for lease in list(self.leases.values()):
            lease.renew()

    @property
    def leases(self) -> dict[str, Lease]:
        if "_leases" not in self.__dict__:
            self.__dict__["_leases"] = {}
        return self.__dict__["_leases"]  # type: ignore[no-any-return]

    @property
    def changed_keys(self) -> set[str]:
        """Keys this store object wrote or deleted (or may have: the request reached the store)."""
        if "_changed" not in self.__dict__:
            self.__dict__["_changed"] = set()
        return self.__dict__["_changed"]  # type: ignore[no-any-return]

    def note_change(self, key: str) -> None:
        """Called before each write or delete: fenced (:meth:`fence`) under a locked model."""
        if key.startswith(LOCK_PREFIX):
            return
        self.fence(key.split("/", 1)[0], key)
        self.changed_keys.add(key)

    def fence(self, model: str, key: str = "") -> None:
        """Before a write or delete of ``key`` under ``model`` (its archive's copy included): a
        StorageError naming who holds the lock now when this store held ``model``'s lock and lost
        it, or its lease is past its end (another holder's, or soon: nothing of it is changed from
        here, a rollback included).  A held lease is proven again first (a compare-and-swap
        renewal) when its last proof is older than a few seconds (lease.RECHECK_S)."""
        holder = self.lease_holder
        lease = holder.leases.get(model) or holder.lost_leases.get(model)
        if lease is not None:
            lease.check(key)

    def fenced(self, proven_only: bool = False) -> list[str]:
        """One line per model whose lock this store held and lost ("lock of scorer lost: now held
        by <holder>", "lock of scorer lost: lease ran out at <when>"); empty while every lease is
        held.  Asks the store (a renewal) only for leases not known lost; never raises: a store
        that cannot be reached proves nothing, and its lease counts as lost from then on ("lock of
        scorer lost: not proven, the store could not be reached (<why>)").  ``proven_only``: only
        the leases known lost to time or to another holder, not those the store could not be asked
        about (no one else can hold those before their end)."""
        leases = {**self.lost_leases, **self.leases}
        lines = [(lease, line) for _, lease in sorted(leases.items()) if (line := lease.prove())]
        return [line for lease, line in lines if not (proven_only and lease.unproven)]

    @property
    def lost_leases(self) -> dict[str, Lease]:
        """Leases this store lost and released: its writes under those models stay refused until
        it takes the lock again."""
        if "_lost_leases" not in self.__dict__:
            self.__dict__["_lost_leases"] = {}
        return self.__dict__["_lost_leases"]  # type: ignore[no-any-return]

    @property
    def lease_holder(self) -> RepositoryStore:
        """The store whose leases fence this one's writes: itself; an archive, its store's."""
        return self.__dict__.get("_lease_holder", self)  # type: ignore[no-any-return]

    def fenced_with(self, store: RepositoryStore) -> None:
        """Fence this store's writes (an archive's) with ``store``'s leases."""
        self.__dict__["_lease_holder"] = store.lease_holder

    def changed_under(self, prefix: str) -> bool:
        """Whether this store object changed anything under ``prefix`` (nothing: no rollback)."""
        return any(key.startswith(prefix) for key in self.changed_keys)

    @property
    def lock_notes(self) -> list[str]:
        """Locks this store could not release (the store unreachable): where each was left."""
        if "_lock_notes" not in self.__dict__:
            self.__dict__["_lock_notes"] = []
        return self.__dict__["_lock_notes"]  # type: ignore[no-any-return]

    @contextmanager
    def lock(
        self, model: str, owner: str | None = None, ttl: float = LEASE_S, wait: float = 0.0
    ) -> Iterator[Lease]:
        """Hold ``model``'s lock; wait up to ``wait`` seconds for another holder, take stale ones.

        The lease (``ttl`` seconds, judged by the store's clock: the lock object's LastModified) is
        renewed by a thread every third of it while held, and by every config write of the model.
        A stale lock (lease run out, or its holder on this machine is gone) is taken over with a
        compare-and-swap on the lock object itself, so of two processes taking over the same
        stale lock exactly one wins.  A release that fails (the store unreachable) is noted in
        ``lock_notes``, never raised: it must not hide what the holder was doing.  While held, and
        after it was lost, every write under the model is fenced (:meth:`fence`)."""
        check_part(model, "model name")
        key = lock_key(model)
        lease = Lease(self, key, model, owner or default_owner(), ttl)
        deadline = time.monotonic() + wait
        while not self.create(key, lease.payload()):
            found = self.lock_state(key)
            if found is None:
                continue  # released meanwhile: race for it again
            held = parse_lock(model, *found)
            if held.stale:
                if self.replace(key, lease.payload(), found[1]):
                    break  # taken over
                continue
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"{self.uri}: model '{model}' is locked by {held.describe()}",
                    fix="wait for that promotion to finish; a crashed holder's lock expires by itself "
                    "(or 'mlreg store unlock MODEL' once its lease ran out)",
                    model=model,
                    holder=held.owner,
                )
            time.sleep(0.2)
        lease.held()
        self.leases[model] = lease
        self.lost_leases.pop(model, None)
        try:
            yield lease
        finally:
            self.leases.pop(model, None)
            note = lease.release()
            if note:
                self.lock_notes.append(note)
            if lease.lost:
                self.lost_leases[model] = lease  # still fenced: another holder's, or nobody's


def _differs(stored: Manifest, manifest: Manifest) -> bool:
    """Whether the stored manifest must be rewritten (other files, other config, or edited)."""
    return (
        stored.files != manifest.files
        or stored.config != manifest.config
        or stored.recorded_digest != manifest.digest
    )
