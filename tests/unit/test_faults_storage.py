"""Faults of the store, on a real local folder: the lock's lease (store clock, renewal, a lost
lock), a release that fails, a full disk under a config write, and S3 credential errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pipelines.storage import open_store
from pipelines.storage.base import lock_key
from pipelines.storage.local import LocalStore
from pipelines.storage.s3 import S3Store
from registry.errors import StorageError

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_a_lease_is_judged_by_the_stores_clock_not_the_holders(tmp_path: Path) -> None:
    """A holder whose clock runs an hour ahead wrote ``expires_at`` far in the future; the lock
    file's mtime (the store's clock) says its 60 s lease ran out: it is taken over."""
    store = LocalStore(tmp_path)
    payload = {"owner": "ahead@elsewhere:1", "token": "t", "ttl": 60, "expires_at": time.time() + 3600}
    assert store.create(lock_key("m"), json.dumps(payload).encode())
    old = time.time() - 120
    os.utime(tmp_path / lock_key("m"), (old, old))
    held = store.read_lock("m")
    assert held is not None
    assert held.stale
    assert held.clock == "store"
    with store.lock("m", owner="next") as mine:
        assert json.loads((tmp_path / lock_key("m")).read_bytes())["token"] == mine.token
    assert store.read_lock("m") is None


def test_a_live_lease_refuses_with_dates_and_unlock_waits_for_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    other = LocalStore(tmp_path)
    with store.lock("m", owner="holder@elsewhere:1", ttl=60):
        with pytest.raises(
            StorageError, match=rf"locked by holder@elsewhere:1 since {DATE}, lease until {DATE}"
        ):
            with other.lock("m"):
                pass
        with pytest.raises(StorageError, match="its lease is alive"):
            other.unlock("m")
        assert [lock.model for lock in other.locks()] == ["m"]
        old = time.time() - 120  # the holder stopped renewing (frozen): its lease runs out
        os.utime(tmp_path / lock_key("m"), (old, old))
        assert other.unlock("m").owner == "holder@elsewhere:1"
        assert other.locks() == []
    assert not (tmp_path / lock_key("m")).exists()


def test_a_lost_lock_stops_the_next_config_write_and_is_not_released(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_config("m", "v1\n")
    with store.lock("m", ttl=60):
        store.write_config("m", "v2\n")  # renewed, still ours
        data, token = store.read_versioned(lock_key("m")) or (b"", "")
        intruder = {"owner": "intruder@elsewhere:1", "token": "x", "ttl": 60, "expires_at": 0}
        assert store.replace(lock_key("m"), json.dumps(intruder).encode(), token)
        with pytest.raises(StorageError, match=r"the lock of model 'm' was lost: it is held by intruder"):
            store.write_config("m", "v3\n")
        with pytest.raises(StorageError, match="was lost"):
            store.renew_leases()
    assert store.read_config("m") == "v2\n"
    assert json.loads((tmp_path / lock_key("m")).read_bytes())["owner"] == "intruder@elsewhere:1"
    assert store.lock_notes == []


def test_a_lease_is_renewed_while_held(tmp_path: Path) -> None:
    """The renewer thread rewrites the lock object (compare-and-swap) every third of the lease."""
    store = LocalStore(tmp_path)
    with store.lock("m", ttl=0.6):
        first = json.loads((tmp_path / lock_key("m")).read_bytes())["renewal"]
        deadline = time.monotonic() + 30
        while json.loads((tmp_path / lock_key("m")).read_bytes())["renewal"] == first:
            assert time.monotonic() < deadline, "never renewed"
            time.sleep(0.05)
        assert not store.read_lock("m").stale  # type: ignore[union-attr]


def test_a_release_that_fails_is_a_note_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store unreachable at the release (a mock: the local folder cannot be taken away from
    under one open lock here): the holder's own error stays, the lock left is a note."""
    store = LocalStore(tmp_path)

    def unreachable(key: str) -> None:
        raise StorageError(f"{store.uri}: cannot read '{key}': unreachable")

    def promotion() -> None:
        with store.lock("m", ttl=60):
            monkeypatch.setattr(store, "lock_state", unreachable)
            raise RuntimeError("the promotion's own error")

    with pytest.raises(RuntimeError, match="the promotion's own error"):
        promotion()
    [note] = store.lock_notes
    assert note.startswith(f"the lock of 'm' was left at {store.uri}/.mlreg-lock.m.json")
    assert "mlreg store unlock m" in note
    assert (tmp_path / lock_key("m")).exists()


def test_a_full_disk_leaves_no_temporary_config_in_the_model_folder(tmp_path: Path) -> None:
    """ENOSPC for real: the temporary file's name is a link to /dev/full, whose every write the
    kernel answers with ENOSPC (a small tmpfs needs a mount, which this machine's container cannot
    do).  The old config stays, no ``.config.pbtxt.tmp<PID>`` is left for Triton to scan."""
    store = LocalStore(tmp_path)
    store.write_config("m", "old\n")
    tmp = tmp_path / "m" / f".config.pbtxt.tmp{os.getpid()}"
    tmp.symlink_to("/dev/full")
    with pytest.raises(StorageError, match=r"cannot write 'm/config.pbtxt': No space left on device"):
        store.write_config("m", "new\n")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.pbtxt"]
    assert store.read_config("m") == "old\n"


def _client_error(code: str, operation: str = "PutObject") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"{code} says no"}}, operation)


@pytest.mark.parametrize(
    "code", ["InvalidToken", "ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"]
)
def test_credential_errors_say_to_fix_the_credentials(code: str) -> None:
    from boto3.exceptions import S3UploadFailedError

    store = S3Store("b", "p", "http://127.0.0.1:9")
    for exc in (
        _client_error(code),
        S3UploadFailedError(
            f"Failed to upload f to b/k: An error occurred ({code}) when calling the PutObject"
        ),
    ):
        error = store._translate("upload", "m/1/f", exc)
        assert f"credentials rejected while trying to upload 'm/1/f' ({code}" in error.message
        fix = error.fix or ""
        assert "rerun to resume" not in fix
        assert "credentials" in fix or "AWS_ACCESS_KEY_ID" in fix
    token = store._translate("write", "k", _client_error(code))
    assert ("session token" in (token.fix or "")) == (code in {"InvalidToken", "ExpiredToken"})


def test_open_store_keeps_leases_per_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    with store.lock("a", ttl=60), store.lock("b", ttl=60):
        assert sorted(store.leases) == ["a", "b"]
        store.renew_leases()
    assert store.leases == {}
