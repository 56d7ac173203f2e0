"""sha256 manifests of folders (what a version's bytes are), shared by registry and storage."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from registry.errors import RegistryError

CHUNK = 1 << 20
SKIPPED_PARTS = {"__pycache__"}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_files(folder: Path) -> dict[str, Path]:
    """Relative POSIX path -> file under ``folder``; refuses links that leave it."""
    root = folder.resolve()
    files: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        if SKIPPED_PARTS & set(path.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root):
                raise RegistryError(
                    f"{path} is a link to {target}, outside the folder being registered",
                    fix="copy the file into the folder instead of linking to it",
                    file=str(path),
                )
        if path.is_file():
            files[path.relative_to(folder).as_posix()] = path
        elif not path.is_dir():
            raise RegistryError(
                f"{path} is not a regular file (a broken link or a device?)",
                fix="remove it or replace it with the real file",
                file=str(path),
            )
    return files


def manifest_of(folder: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rel, path in folder_files(folder).items():
        try:
            out[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
        except OSError as exc:
            raise RegistryError(
                f"cannot read {path}: {exc.strerror or exc}",
                fix="check the file's permissions",
                file=str(path),
            ) from exc
    return out
