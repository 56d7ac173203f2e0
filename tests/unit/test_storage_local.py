"""The local-folder store and the digest cache (no server needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipelines.storage import open_store, parse_s3_uri
from pipelines.storage.base import DigestCache, Manifest
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
    store.versions.put_version("m", "1", src)
    (src / "b.txt").unlink()
    result = store.versions.put_version("m", "1", src)
    assert result.skipped == ["a.txt"]
    assert store.objects.list_prefix("m/1/") == ["m/1/.mlreg-manifest.json", "m/1/a.txt"]
    store.versions.delete_version("m", "1")
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
        open_store(tmp_path).versions.put_version("m", "latest", tmp_path)


# -- manifests, verification before a load, links (a real local folder store) --------------------


def model_folder(root: Path, name: str = "m", files: dict[str, bytes] | None = None) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    for rel, data in (files or {"model.py": b"print(1)\n", "sub/w.bin": b"w" * 3000}).items():
        (folder / "1" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "1" / rel).write_bytes(data)
    return folder


def registered_digest(folder: Path) -> str:
    """What registration records as ``artifact_digest`` (registry.register's own computation)."""
    from registry.manifest import digest_of_manifest, manifest_of

    config = folder / "config.pbtxt"
    return digest_of_manifest(
        {
            **manifest_of(folder / "1"),
            "config.pbtxt": {"sha256": sha256_file(config), "size": config.stat().st_size},
        }
    )


def store_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_manifest_lists_every_file_with_size_digest_and_the_registered_digest(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    manifest = store.versions.read_manifest("m", "1")
    assert manifest is not None
    assert manifest.files == {
        "model.py": {"sha256": sha256_file(folder / "1" / "model.py"), "size": 9},
        "sub/w.bin": {"sha256": sha256_file(folder / "1" / "sub" / "w.bin"), "size": 3000},
    }
    assert manifest.config == {"sha256": sha256_file(folder / "config.pbtxt"), "size": 28}
    assert manifest.digest == manifest.recorded_digest == registered_digest(folder)


def test_the_digest_leaves_out_tensorflows_random_fingerprint() -> None:
    from registry.manifest import digest_of_manifest

    files = {"a": {"size": 1, "sha256": "x"}, "saved/fingerprint.pb": {"size": 2, "sha256": "y"}}
    assert digest_of_manifest(files) == digest_of_manifest({"a": files["a"]})
    assert digest_of_manifest(files) != digest_of_manifest({"a": {"size": 1, "sha256": "z"}})


def test_verify_after_upload_reuses_the_digest_proven_while_copying(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store", digest_cache=tmp_path / "digests.json")
    store.versions.put_version("m", "1", folder / "1")
    result = store.versions.verify_version("m", "1", registered_digest(folder))
    assert (result.status, result.files, result.reused, result.hashed_bytes) == ("verified", 2, 2, 0)
    full = store.versions.verify_version("m", "1", registered_digest(folder), full=True)
    assert (full.reused, full.hashed_bytes) == (0, 3009)


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_a_file_changed_in_the_store_is_refused_naming_it(tmp_path: Path, restore_mtime: bool) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store", digest_cache=tmp_path / "digests.json")
    store.versions.put_version("m", "1", folder / "1")
    stored = tmp_path / "store" / "m" / "1" / "sub" / "w.bin"
    before = stored.stat()
    stored.write_bytes(b"v" * 3000)  # same size
    if restore_mtime:  # mtime set back: only ctime (which nobody can set) betrays the change
        os.utime(stored, ns=(before.st_atime_ns, before.st_mtime_ns))
    snapshot = store_bytes(tmp_path / "store")
    with pytest.raises(
        StorageError,
        match=rf"m/1 does not match what was registered; refusing to use it:\n  sub/w\.bin changed: its "
        rf"sha256 differs from the manifest \(expected sha256 {sha256_file(folder / '1' / 'sub' / 'w.bin')}"
        rf", found sha256 {sha256_file(stored)}\)",
    ):
        store.versions.verify_version("m", "1", registered_digest(folder))
    assert store_bytes(tmp_path / "store") == snapshot  # nothing changed
    # pushing the registered bytes again repairs exactly that file
    again = store.versions.put_version("m", "1", folder / "1")
    assert (again.sent, again.skipped) == (["sub/w.bin"], ["model.py"])
    assert store.versions.verify_version("m", "1", registered_digest(folder)).ok


def test_missing_added_and_resized_files_are_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    version = tmp_path / "store" / "m" / "1"
    (version / "model.py").unlink()
    (version / "sub" / "w.bin").write_bytes(b"w" * 10)
    (version / "evil.py").write_text("import os")
    result = store.versions.check_version("m", "1")
    assert result.status == "corrupt"
    assert [p.line() for p in result.problems] == [
        "evil.py is stored but not in the manifest",
        "model.py is missing from the store",
        "sub/w.bin changed size (expected 3000 bytes, found 10 bytes)",
    ]


def test_the_python_backends_bytecode_cache_is_not_a_stranger(tmp_path: Path) -> None:
    """Triton's python backend writes __pycache__/ into a local store's version folder when it
    loads model.py; only that (a .pyc under __pycache__/) is tolerated beside the manifest."""
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    cache = tmp_path / "store" / "m" / "1" / "__pycache__"
    assert cache.read_bytes() == b""  # the empty guard a local store keeps
    assert store.versions.check_version("m", "1").status == "verified"
    cache.write_bytes(b"x")  # a guard that is not empty: dropped and made again before a load
    assert store.versions.check_version("m", "1").bytecode == ["m/1/__pycache__"]
    store.versions.verify_version("m", "1", drop_bytecode=True)
    assert cache.read_bytes() == b""
    cache.unlink()  # a version stored before the guard: the stub wrote its cache folder there
    cache.mkdir()
    (cache / "model.cpython-311.pyc").write_bytes(b"\x00" * 16)
    assert store.versions.check_version("m", "1").status == "verified"
    (cache / "payload.py").write_text("import os")
    result = store.versions.check_version("m", "1")
    assert [p.line() for p in result.problems] == ["__pycache__/payload.py is stored but not in the manifest"]


def test_a_manifest_holding_a_wrong_sha256_is_refused(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    manifest_file = tmp_path / "store" / "m" / "1" / ".mlreg-manifest.json"
    data = json.loads(manifest_file.read_text())
    data["files"]["model.py"]["sha256"] = "0" * 64
    manifest_file.write_text(json.dumps(data))
    result = store.versions.check_version("m", "1")
    assert [(p.file, p.problem) for p in result.problems] == [
        (".mlreg-manifest.json", "manifest"),
        ("model.py", "sha256"),
    ]
    # the manifest rewritten consistently (its digest field too) for bytes changed to match it:
    # only the digest registered in MLflow shows it is not the registered version
    changed = tmp_path / "store" / "m" / "1" / "model.py"
    changed.write_text("print(2)\n")
    data["files"]["model.py"]["sha256"] = sha256_file(changed)
    data["digest"] = Manifest.from_json(json.dumps(data)).digest
    manifest_file.write_text(json.dumps(data))
    assert store.versions.check_version("m", "1").ok
    with pytest.raises(
        StorageError,
        match=rf"\.mlreg-manifest\.json does not match the digest registered in MLflow "
        rf"\(expected {registered_digest(folder)}, found {data['digest']}\)",
    ):
        store.versions.verify_version("m", "1", registered_digest(folder))


def test_a_version_without_manifest_is_incomplete(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    (tmp_path / "store" / "m" / "1" / ".mlreg-manifest.json").unlink()
    with pytest.raises(StorageError, match=r"\.mlreg-manifest\.json is missing: the version is incomplete"):
        store.versions.verify_version("m", "1")


@pytest.mark.parametrize("cut", [0, 1, 40])
def test_an_unreadable_manifest_is_a_corrupt_manifest_a_push_refuses_and_an_upload_rewrites(
    tmp_path: Path, cut: int
) -> None:
    """A truncated (or emptied) manifest: no usable manifest, nothing raised by reading it --
    ``check_version`` says "corrupt manifest" naming it, ``verify_version`` refuses with the repair
    fix; a write-once push cannot tell whose bytes are stored and sends nothing; an upload of the
    registered folder (what a promotion and ``store repair`` do) proves the files, sends none and
    writes the manifest again."""
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    manifest = tmp_path / "store" / "m" / "1" / ".mlreg-manifest.json"
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[:cut])
    assert store.versions.read_manifest("m", "1") is None
    check = store.versions.check_version("m", "1")
    assert check.status == "corrupt manifest"
    [problem] = check.problems
    assert problem.line().startswith(
        ".mlreg-manifest.json is unreadable (truncated or not JSON): nothing of the version can be "
        f"checked (expected a manifest, found {cut} bytes, JSONDecodeError: "
    )
    with pytest.raises(StorageError, match=r"(?s)m/1 does not match.*\.mlreg-manifest\.json is unreadable"):
        store.versions.verify_version("m", "1")
    with pytest.raises(StorageError, match="the manifest of m v1 is unreadable") as refused:
        store.versions.put_version("m", "1", folder / "1", write_once=True)
    assert "'mlreg store repair m 1'" in (refused.value.fix or "")
    assert manifest.read_bytes() == whole[:cut]
    again = store.versions.put_version("m", "1", folder / "1")
    assert (again.sent, sorted(again.skipped)) == ([], ["model.py", "sub/w.bin"])
    assert store.versions.verify_version("m", "1", registered_digest(folder)).status == "verified"


def test_push_refuses_a_link_leaving_the_model_folder_and_sends_nothing(tmp_path: Path) -> None:
    from pipelines.storage.push import push_path

    folder = model_folder(tmp_path / "repo")
    model_folder(tmp_path / "repo", "clean")
    (folder / "1" / "passwd.txt").symlink_to("/etc/passwd")
    store = open_store(tmp_path / "store")
    with pytest.raises(
        StorageError,
        match=rf"{folder / '1' / 'passwd.txt'} is a link to /etc/passwd, outside the model folder {folder}",
    ):
        push_path(store, tmp_path / "repo")
    assert store.list_models() == []


def test_a_version_folder_linked_outside_is_refused_a_link_inside_is_not(tmp_path: Path) -> None:
    from pipelines.storage.push import push_model

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model.py").write_text("secret")
    folder = model_folder(tmp_path / "repo")
    (folder / "2").symlink_to(outside, target_is_directory=True)
    store = open_store(tmp_path / "store")
    with pytest.raises(
        StorageError, match=rf"{folder / '2'} is a link to {outside}, outside the model folder"
    ):
        push_model(store, folder)
    with pytest.raises(StorageError, match=rf"{folder / '2'} is a link to {outside}"):
        store.versions.put_version("m", "2", folder / "2")
    assert store.list_models() == []
    (folder / "2").unlink()
    (folder / "1" / "same.py").symlink_to(folder / "1" / "model.py")  # stays inside: allowed
    push_model(store, folder)
    assert (tmp_path / "store" / "m" / "1" / "same.py").read_text() == "print(1)\n"


def test_register_and_validate_apply_the_same_link_rule(tmp_path: Path) -> None:
    from registry.contracts.validate import validate_path
    from registry.errors import RegistryError
    from registry.manifest import manifest_of

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    folder = model_folder(tmp_path / "repo")
    (folder / "2").symlink_to(outside, target_is_directory=True)
    (folder / "1" / "passwd.txt").symlink_to("/etc/passwd")
    with pytest.raises(RegistryError, match=rf"{folder / '2'} is a link to {outside}, outside the model"):
        manifest_of(folder / "2")
    with pytest.raises(RegistryError, match=r"passwd\.txt is a link to /etc/passwd, outside the model"):
        manifest_of(folder / "1")
    links = [f for f in validate_path(folder).findings if f.rule == "outside-link"]
    assert sorted(f.message for f in links) == [
        f"{folder / '1' / 'passwd.txt'} is a link to /etc/passwd, outside the model folder {folder}",
        f"{folder / '2'} is a link to {outside}, outside the model folder {folder}",
    ]
    assert all(f.is_error for f in links)


def test_a_link_planted_in_the_local_store_is_refused(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", folder / "1")
    stored = tmp_path / "store" / "m" / "1" / "model.py"
    stored.unlink()
    stored.symlink_to(folder / "1" / "model.py")  # same bytes, but outside the store's model folder
    with pytest.raises(StorageError, match=r"model\.py is a link leaving the model folder"):
        store.versions.verify_version("m", "1")


def test_init_writes_a_root_marker_that_is_not_a_model(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    assert store.init_root() is True
    assert store.init_root() is False  # already there: left as it was
    marker = json.loads((tmp_path / "store" / ".mlreg-root.json").read_text())
    assert marker["store"] == str(tmp_path / "store")
    assert store.list_models() == []
