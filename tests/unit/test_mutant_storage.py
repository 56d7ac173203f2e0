"""README "Stored versions are written once" and "What Triton follows is what was hashed", on a
real local store and on S3 (moto's in-process S3, which enforces ``If-None-Match`` on every
put, as AWS does): a refused two-model push sends nothing, of two writers of one new version exactly
one creates its manifest, and the verifier that a promotion's undo, ``apply_repair`` and the
archive's bring-back call removes a planted bytecode cache from S3.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.storage import open_store
from pipelines.storage.base import Repository
from pipelines.storage.push import push_path
from registry.errors import StorageError

CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'


def _model(root: Path, name: str, version: str, source: str) -> Path:
    folder = root / name
    (folder / version).mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name))
    (folder / version / "model.py").write_text(source)
    return folder


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (a lock file included: none may be left)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_refused_two_model_push_leaves_the_store_byte_identical(tmp_path: Path) -> None:
    """The second model rewrites a stored version: the push is refused before anything is sent --
    the first model's config and version included, although its own push would be allowed."""
    store_root = tmp_path / "store"
    store_root.mkdir()
    store = open_store(store_root)
    first = _model(tmp_path / "stored", "b_model", "1", "STORED = 1\n")
    push_path(store, first)
    before = _snapshot(store_root)
    repo = tmp_path / "repo"
    _model(repo, "a_model", "1", "A = 1\n")  # new: alone, it would be pushed
    _model(repo, "b_model", "1", "STORED = 2\n")  # v1 is stored with other bytes
    with pytest.raises(
        StorageError, match=r"b_model v1 is already stored with other bytes.*nothing was sent"
    ):
        push_path(open_store(store_root), repo)
    assert _snapshot(store_root) == before  # what the message says: nothing was sent
    assert not (store_root / "a_model").exists()


def test_a_model_refused_after_another_was_pushed_names_what_was_sent(tmp_path: Path) -> None:
    """Another writer stores b_model v1 between the push's first check and b_model's own check
    under its lock: a_model is already pushed, so the refusal says "nothing of b_model was sent"
    and names a_model -- what the store then holds, never "nothing was sent"."""
    store_root = tmp_path / "store"
    store_root.mkdir()
    repo = tmp_path / "repo"
    _model(repo, "a_model", "1", "A = 1\n")
    _model(repo, "b_model", "1", "MINE = 1\n")
    other = _model(tmp_path / "other", "b_model", "1", "THEIRS = 1\n")

    def racing_writer(model: str) -> None:
        if model == "b_model":  # after a_model's push, before b_model's lock
            push_path(open_store(store_root), other)

    with pytest.raises(StorageError) as refused:
        push_path(open_store(store_root), repo, on_model=racing_writer)
    message = refused.value.message
    assert "nothing of b_model was sent" in message
    assert "a_model (checked before it) was pushed" in message
    assert "nothing was sent" not in message.replace("nothing of b_model was sent", "")
    # the state the message describes: a_model stored, b_model v1 the other writer's bytes
    assert (store_root / "a_model" / "1" / "model.py").read_text() == "A = 1\n"
    assert (store_root / "b_model" / "1" / "model.py").read_text() == "THEIRS = 1\n"


# -- S3 --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[str]:
    """moto's in-process S3 (no network) for this module, with one bucket: its name."""
    import boto3
    from moto import mock_aws

    with pytest.MonkeyPatch.context() as patch:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            patch.setenv(key, value)
        patch.delenv("AWS_ENDPOINT_URL", raising=False)
        patch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        with mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="mutants")
            yield "mutants"


@pytest.fixture
def s3_store(s3_bucket: str, request: pytest.FixtureRequest) -> Repository:
    """An S3 store of its own (a prefix named after the test) in the module's bucket."""
    return open_store(f"s3://{s3_bucket}/{request.node.name[:60]}", region="us-east-1")


