"""A full disk under the registry, recognised in one place: ``ENOSPC`` (or a quota) anywhere in an
exception's chain, or sqlite's "database or disk is full" however MLflow wraps it; and the local
folders behind ``file://`` artifact URIs (read, or removed after a failed registration)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from registry.errors import MlregError, RegistryError

FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded")
REMOVED = "(what the failed command wrote was removed)"


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
    fullest = min(places, key=free_bytes)
    return default if _device(default) == _device(fullest) else fullest


def free_bytes(path: Path) -> int:
    """Bytes free for an unprivileged writer on ``path``'s file system (huge when unknown)."""
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
    """Where the disk is full and what failed; a caller that removed what the command wrote says
    so with ``cleaned_up`` (the claim is the caller's to make)."""
    path = full_path(exc, default)
    return RegistryError(
        f"disk full at {path}: {what} failed",
        fix=f"free space at {path} ('df -h {path}'), then run the command again",
        path=str(path),
    )


def cleaned_up(error: MlregError) -> MlregError:
    """``error``, saying that what the failed command wrote was removed."""
    fix = f"{error.fix} {REMOVED}" if error.fix else REMOVED
    return type(error)(error.message, fix=fix, **error.context)


def local_path(uri: str | None) -> Path | None:
    """The folder a ``file://`` (or plain path) artifact URI names; None for a remote one."""
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path if parsed.scheme else uri))


def remove_local(uri: str | None, within: Path | None = None) -> None:
    """Remove a local artifact folder (``file://`` or a plain path); remote ones are left.  The
    folders MLflow made above it (``<run id>/`` of ``<run id>/artifacts``, ``models/<id>/``) go
    too once empty, up to ``within`` (the registry's artifact root), which stays."""
    path = local_path(uri)
    if path is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    if within is None or within.resolve() not in path.resolve().parents:
        return
    for parent in path.resolve().parents:
        if parent == within.resolve():
            return
        try:
            parent.rmdir()  # only an empty one
        except OSError:
            return
