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
from typing import Any

from registry.errors import StorageError
from registry.manifest import sha256_file

MANIFEST = ".mlreg-manifest.json"
LOCK_PREFIX = ".mlreg-lock."
CONFIG = "config.pbtxt"
NAME_PART = re.compile(r"^[0-9A-Za-z.\-_]+$")
CHUNK = 1 << 20
Progress = Callable[[int], None]  # bytes just sent


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
    """Relative POSIX path -> file, for every file under ``folder`` (names checked)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            rel = path.relative_to(folder).as_posix()
            for part in rel.split("/"):
                check_part(part, f"file name in {folder}")
            files[rel] = path
    return files


class DigestCache:
    """sha256 of local files keyed by (size, mtime, inode), so unchanged files are not re-read.

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

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = str(file.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.entries.get(key)
        if cached and cached[:3] == stamp:
            return str(cached[3])
        digest = sha256_file(file)
        self.entries[key] = [*stamp, digest]
        self.dirty = True
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
    files: dict[str, dict[str, Any]]  # rel path -> {"sha256": ..., "size": ...}
    created_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps({"files": self.files, "created_at": self.created_at}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        data = json.loads(text)
        return cls(files=dict(data["files"]), created_at=float(data.get("created_at", 0)))

    @classmethod
    def of_folder(cls, files: dict[str, Path], cache: DigestCache | None = None) -> Manifest:
        digest = cache.sha256 if cache is not None else sha256_file
        manifest = cls({rel: {"sha256": digest(p), "size": p.stat().st_size} for rel, p in files.items()})
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


@dataclass
class LockInfo:
    owner: str
    expires_at: float

    @property
    def stale(self) -> bool:
        """Expired, or held by a process of this machine that no longer runs (killed)."""
        if time.time() > self.expires_at:
            return True
        host, _, pid = self.owner.rpartition("@")[2].partition(":")
        if host == socket.gethostname() and pid.isdigit():
            return not Path(f"/proc/{pid}").exists() or _zombie(int(pid))
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in {"Z", "X"}
    except OSError:
        return True


def default_owner() -> str:
    return f"{os.environ.get('USER', 'user')}@{socket.gethostname()}:{os.getpid()}"


class RepositoryStore(ABC):
    """A Triton model repository in some storage. Subclasses implement the primitives."""

    uri: str
    digests: DigestCache

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
        """The sha256 recorded with the stored object, None when absent or unknown."""

    # -- repository operations ---------------------------------------------------------------

    def list_models(self) -> list[str]:
        return sorted(self.children(""))

    def list_versions(self, model: str) -> list[str]:
        return sorted((v for v in self.children(f"{model}/") if v.isdigit()), key=int)

    def read_config(self, model: str) -> str | None:
        data = self.read(f"{check_part(model, 'model name')}/{CONFIG}")
        return None if data is None else data.decode("utf-8")

    def write_config(self, model: str, text: str) -> None:
        self.write(f"{check_part(model, 'model name')}/{CONFIG}", text.encode("utf-8"))

    def read_manifest(self, model: str, version: str) -> Manifest | None:
        data = self.read(f"{model}/{version}/{MANIFEST}")
        if data is None:
            return None
        try:
            return Manifest.from_json(data)
        except (ValueError, KeyError) as exc:
            raise StorageError(
                f"{self.uri}: the manifest of {model}/{version} is unreadable: {exc}",
                fix="push the version again to rewrite it",
            ) from exc

    def get_version(self, model: str, version: str, dest: Path) -> Path:
        """Download ``<model>/<version>/`` into ``dest`` (the manifest left out); return dest."""
        dest.mkdir(parents=True, exist_ok=True)
        prefix = f"{model}/{version}/"
        for key in self.list_prefix(prefix):
            rel = key[len(prefix) :]
            if rel == MANIFEST:
                continue
            data = self.read(key)
            if data is None:
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
        return dest

    def delete_version(self, model: str, version: str) -> None:
        for key in self.list_prefix(f"{model}/{version}/"):
            if not key.endswith(MANIFEST):
                self.delete(key)
        self.delete(f"{model}/{version}/{MANIFEST}")  # last: an interrupted delete is incomplete

    def put_version(
        self, model: str, version: str, folder: Path, progress: Progress | None = None
    ) -> UploadResult:
        """Upload ``folder`` as ``<model>/<version>/``; only files not already stored are sent."""
        check_part(model, "model name")
        check_part(version, "version")
        if not version.isdigit():
            raise StorageError(f"version '{version}' is not a number", fix="use 1, 2, 3, ...")
        files = local_files(folder)
        manifest = Manifest.of_folder(files, self.digests)
        stored = self.read_manifest(model, version)
        result = UploadResult(model, version)
        for rel, path in files.items():
            key = f"{model}/{version}/{rel}"
            digest = manifest.files[rel]["sha256"]
            known = stored.files.get(rel, {}).get("sha256") if stored else self.stored_digest(key)
            if known == digest:
                result.skipped.append(rel)
                continue
            self.delete(f"{model}/{version}/{MANIFEST}")  # the version is incomplete from here
            self.put_file(key, path, digest, progress)
            result.sent.append(rel)
            result.bytes_sent += int(manifest.files[rel]["size"])
        for key in self.list_prefix(f"{model}/{version}/"):
            rel = key.split("/", 2)[2]
            if rel != MANIFEST and rel not in files:  # files the new version no longer has
                self.delete(key)
        if result.sent or stored is None or stored.files != manifest.files:
            self.write(f"{model}/{version}/{MANIFEST}", manifest.to_json().encode())
        return result

    # -- locking -----------------------------------------------------------------------------

    def read_lock(self, model: str) -> LockInfo | None:
        found = self.read_versioned(lock_key(model))
        return None if found is None else _parse_lock(found[0])

    @contextmanager
    def lock(
        self, model: str, owner: str | None = None, ttl: float = 900.0, wait: float = 0.0
    ) -> Iterator[LockInfo]:
        """Hold ``model``'s lock; wait up to ``wait`` seconds for another holder, take stale ones.

        A stale lock (expired, or its holder on this machine is gone) is taken over with a
        compare-and-swap on the lock object itself, so of two processes taking over the same
        stale lock exactly one wins."""
        check_part(model, "model name")
        me = LockInfo(owner or default_owner(), time.time() + ttl)
        mine = json.dumps(me.__dict__).encode()
        key = lock_key(model)
        deadline = time.monotonic() + wait
        while not self.create(key, mine):
            found = self.read_versioned(key)
            if found is None:
                continue  # released meanwhile: race for it again
            held = _parse_lock(found[0])
            if held.stale:
                if self.replace(key, mine, found[1]):
                    break  # taken over
                continue
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"{self.uri}: model '{model}' is locked by {held.owner} until "
                    f"{time.strftime('%H:%M:%S', time.localtime(held.expires_at))}",
                    fix="wait for that promotion to finish; a crashed holder's lock expires by itself",
                    model=model,
                    holder=held.owner,
                )
            time.sleep(0.2)
        try:
            yield me
        finally:
            found = self.read_versioned(key)
            if found is not None and _parse_lock(found[0]).owner == me.owner:
                self.delete_if_unchanged(key, found[1])  # not a lock taken over meanwhile


def _parse_lock(data: bytes) -> LockInfo:
    try:
        raw = json.loads(data)
        return LockInfo(str(raw["owner"]), float(raw["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return LockInfo("(unreadable lock)", 0.0)  # stale: taken over by compare-and-swap