def test_of_two_s3_writers_of_one_new_version_exactly_one_creates_its_manifest(
    s3_store: Repository, tmp_path: Path
) -> None:
    """Every create is a put with ``If-None-Match: *`` (not only the locks'): the second create
    of the same key is refused by S3 and leaves the first writer's bytes.  The two writers come one
    after the other, not from two threads: moto checks ``If-None-Match`` and then puts, in two steps
    (FACTS.md), so two threads can both "create" one key on moto -- which AWS never allows -- and
    a threaded test of it was flaky; the race itself is the store's conditional put, which AWS
    decides."""
    key = "m/1/.mlreg-manifest.json"
    assert s3_store.objects.create(key, b"writer 0") is True
    assert s3_store.objects.create(key, b"writer 1") is False  # the second writer is refused ...
    assert s3_store.objects.read(key) == b"writer 0"  # ... and the first writer's bytes stay
    assert s3_store.objects.create(key, b"a third") is False  # and later creates too
    assert s3_store.objects.read(key) == b"writer 0"


def test_a_second_push_of_a_new_version_with_other_bytes_is_refused_on_s3(
    s3_store: Repository, tmp_path: Path
) -> None:
    """The version's manifest is created, never overwritten: a writer that finds it made by
    another with other files is refused."""
    one = _model(tmp_path / "one", "m", "1", "A = 1\n")
    two = _model(tmp_path / "two", "m", "1", "A = 2\n")
    s3_store.versions.put_version("m", "1", one / "1", None, write_once=False)
    manifest = s3_store.objects.read("m/1/.mlreg-manifest.json")
    with pytest.raises(StorageError):
        s3_store.versions.put_version("m", "1", two / "1", None, write_once=True)
    assert s3_store.objects.read("m/1/.mlreg-manifest.json") == manifest


def test_the_verifier_on_s3_deletes_a_planted_bytecode_cache(s3_store: Repository, tmp_path: Path) -> None:
    """``verify_version(drop_bytecode=True)`` -- what the undo, ``apply_repair`` and the archive's
    bring-back call before a load -- removes a ``__pycache__/*.pyc`` no manifest covers."""
    folder = _model(tmp_path / "src", "m", "1", "ANSWER = 1\n")
    s3_store.versions.put_version("m", "1", folder / "1", None, write_once=True)
    manifest = s3_store.versions.read_manifest("m", "1")
    assert manifest is not None
    planted = "m/1/__pycache__/model.cpython-311.pyc"
    s3_store.objects.write(planted, b"\x00 not the verified source")
    assert planted in s3_store.objects.list_prefix("m/1/")
    s3_store.versions.verify_version("m", "1", manifest.digest, drop_bytecode=True)
    left = s3_store.objects.list_prefix("m/1/")
    assert planted not in left, left
    assert not [k for k in left if k.endswith(".pyc")]
    assert "m/1/model.py" in left  # the verified source stays


def test_a_stored_version_is_never_rewritten_by_put_version(tmp_path: Path) -> None:
    """``put_version(write_once=True)`` -- what a push and a promotion's upload call -- refuses a
    version stored with other bytes itself (not only ``refuse_rewrites`` before it), naming the
    file, and the stored bytes stay."""
    store_root = tmp_path / "store"
    store_root.mkdir()
    store = open_store(store_root)
    stored = _model(tmp_path / "stored", "m", "1", "STORED = 1\n")
    store.versions.put_version("m", "1", stored / "1", None, write_once=True)
    before = _snapshot(store_root)
    other = _model(tmp_path / "other", "m", "1", "STORED = 2\n")
    with pytest.raises(
        StorageError, match=r"m v1 is already stored with other bytes.*nothing was sent"
    ) as info:
        open_store(store_root).versions.put_version("m", "1", other / "1", None, write_once=True)
    assert "model.py" in info.value.message
    assert _snapshot(store_root) == before
