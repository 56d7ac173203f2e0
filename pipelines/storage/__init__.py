"""Repository stores: ``open_store(uri)`` for a local path, ``s3://bucket/prefix``,
``s3://host:port/bucket/prefix`` or ``s3://http(s)://host:port/bucket/prefix`` (Triton's syntax).

Before Triton loads a version: ``store.verify_version(model, version, expected_digest)`` (raises
StorageError naming each file that does not match; ``expected_digest`` is the version's
``artifact_digest`` tag in MLflow).  ``ensure_root(uri)`` marks a fresh S3 prefix so Triton can
start on it.  See :mod:`pipelines.storage.base` for what is verified and how digests are reused."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.storage.base import DigestCache, Manifest, RepositoryStore, UploadResult
from registry.errors import StorageError

__all__ = [
    "Manifest",
    "RepositoryStore",
    "S3Location",
    "UploadResult",
    "ensure_root",
    "open_store",
    "parse_s3_uri",
]

HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:\d+$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    endpoint_url: str | None


def parse_s3_uri(uri: str) -> S3Location:
    rest = uri[len("s3://") :]
    endpoint = None
    for scheme in ("http://", "https://"):
        if rest.startswith(scheme):
            host, _, rest = rest[len(scheme) :].partition("/")
            endpoint = scheme + host
    if endpoint is None:
        first, _, remainder = rest.partition("/")
        if HOST_PORT.match(first):
            endpoint, rest = f"http://{first}", remainder
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StorageError(
            f"store URI '{uri}' names no bucket", fix="use s3://bucket/prefix or s3://host:port/bucket/prefix"
        )
    return S3Location(bucket, prefix.strip("/"), endpoint)


def open_store(
    uri: str | Path,
    region: str | None = None,
    digest_cache: Path | None = None,
    *,
    patience: tuple[float, int] | None = None,
) -> RepositoryStore:
    """The store for ``uri``; ``digest_cache`` (a JSON file) spares re-hashing unchanged files;
    ``patience`` (read timeout in seconds, retries) bounds each S3 request (default: the upload's)."""
    text = str(uri)
    store: RepositoryStore
    if text.startswith("s3://"):
        from pipelines.storage.s3 import READ_TIMEOUT_S, RETRIES, S3Store

        loc = parse_s3_uri(text)
        read, retries = patience or (READ_TIMEOUT_S, RETRIES)
        store = S3Store(loc.bucket, loc.prefix, loc.endpoint_url, region, text, read, retries)
    elif "://" in text:
        raise StorageError(
            f"unsupported store URI '{text}'",
            fix="use a local folder or an s3:// URI (gs:// and as:// are not supported yet)",
        )
    else:
        from pipelines.storage.local import LocalStore

        store = LocalStore(Path(text))
    store.digests = DigestCache(digest_cache)
    return store


def ensure_root(uri: str | Path, region: str | None = None) -> bool:
    """Write the root marker when the repository holds no object at all (a fresh S3 prefix, on
    which Triton refuses to start); True when it was written.  A local folder needs none."""
    store = open_store(uri, region)
    if not store.is_empty():
        return False
    return store.init_root()
