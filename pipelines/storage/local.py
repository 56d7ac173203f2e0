"""The local-folder store: the embedded default, which Triton reads directly."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from pipelines.storage.closed_world import is_version_folder
from pipelines.storage.disk import disk_full_error, is_disk_full, where_full
from pipelines.storage.manifest import DigestCache, Stamp, file_stamp
from pipelines.storage.objects import (
    CHUNK,
    LOCK_PREFIX,
    TEMP_PREFIX,
    LockState,
    ObjectStore,
    Progress,
)
from pipelines.storage.verify import BYTECODE_GUARD
from registry.contracts.links import outside_links
from registry.errors import StorageError
from registry.manifest import sha256_file


class LocalObjects(ObjectStore):
    """The objects of a local folder: files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.uri = str(self.root)
        self.digests = DigestCache(None)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _fail(self, what: str, key: str, exc: OSError, *more: Path) -> StorageError:
        """A failed file operation: a full disk says where and to free space (``more``: other
        folders it wrote to, e.g. a copy's destination); anything else names the error."""
        if is_disk_full(exc):
            path = where_full(exc, (self.root, *more))
            store = "" if path == self.root else f" of the store {self.uri}"
            error = disk_full_error(exc, f"cannot {what} '{key}'{store}", path)
            error.context["key"] = key
            return error
        return StorageError(
            f"{self.uri}: cannot {what} '{key}': {exc.strerror or exc}",
            fix="check the folder exists and is writable",
            key=key,
        )

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from exc

    def _temp(self) -> Path:
        """A temporary file at the store's root, never under a model folder (``TEMP_PREFIX``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f"{TEMP_PREFIX}{os.getpid()}.{secrets.token_hex(4)}"

    def write(self, key: str, data: bytes) -> None:
        """Atomic (a temporary file at the root renamed over the old one); on any failure -- a
        full disk, a signal -- the temporary file is removed."""
        path = self._path(key)
        tmp = self._temp()
        self.journal.note_change(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)  # atomic: readers see the old or the new file
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._fail("write", key, exc) from exc
            raise

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        self.journal.note_change(key)
        tmp = self._temp()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.link(tmp, path)  # atomic, and readers never see the file empty
        except FileExistsError:
            return False
        except OSError as exc:
            raise self._fail("create", key, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return True

    # Compare-and-swap on one file: writers hold an exclusive flock on it, readers a shared one;
    # the token is the content's digest plus the inode, so a file made anew never matches.

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            with self._path(key).open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
                data = f.read()
                return data, _token(data, os.fstat(f.fileno()).st_ino)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from exc

    def _locked_if_unchanged(self, key: str, token: str, change: Callable[[BinaryIO], None]) -> bool:
        path = self._path(key)
        try:
            with path.open("r+b") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                inode = os.fstat(f.fileno()).st_ino
                if _token(f.read(), inode) != token or os.stat(path).st_ino != inode:
                    return False
                change(f)
                return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._fail("write", key, exc) from exc

    def replace(self, key: str, data: bytes, token: str) -> bool:
        def overwrite(f: BinaryIO) -> None:
            f.seek(0)
            f.truncate()
            f.write(data)
            f.flush()

        return self._locked_if_unchanged(key, token, overwrite)

    def delete_if_unchanged(self, key: str, token: str) -> None:
        self._locked_if_unchanged(key, token, lambda _: self._path(key).unlink())

    def delete(self, key: str) -> None:
        path = self._path(key)
        self.journal.note_change(key)
        try:
            path.unlink(missing_ok=True)
        except IsADirectoryError:
            shutil.rmtree(path)
        except OSError as exc:
            raise self._fail("delete", key, exc) from exc
        parent = path.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def guard_bytecode(self, model: str, version: str) -> list[str]:
        folder = self._path(f"{model}/{version}")
        if not folder.is_dir() or folder.is_symlink():
            return []
        try:  # an unlistable folder or a guard that cannot be written: a StorageError, no traceback
            return [_guard(self, parent) for parent in sorted(_source_folders(folder)) if _unguarded(parent)]
        except OSError as exc:
            raise _unguardable(self.uri, model, version, exc) from exc

    def model_entries(self, model: str) -> tuple[dict[str, Stamp], list[tuple[str, str]]]:
        """One walk of ``<model>/`` (links never followed): :func:`walk_model`."""
        return walk_model(self._path(model), model)

    def before_upload(self, prefix: str) -> None:
        """Temporary files interrupted uploads left at the root (their process gone): removed."""
        sweep_temps(self.root)

    def list_prefix(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def relocate(self, folder: str) -> None:
        """``<parent>/<folder>/<name>/``: beside the folder Triton reads, on its file system."""
        self.root = self.root.parent / folder / self.root.name
        self.uri = str(self.root)

    def listing(self, prefix: str = "") -> list[tuple[str, int, float]]:
        return file_listing(self.root, prefix)

    def children(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def put_file(self, key: str, path: Path, sha256: str, progress: Progress | None) -> None:
        """Copy, hashing the bytes as they are written: the stored copy's digest is proven once,
        here, and remembered for its stamp (no second read before a load)."""
        target = self._path(key)
        tmp = self._temp()  # at the root: an interrupted upload leaves nothing Triton reads
        digest = hashlib.sha256()
        self.journal.note_change(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as src, tmp.open("wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    if progress:
                        progress(len(chunk))
            tmp.replace(target)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._fail("write", key, exc) from exc
            raise
        if digest.hexdigest() != sha256:
            raise StorageError(
                f"{self.uri}: '{path}' changed while it was stored as '{key}' "
                f"(sha256 {digest.hexdigest()}, expected {sha256})",
                fix="push again once nothing writes to the folder",
                key=key,
            )
        self.digests.remember(self.cache_key(key), file_stamp(target.stat()), sha256)

    def stored_digest(self, key: str) -> str | None:
        path = self._path(key)
        return self.digests.sha256(path) if path.is_file() else None

    def cache_key(self, key: str) -> str:
        return str(self._path(key).resolve())

    def object_stamps(self, prefix: str) -> dict[str, Stamp]:
        stamps = {}
        for key in self.list_prefix(prefix):
            try:
                stamps[key] = file_stamp(self._path(key).stat())
            except OSError:
                continue  # gone meanwhile (or a broken link): missing
        return stamps

    def hash_object(self, key: str) -> tuple[str, Stamp] | None:
        path = self._path(key)
        try:
            before = file_stamp(path.stat())
            digest = sha256_file(path)
            after = file_stamp(path.stat())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from exc
        return digest, after if after == before else [after[0], 0, 0, 0]  # changed while read

    def copy_object_to(self, key: str, dest: ObjectStore, dest_key: str, size: int | None = None) -> None:
        """A copy hashed as it is written (never a hard link: a file with two names can change
        through the one mlreg does not watch, so the closed world refuses it under a model folder),
        its digest remembered for the copy's stamp -- the check of the copy against its manifest that
        follows (``archive.complete``) then compares every file's sha256 without reading it again."""
        if not isinstance(dest, LocalObjects):
            super().copy_object_to(key, dest, dest_key)
            return
        source, target = self._path(key), dest._path(dest_key)
        dest.journal.note_change(dest_key)
        tmp = dest._temp()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = _hashed_copy(source, tmp)
            tmp.replace(target)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._fail("copy", key, exc, dest.root) from exc
            raise
        dest.digests.remember(dest.cache_key(dest_key), file_stamp(target.stat()), digest)

    def move_version_to(self, dest: ObjectStore, model: str, version: str) -> bool:
        """One ``rename`` of the version folder (atomic: the version is in one place or the other);
        a stale partial copy at the destination is removed first.  False where ``dest`` is on
        another file system (``EXDEV``: an archive mounted apart): the caller copies, checks the
        copy, then deletes (:func:`pipelines.storage.archive.move_to_archive`)."""
        if not isinstance(dest, LocalObjects):
            return False
        source, target = self._path(f"{model}/{version}"), dest._path(f"{model}/{version}")
        self.journal.note_change(f"{model}/{version}/")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            os.rename(source, target)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                return False
            raise self._fail("move", f"{model}/{version}", exc, dest.root) from exc
        model_folder = source.parent
        if model_folder.is_dir() and not any(model_folder.iterdir()):
            model_folder.rmdir()
        return True

    def lock_state(self, key: str) -> LockState | None:
        """The lock file, its token, its mtime and this machine's clock (the folder's own)."""
        path = self._path(key)
        try:
            with path.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
                data = f.read()
                st = os.fstat(f.fileno())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", key, exc) from exc
        return data, _token(data, st.st_ino), st.st_mtime, time.time()

    def lock_models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name[len(LOCK_PREFIX) : -len(".json")] for p in self.root.glob(f"{LOCK_PREFIX}*.json")
        )

    def outside_links(self, model: str, version: str) -> list[str]:
        folder = self._path(model)
        return [
            link.link.relative_to(folder / version).as_posix() if link.link != folder / version else "."
            for link in outside_links(folder, folder / version)
        ]


