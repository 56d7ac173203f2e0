"""The object store: the primitives a storage offers (read, write, conditional writes, listings,
uploads, digests), and nothing of a promotion's session.

:class:`ObjectStore` is implemented by a local folder (:mod:`pipelines.storage.local`) and S3
(:mod:`pipelines.storage.s3`).  Every write or delete first tells the objects' ``journal``
(:class:`Journal`): none for bare objects (a ledger's, a capture's), the session of the
repository that holds them (:class:`pipelines.storage.base.Repository`), which fences it and
records it in its change journal.  Key names, the lock's and the
archive's, are here too (see :mod:`pipelines.storage.base` for the layout).
"""

from __future__ import annotations

import copy
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol, Self

from pipelines.storage.manifest import DigestCache, Stamp
from registry.errors import StorageError

LOCK_PREFIX = ".mlreg-lock."
ARCHIVE = ".mlreg-archive"  # beside the store, never in it: see pipelines/storage/archive.py
ROOT_MARKER = ".mlreg-root.json"  # written by `mlreg store init`: a file at the root, never a model
CONFIG = "config.pbtxt"
TEMP_PREFIX = ".mlreg-tmp."  # a local store's temporary files: at the root (Triton ignores files there)
NAME_PART = re.compile(r"^[0-9A-Za-z.\-_]+$")
CHUNK = 1 << 20
Progress = Callable[[int], None]  # bytes just sent
LockState = tuple[bytes, str, float | None, float | None]  # bytes, token, written at, store's now


def lock_key(model: str) -> str:
    """The model's lock: a file at the root, outside the model folder (see base.py)."""
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


class Journal(Protocol):
    """What the objects tell before each write or delete (a repository's session: it fences the
    write and records it)."""

    def note_change(self, key: str) -> bool:
        """Before a write or delete of ``key``; True when ``key`` is new to the journal."""
        ...

    def unsent_change(self, key: str) -> None:
        """The write or delete of ``key`` just noted provably never reached the store."""
        ...


class Unjournaled:
    """No journal: bare objects, whose writes no lock fences and no undo takes back."""

    def note_change(self, key: str) -> bool:
        return False

    def unsent_change(self, key: str) -> None:
        return None


UNJOURNALED = Unjournaled()


class ObjectStore(ABC):
    """Objects under one root, keyed by relative POSIX paths. Subclasses implement the primitives."""

    uri: str
    digests: DigestCache
    clock_grain = 0.0  # how coarse the store's clock is (lock times): S3's are whole seconds
    journal: Journal = UNJOURNALED  # a repository over these objects sets its session

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

    def beside(self, folder: str) -> Self:
        """The objects at ``<parent>/<folder>/<this store's name>``: beside these (in the same bucket,
        on the same file system), through the same connection and digest cache, with no journal;
        a StorageError where there is no place beside them (a store at a bucket's root)."""
        other = copy.copy(self)
        other.journal = UNJOURNALED
        other.relocate(folder)
        return other

    def place_beside(self, folder: str) -> tuple[Self, str]:
        """Where a folder ``folder`` beside these objects goes (a ledger's place): the objects
        there and the prefix of its keys -- ``beside(folder)`` and ``""``; S3 at a bucket's root,
        which has no place beside it: the root's objects and ``"<folder>."`` (files at the root,
        which Triton ignores)."""
        return self.beside(folder), ""

    @abstractmethod
    def relocate(self, folder: str) -> None:
        """Point this (fresh) copy at ``<parent>/<folder>/<name>`` (``beside`` only)."""

    @abstractmethod
    def listing(self, prefix: str = "") -> list[tuple[str, int, float]]:
        """(key, size, modification time in epoch seconds) of every object under ``prefix``, in one
        listing (what is not a repository's, e.g. the trace files a shadow replay reads)."""

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

    # -- hooks and primitives with a default ------------------------------------------------------

    def write_stamp(self, key: str) -> datetime | None:
        """When the object was last written, where a reader compares those times at a grain a
        rewrite can miss (S3's LastModified: whole seconds; ``StoreSession.write_config`` writes
        a config again until it grew); None where none does (a local folder) or it is absent."""
        return None

    def delete_keys(self, keys: list[str]) -> None:
        """Delete every key, in order (S3: batched)."""
        for key in keys:
            self.delete(key)

    def lock_state(self, key: str) -> LockState | None:
        """The lock object's bytes, its token, when the store last wrote it and the store's clock
        now (epoch seconds; None where the store cannot tell: the host's clock is used then)."""
        found = self.read_versioned(key)
        return None if found is None else (found[0], found[1], None, None)

    def lock_models(self) -> list[str]:
        """Every model with a lock object at the root."""
        return []

    def before_upload(self, prefix: str) -> None:
        """Called before the first file of a version under ``prefix`` is sent (S3: incomplete
        multipart uploads an interrupted push left there are aborted)."""
        return None

    def model_entries(self, model: str) -> tuple[dict[str, Stamp], list[tuple[str, str]]]:
        """Everything under ``<model>/`` in one listing: key -> stamp of each object, and (path
        under the model folder, why) of each entry that is not a plain object (only a local folder
        has those: links, FIFOs, empty folders).  See :mod:`pipelines.storage.closed_world`."""
        return self.object_stamps(f"{model}/"), []

    def outside_links(self, model: str, version: str) -> list[str]:
        """Links in the stored version that leave its model folder (only a local folder has links)."""
        return []

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

    def copy_object_to(self, key: str, dest: ObjectStore, dest_key: str, size: int | None = None) -> None:
        """Copy one object (``size`` bytes, when known) into ``dest`` (stores of one kind override
        this: server-side, a link)."""
        data = self.read(key)
        if data is None:
            raise StorageError(f"{self.uri}: '{key}' vanished while it was copied", fix="rerun", key=key)
        dest.write(dest_key, data)

    def move_version_to(self, dest: ObjectStore, model: str, version: str) -> bool:
        """Move a whole version folder into ``dest`` in one step where the storage can (a local
        rename); False when it cannot: the caller copies, checks, then deletes."""
        return False
