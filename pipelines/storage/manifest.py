"""A version's manifest and the digests behind it: a leaf (nothing first-party but ``registry.*``).

``Manifest`` is what ``<model>/<version>/.mlreg-manifest.json`` holds (every file's sha256 and
size, the config it was pushed with, and its own digest); ``Stamp`` identifies one state of a
file's or object's bytes, and ``DigestCache`` reuses a digest only while its stamp is unchanged
(see :mod:`pipelines.storage.base` for what a stamp is on each store).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.manifest import CONFIG_ENTRY, digest_of_manifest, sha256_file

MANIFEST = ".mlreg-manifest.json"  # a version's manifest, beside its files (the last file written)

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

    def differs_from(self, other: Manifest) -> bool:
        """Whether this stored manifest must be rewritten as ``other`` (other files, other config,
        or edited: its recorded digest is not ``other``'s)."""
        return (
            self.files != other.files or self.config != other.config or self.recorded_digest != other.digest
        )


def parse_manifest(data: bytes | None) -> tuple[Manifest | None, str]:
    """The manifest stored as ``data``, or why it cannot be read ("": none is stored, ``data`` None)."""
    if data is None:
        return None, ""
    try:
        return Manifest.from_json(data), ""
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{len(data)} bytes, {type(exc).__name__}: {exc}"
