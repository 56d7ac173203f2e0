"""A full disk under MLflow, recognised in one place: ``ENOSPC`` (or a quota) anywhere in an
exception's chain, or sqlite's "database or disk is full" however MLflow wraps it."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from registry.errors import RegistryError

FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded")


def chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_disk_full(exc: BaseException) -> bool:
    for link in chain(exc):
        if isinstance(link, OSError) and link.errno in FULL_ERRNOS:
            return True
        if any(text in str(link).lower() for text in FULL_TEXTS):
            return True
    return False


def full_path(exc: BaseException, default: Path) -> Path:
    """Where the disk is full: of the files the chain's ``OSError``s name (their nearest existing
    folders) and ``default``, the one with the least space left -- ``default`` itself when it is
    on that same file system (a copy names its source first, which is not the full disk)."""
    places = [default]
    for link in chain(exc):
        if isinstance(link, OSError):
            for name in (link.filename2, link.filename):
                if name:
                    path = Path(str(name))
                    places.extend(p for p in (path.parent, *path.parents)[:1] if p.is_dir())
    fullest = min(places, key=_free)
    return default if _device(default) == _device(fullest) else fullest


def _free(path: Path) -> int:
    try:
        stats = os.statvfs(path)
    except OSError:
        return 1 << 62
    return stats.f_bavail * stats.f_frsize


def _device(path: Path) -> int:
    try:
        return path.stat().st_dev
    except OSError:
        return -1


def disk_full_error(exc: BaseException, default: Path, what: str) -> RegistryError:
    path = full_path(exc, default)
    return RegistryError(
        f"disk full at {path}: {what} failed",
        fix=f"free space at {path} ('df -h {path}'), then run the command again "
        "(what the failed command wrote was removed)",
        path=str(path),
    )


def remove_local(uri: str | None) -> None:
    """Remove a local artifact folder (``file://`` or a plain path); remote ones are left."""
    if not uri:
        return
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return
    path = Path(unquote(parsed.path if parsed.scheme else uri))
    shutil.rmtree(path, ignore_errors=True)