def _guard(objects: LocalObjects, parent: Path) -> str:
    """The bytecode guard written in ``parent`` (its key)."""
    guard = parent / BYTECODE_GUARD
    key = guard.relative_to(objects.root).as_posix()
    if guard.is_symlink() or guard.exists():
        objects.delete(key)  # a cache folder the stub wrote before the guard, or anything else
    objects.write(key, b"")
    return key


def file_listing(root: Path, prefix: str) -> list[tuple[str, int, float]]:
    """Every regular file under ``root``/``prefix`` (links not followed): key, size and mtime."""
    base = root / prefix if prefix else root
    found = []
    for path in sorted(base.rglob("*")) if base.is_dir() else []:
        try:
            stat = path.lstat()
        except FileNotFoundError:
            continue  # removed while listed
        if path.is_file() and not path.is_symlink():
            found.append((path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime))
    return found


def walk_model(base: Path, model: str) -> tuple[dict[str, Stamp], list[tuple[str, str]]]:
    """Each regular file's stamp under the model folder ``base`` (keys ``<model>/...``), and every
    link, hard link, non-regular file and empty folder but an empty version folder, where nothing
    is read (see closed_world.py)."""
    if base.is_symlink():
        return {}, [("", "is a symbolic link: the model folder lies elsewhere")]
    stamps: dict[str, Stamp] = {}
    odd: list[tuple[str, str]] = []

    def unlistable(exc: OSError) -> None:  # Triton (root, maybe) may read what mlreg cannot list
        where = Path(exc.filename) if exc.filename else base
        if isinstance(exc, FileNotFoundError):
            return  # the model folder absent, or a folder removed meanwhile: nothing there to read
        rel = "" if where == base else where.relative_to(base).as_posix() + "/"
        odd.append(
            (rel, f"cannot be listed by mlreg ({exc.strerror or exc}): Triton may read what mlreg cannot")
        )

    for here, dirs, files in os.walk(base, onerror=unlistable):
        rel = os.path.relpath(here, base).replace(os.sep, "/")
        inner = "" if rel == "." else f"{rel}/"
        if not dirs and not files and inner and not is_version_folder(rel):
            odd.append((inner, "is an empty folder mlreg never makes"))
        for name in [d for d in dirs if os.path.islink(os.path.join(here, d))]:
            dirs.remove(name)
            odd.append((inner + name, _link_why(os.path.join(here, name), base)))
        for name in files:
            path = os.path.join(here, name)
            if os.path.islink(path):
                odd.append((inner + name, _link_why(path, base)))
            else:
                _file_entry(path, f"{model}/{inner}{name}", inner + name, stamps, odd)
    return stamps, odd


