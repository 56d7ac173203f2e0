"""The local-folder store and the digest cache (no server needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.storage import open_store, parse_s3_uri
from pipelines.storage.base import DigestCache
from registry.errors import StorageError
from registry.manifest import sha256_file


def test_digest_cache_reuses_and_invalidates(tmp_path: Path) -> None:
    file = tmp_path / "w.bin"
    file.write_bytes(b"a" * 1000)
    cache = DigestCache(tmp_path / "cache.json")
    first = cache.sha256(file)
    cache.save()
    assert first == sha256_file(file)
    reloaded = DigestCache(tmp_path / "cache.json")
    assert reloaded.entries
    assert reloaded.sha256(file) == first
    assert not reloaded.dirty  # served from the cache
    file.write_bytes(b"b" * 1000)
    os.utime(file, ns=(1, 1))
    assert reloaded.sha256(file) == sha256_file(file) != first


def test_corrupt_cache_is_only_slower(tmp_path: Path) -> None:
    (tmp_path / "cache.json").write_text("{broken")
    assert DigestCache(tmp_path / "cache.json").entries == {}


def test_deleted_files_disappear_from_the_version(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    (src / "b.txt").write_text("b")
    store = open_store(tmp_path / "store")
    store.put_version("m", "1", src)
    (src / "b.txt").unlink()
    result = store.put_version("m", "1", src)
    assert result.skipped == ["a.txt"]
    assert store.list_prefix("m/1/") == ["m/1/.mlreg-manifest.json", "m/1/a.txt"]
    store.delete_version("m", "1")
    assert store.list_versions("m") == []


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/p", "unsupported store URI 'gs://bucket/p'"),
        ("s3://", "store URI 's3://' names no bucket"),
    ],
)
def test_bad_store_uris(uri: str, message: str) -> None:
    with pytest.raises(StorageError, match=message):
        open_store(uri) if uri.startswith("gs") else parse_s3_uri(uri)


def test_non_numeric_versions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="version 'latest' is not a number"):
        open_store(tmp_path).put_version("m", "latest", tmp_path)
