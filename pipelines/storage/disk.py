"""A full disk, said once: ``ENOSPC`` (or a quota) anywhere in an exception's chain -- a local
store's folder or its archive, ``TMPDIR`` (a promotion's work folder, the registry's copies),
``MLREG_HOME`` -- is one ``StorageError`` "disk full at PATH" whose fix is to free space there.

MLflow's own writes are said by :mod:`registry.disk` (a ``RegistryError``), whose test for a
full disk -- the errno, or the text sqlite and ``shutil.copytree`` carry -- is the one used here.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from registry.disk import FULL_ERRNOS, chain, free_bytes, is_disk_full
from registry.errors import StorageError

__all__ = ["disk_full_error", "is_disk_full", "where_full"]


def disk_full_error(exc: BaseException, what: str, *places: Path) -> StorageError:
    """The one error for a full disk: where (:func:`where_full`), what failed, and the fix."""
    path = where_full(exc, places)
    reason = next(
        (link.strerror for link in chain(exc) if isinstance(link, OSError) and link.errno in FULL_ERRNOS),
        None,
    )
    temp = path.resolve() == Path(tempfile.gettempdir()).resolve()
    return StorageError(
        f"disk full at {path}{' (TMPDIR)' if temp else ''}: {what} ({reason or 'No space left on device'})",
        fix=f"free space at {path} ('df -h {path}')"
        + (", or point TMPDIR at a folder with room" if temp else "")
        + ", then run the command again",
        path=str(path),
    )


def where_full(exc: BaseException, places: Iterable[Path] = ()) -> Path:
    """The full disk: of the folders the chain's errors name (a copy's destination first) and
    ``places``, the one with the least space left -- the first of ``places`` on that same file
    system when there is one (the store's root rather than a file deep in it)."""
    known = [p for p in places if p]
    named = [_existing(Path(p)) for p in _named(exc)]
    candidates = [p for p in named + [_existing(p) for p in known] if p is not None]
    if not candidates:
        return Path(tempfile.gettempdir())
    fullest = min(candidates, key=free_bytes)  # min keeps the first of equals: a named one
    return next((p for p in known if _same_device(p, fullest)), fullest)


def _named(exc: BaseException) -> Iterator[str]:
    """Paths the chain names: an ``OSError``'s (the destination of a copy first), and each entry
    of a ``shutil.Error`` (``copytree`` collects ``(source, destination, why)``)."""
    for link in chain(exc):
        if isinstance(link, shutil.Error) and link.args and isinstance(link.args[0], list):
            for entry in link.args[0]:
                if isinstance(entry, tuple) and len(entry) == 3:
                    yield str(entry[1])
        elif isinstance(link, OSError):
            yield from (str(name) for name in (link.filename2, link.filename) if name)


def _existing(path: Path) -> Path | None:
    """``path``'s nearest folder that exists (a file's own, or one above a removed one)."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            return folder
    return None


def _same_device(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False