def _unguardable(uri: str, model: str, version: str, exc: OSError) -> StorageError:
    return StorageError(
        f"{uri}: cannot guard {model}/{version}/ against bytecode caches: {exc}",
        fix=f"give mlreg read and write access to the store's {model}/{version}/ folder, then check "
        f"with 'mlreg store verify {model} {version}'",
        model=model,
        version=version,
    )


def _unguarded(parent: Path) -> bool:
    """False when ``parent``'s guard is in place: nothing changes (the served folder stays as
    Triton read it)."""
    guard = parent / BYTECODE_GUARD
    return not (guard.is_file() and not guard.is_symlink() and guard.stat().st_size == 0)


def _source_folders(folder: Path) -> set[Path]:
    """The folders under ``folder`` holding a ``.py`` file (links never followed); OSError when one
    cannot be listed (never skipped: its bytecode could not be guarded)."""

    def refuse(exc: OSError) -> None:
        raise exc

    found = set()
    for here, dirs, files in os.walk(folder, onerror=refuse):
        dirs[:] = [d for d in dirs if d != BYTECODE_GUARD and not os.path.islink(os.path.join(here, d))]
        if any(f.endswith(".py") and os.path.isfile(os.path.join(here, f)) for f in files):
            found.add(Path(here))
    return found


def _link_why(path: str, model_folder: Path) -> str:
    target = Path(os.path.realpath(path))
    if target != model_folder.resolve() and not target.is_relative_to(model_folder.resolve()):
        return f"is a link leaving the model folder (to {target}): mlreg never stores one"
    return "is a symbolic link: mlreg never stores one (what it leads to is not verified)"


TEMP_AGE_S = 600.0  # a temporary file untouched that long, its process gone, is litter


def _file_entry(path: str, key: str, rel: str, stamps: dict[str, Stamp], odd: list[tuple[str, str]]) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # gone meanwhile: missing
    except OSError as exc:  # listed, but mlreg may not look at it: Triton may
        odd.append(
            (rel, f"cannot be read by mlreg ({exc.strerror or exc}): Triton may read what mlreg cannot")
        )
        return
    if not stat.S_ISREG(st.st_mode):
        odd.append((rel, "is not a regular file (a FIFO, socket or device): reading it may never end"))
    else:
        if st.st_nlink > 1:
            odd.append(
                (
                    rel,
                    f"is a hard link ({st.st_nlink} names): its bytes can change through a name "
                    "mlreg does not watch",
                )
            )
        stamps[key] = file_stamp(st)


def sweep_temps(root: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary files (``TEMP_PREFIX<pid>.<hex>`` at ``root``) whose process is not
    running on this machine and that nothing wrote to for ``TEMP_AGE_S``: what an upload cut by
    a signal or a crash left.  Only names mlreg makes; best effort.  Returns what was removed."""
    removed = []
    now = time.time() if now is None else now
    for path in root.glob(f"{TEMP_PREFIX}*"):
        pid = path.name[len(TEMP_PREFIX) :].split(".", 1)[0]
        try:
            if not pid.isdigit() or _running(int(pid)) or now - path.lstat().st_mtime < TEMP_AGE_S:
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's: running
    return True


def _hashed_copy(source: Path, target: Path) -> str:
    """Copy ``source`` to ``target``; the sha256 of the bytes written."""
    digest = hashlib.sha256()
    with source.open("rb") as src, target.open("wb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def _token(data: bytes, inode: int) -> str:
    return f"{hashlib.sha256(data).hexdigest()}:{inode}"
