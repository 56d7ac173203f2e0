"""sha256 manifests of folders (what a version's bytes are), shared by registry and storage.

``digest_of_manifest`` is the one digest of a version: the ``artifact_digest`` that registration
records in MLflow (the version folder's files plus an entry ``config.pbtxt`` for the model's
registered config; TensorFlow's ``fingerprint.pb`` left out, it holds a random UUID per save) and
the ``digest`` a store manifest carries, so the two can be compared before a load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from registry.contracts.links import refuse_outside_links
from registry.errors import RegistryError

CHUNK = 4 << 20
SKIPPED_PARTS = {"__pycache__"}
CONFIG_ENTRY = "config.pbtxt"
# TensorFlow writes a random UUID into fingerprint.pb on every save; its other fields are hashes
# of saved_model.pb and the variables, which the digest covers already.
VOLATILE = {"fingerprint.pb"}


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 4 MiB blocks into one reused buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def digest_of_manifest(files: dict[str, dict[str, Any]]) -> str:
    """One sha256 for a whole version folder (names, sizes and file digests), ``VOLATILE`` files
    left out (``registry.lineage`` re-exports it)."""
    lines = "".join(
        f"{rel}\0{meta['size']}\0{meta['sha256']}\n"
        for rel, meta in sorted(files.items())
        if rel.rsplit("/", 1)[-1] not in VOLATILE
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def folder_files(folder: Path) -> dict[str, Path]:
    """Relative POSIX path -> file under the version folder ``folder``.

    Refuses links that leave the model folder (``folder``'s parent), the version folder itself
    being such a link included (:mod:`registry.contracts.links`)."""
    refuse_outside_links(folder.parent, folder, RegistryError)
    files: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        if SKIPPED_PARTS & set(path.parts) or path.suffix == ".pyc":
            continue
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


def artifact_digest(version_dir: Path, config_path: Path) -> str:
    """The digest registration records as ``artifact_digest``: the version folder's files and the
    registered config.pbtxt."""
    config = {"sha256": sha256_file(config_path), "size": config_path.stat().st_size}
    return digest_of_manifest({**manifest_of(version_dir), CONFIG_ENTRY: config})
