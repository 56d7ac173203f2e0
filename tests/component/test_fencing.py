"""The store's fence, on a real local folder: a holder whose lock was lost changes nothing under
the model any more (issue 31, items 9 and 10).

A frozen holder is played by a lease whose renewer never runs (SIGSTOP stops that thread too) and
a short lease that really runs out: the store's clock (the lock file's mtime) and this process's
monotonic clock both move on, as they do for a process stopped past its lease.  Another store
object on the same folder is the other promotion: it takes the stale lock over and promotes v9.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from pipelines.storage.archive import move_to_archive
from pipelines.storage.base import ARCHIVE, Repository, lock_key
from pipelines.storage.lease import Lease, parse_lock
from pipelines.storage.s3 import S3Objects
from registry.errors import StorageError

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
TTL = 0.2  # the frozen holder's lease: it runs out while the test waits TTL + a little
OTHER = "other@elsewhere:2"
HELD_BY_OTHER = rf"{OTHER} since {DATE}, lease until {DATE} \(the store's clock\)"


def _version(folder: Path, text: str) -> Path:
    (folder / "model.py").parent.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(text)
    (folder / "weights.bin").write_bytes(text.encode() * 64)
    return folder


def _files(root: Path) -> dict[str, str]:
    """Every file of the store (lock objects included) and of its archive, and its sha256."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in (root / "store", root / ARCHIVE)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A store with scorer v7 and v8 (config lists 8), the archive beside it."""
    root = tmp_path / "store"
    seed = Repository.local(root)
    for version in ("7", "8"):
        seed.versions.put_version("scorer", version, _version(tmp_path / "src" / version, f"v{version}\n"))
    seed.session.write_config("scorer", "versions: 8\n")
    return root


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases taken from here never renew on their own (the holder's process is stopped)."""
    monkeypatch.setattr(Lease, "_renew_loop", lambda self: None)


def _run_out() -> None:
    time.sleep(TTL * 1.25)


def _taken_over(root: Path, tmp_path: Path, locks: ExitStack) -> Repository:
    """The other promotion: takes the stale lock over, uploads v9, lists it in the config."""
    other = Repository.local(root)
    locks.enter_context(other.session.lock("scorer", owner=OTHER, ttl=60))
    other.versions.put_version("scorer", "9", _version(tmp_path / "src" / "9", "v9\n"))
    other.session.write_config("scorer", "versions: 9\n")
    return other


MUTATIONS: dict[str, Callable[[Repository, Path], Any]] = {
    "delete_version": lambda store, src: store.versions.delete_version("scorer", "9"),
    "delete": lambda store, src: store.objects.delete("scorer/9/model.py"),
    "write_config": lambda store, src: store.session.write_config("scorer", "versions: 8\n"),
    "delete config": lambda store, src: store.objects.delete("scorer/config.pbtxt"),
    "upload new": lambda store, src: store.versions.put_version(
        "scorer", "10", _version(src / "10", "v10\n")
    ),
    "upload over 9": lambda store, src: store.versions.put_version(
        "scorer", "9", _version(src / "x", "mine\n")
    ),
    "archive move": lambda store, src: move_to_archive(store, store.archive(), "scorer", "9"),
    "archive copy": lambda store, src: store.objects.copy_object_to(
        "scorer/8/model.py", store.archive().objects, "scorer/8/model.py"
    ),
}


@pytest.mark.usefixtures("frozen")
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_holder_whose_lock_was_taken_over_changes_nothing(
    repo: Path, tmp_path: Path, mutation: str
) -> None:
    """Item 9: the undo of a fenced promotion deleted the live folder the other one promoted.
    Every write or delete under the model -- the archive's copy included -- is refused, naming
    who holds the lock now, and every file (lock objects included) stays as the new holder left it."""
    mine = Repository.local(repo)
    with ExitStack() as locks:
        locks.enter_context(mine.session.lock("scorer", ttl=TTL))
        _run_out()
        _taken_over(repo, tmp_path, locks)
        before = _files(tmp_path)
        with pytest.raises(
            StorageError, match=rf"lock of model 'scorer' was lost: it is held by {HELD_BY_OTHER}"
        ) as e:
            MUTATIONS[mutation](mine, tmp_path / "mine")
        assert "left as it is" in e.value.message
        fix = e.value.fix or ""
        assert "the other promotion owns 'scorer' now" in fix
        assert "mlreg status" in fix
        assert _files(tmp_path) == before
        held = mine.session.read_lock("scorer")
        assert held is not None
        assert mine.session.fenced() == [f"lock of scorer lost: now held by {held.describe()}"]
    assert mine.session.lock_notes == []


@pytest.mark.usefixtures("frozen")
def test_fenced_names_the_new_holder_and_stays_fenced_after_the_release(repo: Path, tmp_path: Path) -> None:
    mine = Repository.local(repo)
    with ExitStack() as locks:
        locks.enter_context(mine.session.lock("scorer", ttl=TTL))
        assert mine.session.fenced() == []  # held: proven by a renewal
        _run_out()
        other = _taken_over(repo, tmp_path, locks)
        lock_before = (repo / lock_key("scorer")).read_bytes()
        [line] = mine.session.fenced()
        assert re.fullmatch(rf"lock of scorer lost: now held by {HELD_BY_OTHER}", line), line
        assert mine.session.fenced() == [line]  # known lost: the store is not asked again
        assert (repo / lock_key("scorer")).read_bytes() == lock_before
        with pytest.raises(StorageError, match="held by other@elsewhere:2"):
            mine.session.renew_leases()
        assert other.session.fenced() == []
    assert mine.session.fenced() == [line]  # released, still lost: its writes stay refused
    with pytest.raises(StorageError, match="was lost"):
        mine.versions.delete_version("scorer", "9")
    assert mine.read_config("scorer") == "versions: 9\n"


@pytest.mark.usefixtures("frozen")
def test_a_lease_that_ran_out_is_never_renewed(repo: Path) -> None:
    """Item 10: past its end (this process's clock, the store's too) nothing is sent: the lock
    object stays byte for byte, its mtime (the store's clock) too; the lease is lost, and the
    release removes the object only because it still carries this holder's own token."""
    mine = Repository.local(repo)
    lock = repo / lock_key("scorer")
    with mine.session.lock("scorer", ttl=TTL) as lease:
        _run_out()
        before = (lock.read_bytes(), lock.stat().st_mtime_ns)
        with pytest.raises(StorageError, match=rf"its lease ran out at {DATE} before it was renewed"):
            lease.renew()
        assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
        assert re.fullmatch(rf"lock of scorer lost: lease ran out at {DATE}", mine.session.fenced()[0])
        with pytest.raises(StorageError, match="rerun the promotion"):
            mine.session.write_config("scorer", "versions: 7\n")
        assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
        described = mine.session.read_lock("scorer").describe()  # type: ignore[union-attr]
        assert re.search(rf"lease ran out at {DATE} \(the store's clock\)$", described), described
    assert not lock.exists()
    assert mine.read_config("scorer") == "versions: 8\n"
    assert mine.session.lock_notes == []


def test_a_renewal_delivered_late_renews_nothing(repo: Path) -> None:
    """A renewal queued in a frozen store lands after the lease it renews had run out (its
    ``renew_by``): every reader judges the lock run out then, and the holder's next proof loses
    the lease without writing; another process takes it over."""
    mine = Repository.local(repo)
    lock = repo / lock_key("scorer")
    with mine.session.lock("scorer", ttl=60) as lease:
        lease.renew()
        renewed = json.loads(lock.read_bytes())
        assert renewed["renew_by"] == pytest.approx(time.time() + 60, abs=5)  # the lease it renewed
        late = {**renewed, "renewal": renewed["renewal"] + 1, "renew_by": time.time() - 30}
        lock.write_bytes(json.dumps(late).encode())  # the late PUT lands now, 30 s after renew_by
        held = mine.session.read_lock("scorer")
        assert held is not None
        assert held.stale
        landed = (lock.read_bytes(), lock.stat().st_mtime_ns)
        [line] = mine.session.fenced()
        assert re.fullmatch(rf"lock of scorer lost: lease ran out at {DATE}", line), line
        assert (lock.read_bytes(), lock.stat().st_mtime_ns) == landed
        with Repository.local(repo).session.lock("scorer", owner=OTHER, ttl=60):  # taken over
            assert mine.session.read_lock("scorer").owner == OTHER  # type: ignore[union-attr]
        with pytest.raises(StorageError, match="was lost"):
            mine.objects.delete("scorer/8/model.py")


def test_parse_lock_ends_a_late_renewal_at_the_lease_it_renewed() -> None:
    data = json.dumps({"owner": "o", "token": "t", "ttl": 60, "renew_by": 1000.0}).encode()
    on_time = parse_lock("m", data, "etag", since=990.0, now=1000.0)
    assert (on_time.expires_at, on_time.stale) == (1050.0, False)
    late = parse_lock("m", data, "etag", since=1020.0, now=1021.0)
    assert (late.expires_at, late.stale) == (1000.0, True)
    assert "lease ran out at 1970-01-01 00:16:40 UTC (the store's clock)" in late.describe()


def test_a_held_lease_lets_every_mutation_through(repo: Path, tmp_path: Path) -> None:
    """The positive control: each mutation of the fenced test works while the lease is held."""
    mine = Repository.local(repo)
    with mine.session.lock("scorer", ttl=60):
        mine.versions.put_version("scorer", "9", _version(tmp_path / "src" / "9", "v9\n"))
        mine.session.write_config("scorer", "versions: 9\n")
        for name, mutation in MUTATIONS.items():
            if name != "archive move":
                mutation(mine, tmp_path / "mine")
        mine.versions.put_version("scorer", "9", _version(tmp_path / "src" / "9", "v9\n"))
        move_to_archive(mine, mine.archive(), "scorer", "9")
        assert mine.session.fenced() == []
    assert mine.list_versions("scorer") == ["7", "8", "10"]
    assert (tmp_path / ARCHIVE / "store" / "scorer" / "9" / "model.py").read_text() == "v9\n"
    assert not (repo / lock_key("scorer")).exists()
    assert mine.session.lock_notes == []


def test_a_renewal_whose_first_attempt_landed_is_not_a_loss(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried request: the first PUT landed, its retry is refused (412 on S3): the object is
    this holder's own renewal, so the lease is held, not lost."""
    mine = Repository.local(repo)
    replace = mine.objects.replace

    def landed_then_refused(key: str, data: bytes, token: str) -> bool:
        replace(key, data, token)
        return False

    with mine.session.lock("scorer", ttl=60) as lease:
        monkeypatch.setattr(mine.objects, "replace", landed_then_refused)
        lease.renew()
        assert json.loads((repo / lock_key("scorer")).read_bytes())["renewal"] == 1
        assert mine.session.fenced() == []


def test_a_store_that_cannot_be_reached_proves_nothing(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fenced()`` never raises: the lease it cannot prove counts as lost, and nothing is written."""
    mine = Repository.local(repo)

    def unreachable(*args: object) -> bool:
        raise StorageError(f"{mine.uri}: cannot write '.mlreg-lock.scorer.json': unreachable")

    with mine.session.lock("scorer", ttl=60):
        monkeypatch.setattr(mine.objects, "replace", unreachable)
        [line] = mine.session.fenced()
        assert line.startswith("lock of scorer lost: not proven, the store could not be reached (")
        assert "unreachable" in line
        before = _files(repo.parent)
        with pytest.raises(StorageError, match="could not be reached to prove it is still held"):
            mine.session.write_config("scorer", "versions: 7\n")
        assert _files(repo.parent) == before
        monkeypatch.undo()
    assert not (repo / lock_key("scorer")).exists()  # still its own object: released


def test_every_lock_left_by_an_outage_is_noted(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 12 (``mlreg store gc`` locks every model it moves): the store goes away mid-run, the
    run's own error stays, and each lock that could not be released is named in ``lock_notes``."""
    store = Repository.local(repo)

    def outage(key: str) -> None:
        raise StorageError(f"{store.uri}: cannot read '{key}': unreachable")

    def gc() -> None:
        with ExitStack() as locks:
            for model in ("ensemble", "scorer"):
                locks.enter_context(store.session.lock(model, ttl=60))
            monkeypatch.setattr(store.objects, "lock_state", outage)
            raise RuntimeError("the run's own error")

    with pytest.raises(RuntimeError, match="the run's own error"):
        gc()
    assert [note.split(" was left at ")[0] for note in store.session.lock_notes] == [
        "the lock of 'scorer'",
        "the lock of 'ensemble'",
    ]
    assert all("mlreg store unlock" in note for note in store.session.lock_notes)


def test_a_lock_whose_read_back_fails_is_released_not_left(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock object is written, then the read-back that starts its lease fails: the error is
    raised and the lock object this process wrote is removed (no lock left until its lease ends)."""
    store = Repository.local(repo)
    reads = iter([StorageError(f"{store.uri}: cannot read: unreachable")])
    real = store.objects.lock_state

    def flaky(key: str) -> Any:
        failure = next(reads, None)
        if failure is not None:
            raise failure
        return real(key)

    monkeypatch.setattr(store.objects, "lock_state", flaky)
    with pytest.raises(StorageError, match="unreachable"), store.session.lock("scorer", ttl=60):
        pytest.fail("the lock was held although its read-back failed")
    assert not (repo / lock_key("scorer")).exists()
    assert store.session.leases == {}
    assert store.session.lock_notes == []


# -- S3: the batched delete goes through the fence too (no server: a client that records) --------


class _Objects:
    """Just enough of an S3 client for locks and a batched delete, in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.deleted: list[str] = []

    def _put(self, key: str, body: bytes) -> dict[str, Any]:
        self.objects[key] = body
        self.etags[key] = f'"{hashlib.sha256(body + str(time.time()).encode()).hexdigest()}"'
        return {"ETag": self.etags[key]}

    def put_object(self, Bucket: str, Key: str, Body: bytes, **condition: str) -> dict[str, Any]:
        exists = Key in self.objects
        if ("IfNoneMatch" in condition and exists) or (
            "IfMatch" in condition and self.etags.get(Key) != condition["IfMatch"]
        ):
            raise ClientError({"Error": {"Code": "PreconditionFailed"}}, "PutObject")
        return self._put(Key, Body)

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")
        body = self.objects[Key]
        return {
            "Body": _Body(body),
            "ETag": self.etags[Key],
            "LastModified": datetime.now(UTC),
            "ResponseMetadata": {"HTTPHeaders": {}},
        }

    def delete_object(self, Bucket: str, Key: str, **condition: str) -> None:
        if condition.get("IfMatch", self.etags.get(Key)) == self.etags.get(Key):
            self.objects.pop(Key, None)

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        for obj in Delete["Objects"]:
            self.deleted.append(obj["Key"])
            self.objects.pop(obj["Key"], None)
        return {}


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> tuple[Repository, _Objects]:
    store = Repository(S3Objects("bucket", "p", "http://127.0.0.1:9"))
    fake = _Objects()
    monkeypatch.setattr(store.objects._client, "get", lambda: fake)
    monkeypatch.setattr(
        store.objects,
        "list_prefix",
        lambda prefix: sorted(k[2:] for k in fake.objects if k.startswith(f"p/{prefix}")),
    )
    for name in ("model.py", "weights.bin", ".mlreg-manifest.json"):
        fake._put(f"p/scorer/9/{name}", name.encode())
    return store, fake


def test_an_s3_batched_delete_is_fenced(
    s3: tuple[Repository, _Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, fake = s3
    with store.session.lock("scorer", ttl=60):
        key = "p/" + lock_key("scorer")
        intruder = {"owner": OTHER, "token": "x", "ttl": 60, "expires_at": time.time() + 60}
        fake._put(key, json.dumps(intruder).encode())  # taken over (a stale lease, by CAS)
        assert store.session.fenced()[0].startswith(f"lock of scorer lost: now held by {OTHER}")
        with pytest.raises(StorageError, match=f"held by {OTHER}.*'scorer/9/model.py' left as it is"):
            store.versions.delete_version("scorer", "9")
    assert fake.deleted == []
    assert sorted(fake.objects) == [
        "p/.mlreg-lock.scorer.json",
        *(f"p/scorer/9/{n}" for n in (".mlreg-manifest.json", "model.py", "weights.bin")),
    ]
    assert json.loads(fake.objects[key])["owner"] == OTHER


def test_an_s3_batched_delete_under_a_held_lease_deletes(s3: tuple[Repository, _Objects]) -> None:
    store, fake = s3
    with store.session.lock("scorer", ttl=60):
        store.versions.delete_version("scorer", "9")
    assert fake.deleted == [
        "p/scorer/9/model.py",
        "p/scorer/9/weights.bin",
        "p/scorer/9/.mlreg-manifest.json",
    ]
    assert fake.objects == {}
