"""Faults of the store, on a real local folder: the lock's lease (store clock, renewal, a lost
lock), a release that fails, a full disk under a config write, and S3 credential errors.

Issue 38, on real tmpfs mounts and a real local store under the promotion of
tests/unit/worlds.py (fake Tritons, the fake registry): a full TMPDIR and a store full at upload
(item 2), an archive on another file system (3), a truncated manifest of the serving version (4),
a store full at the promotion's ``uploaded`` checkpoint (7)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mlreg.cli.failures import report
from mlreg.cli.main import app
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.promote import stages
from pipelines.storage import open_store
from pipelines.storage.base import Repository, lock_key
from pipelines.storage.local import LocalObjects
from pipelines.storage.s3 import S3Objects, _translating
from registry.errors import StorageError
from registry.manifest import artifact_digest
from tests.cli import CliRunner
from tests.unit.worlds import MEMBER, World

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_a_lease_is_judged_by_the_stores_clock_not_the_holders(tmp_path: Path) -> None:
    """A holder whose clock runs an hour ahead wrote ``expires_at`` far in the future; the lock
    file's mtime (the store's clock) says its 60 s lease ran out: it is taken over."""
    store = Repository.local(tmp_path)
    payload = {"owner": "ahead@elsewhere:1", "token": "t", "ttl": 60, "expires_at": time.time() + 3600}
    assert store.objects.create(lock_key("m"), json.dumps(payload).encode())
    old = time.time() - 120
    os.utime(tmp_path / lock_key("m"), (old, old))
    held = store.session.read_lock("m")
    assert held is not None
    assert held.stale
    assert held.clock == "store"
    with store.session.lock("m", owner="next") as mine:
        assert json.loads((tmp_path / lock_key("m")).read_bytes())["token"] == mine.token
    assert store.session.read_lock("m") is None


def test_a_live_lease_refuses_with_dates_and_unlock_waits_for_it(tmp_path: Path) -> None:
    store = Repository.local(tmp_path)
    other = Repository.local(tmp_path)
    with store.session.lock("m", owner="holder@elsewhere:1", ttl=60):
        with pytest.raises(
            StorageError, match=rf"locked by holder@elsewhere:1 since {DATE}, lease until {DATE}"
        ):
            with other.session.lock("m"):
                pass
        with pytest.raises(StorageError, match="its lease is alive"):
            other.session.unlock("m")
        assert [lock.model for lock in other.session.locks()] == ["m"]
        old = time.time() - 120  # the holder stopped renewing (frozen): its lease runs out
        os.utime(tmp_path / lock_key("m"), (old, old))
        assert other.session.unlock("m").owner == "holder@elsewhere:1"
        assert other.session.locks() == []
    assert not (tmp_path / lock_key("m")).exists()


def test_a_lost_lock_stops_the_next_config_write_and_is_not_released(tmp_path: Path) -> None:
    store = Repository.local(tmp_path)
    store.session.write_config("m", "v1\n")
    with store.session.lock("m", ttl=60):
        store.session.write_config("m", "v2\n")  # renewed, still ours
        data, token = store.objects.read_versioned(lock_key("m")) or (b"", "")
        intruder = {"owner": "intruder@elsewhere:1", "token": "x", "ttl": 60, "expires_at": 0}
        assert store.objects.replace(lock_key("m"), json.dumps(intruder).encode(), token)
        with pytest.raises(StorageError, match=r"the lock of model 'm' was lost: it is held by intruder"):
            store.session.write_config("m", "v3\n")
        with pytest.raises(StorageError, match="was lost"):
            store.session.renew_leases()
    assert store.read_config("m") == "v2\n"
    assert json.loads((tmp_path / lock_key("m")).read_bytes())["owner"] == "intruder@elsewhere:1"
    assert store.session.lock_notes == []


def test_a_lease_is_renewed_while_held(tmp_path: Path) -> None:
    """The renewer thread rewrites the lock object (compare-and-swap) every third of the lease."""
    store = Repository.local(tmp_path)
    with store.session.lock("m", ttl=0.6):
        first = json.loads((tmp_path / lock_key("m")).read_bytes())["renewal"]
        deadline = time.monotonic() + 30
        while json.loads((tmp_path / lock_key("m")).read_bytes())["renewal"] == first:
            assert time.monotonic() < deadline, "never renewed"
            time.sleep(0.05)
        assert not store.session.read_lock("m").stale  # type: ignore[union-attr]


def test_a_release_that_fails_is_a_note_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store unreachable at the release (a mock: the local folder cannot be taken away from
    under one open lock here): the holder's own error stays, the lock left is a note."""
    store = Repository.local(tmp_path)

    def unreachable(key: str) -> None:
        raise StorageError(f"{store.uri}: cannot read '{key}': unreachable")

    def promotion() -> None:
        with store.session.lock("m", ttl=60):
            monkeypatch.setattr(store.objects, "lock_state", unreachable)
            raise RuntimeError("the promotion's own error")

    with pytest.raises(RuntimeError, match="the promotion's own error"):
        promotion()
    [note] = store.session.lock_notes
    assert note.startswith(f"the lock of 'm' was left at {store.uri}/.mlreg-lock.m.json")
    assert "mlreg store unlock m" in note
    assert (tmp_path / lock_key("m")).exists()


def test_a_full_disk_leaves_no_temporary_config_in_the_model_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC for real: the temporary file (at the store's root, never in the model folder) is a
    link to /dev/full, whose every write the kernel answers with ENOSPC (the issue-38 tests below
    fill a tmpfs of their own instead).  The old config stays, no temporary file is left (neither
    in the model folder Triton scans nor at the root); the error says the disk is full and to free
    space."""
    store = Repository.local(tmp_path)
    store.session.write_config("m", "old\n")
    tmp = tmp_path / f".mlreg-tmp.{os.getpid()}.full"
    tmp.symlink_to("/dev/full")
    monkeypatch.setattr(LocalObjects, "_temp", lambda self: tmp)  # the name only: the ENOSPC is real
    with pytest.raises(
        StorageError, match=r"disk full at .*: cannot write 'm/config.pbtxt' \(No space left on device\)"
    ) as caught:
        store.session.write_config("m", "new\n")
    assert (caught.value.fix or "").startswith("free space at ")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.pbtxt"]
    assert not tmp.is_symlink()
    assert not list(tmp_path.glob(".mlreg-tmp.*"))
    assert store.read_config("m") == "old\n"


def _client_error(code: str, operation: str = "PutObject") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"{code} says no"}}, operation)


@pytest.mark.parametrize(
    "code", ["InvalidToken", "ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"]
)
def test_credential_errors_say_to_fix_the_credentials(code: str) -> None:
    from boto3.exceptions import S3UploadFailedError

    store = Repository(S3Objects("b", "p", "http://127.0.0.1:9"))
    for exc in (
        _client_error(code),
        S3UploadFailedError(
            f"Failed to upload f to b/k: An error occurred ({code}) when calling the PutObject"
        ),
    ):
        error = _translated(store.objects, "upload", "m/1/f", exc)
        assert f"credentials rejected while trying to upload 'm/1/f' ({code}" in error.message
        fix = error.fix or ""
        assert "rerun to resume" not in fix
        assert "credentials" in fix or "AWS_ACCESS_KEY_ID" in fix
    token = _translated(store.objects, "write", "k", _client_error(code))
    assert ("session token" in (token.fix or "")) == (code in {"InvalidToken", "ExpiredToken"})


def _translated(store: S3Objects, what: str, key: str, exc: Exception) -> StorageError:
    """The StorageError the store's one translation point makes of ``exc``."""
    with pytest.raises(StorageError, match="credentials rejected") as caught, _translating(store, what, key):
        raise exc
    return caught.value


def test_open_store_keeps_leases_per_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    with store.session.lock("a", ttl=60), store.session.lock("b", ttl=60):
        assert sorted(store.session.leases) == ["a", "b"]
        store.session.renew_leases()
    assert store.session.leases == {}


# -- issue 38: full disks, an archive on another file system, a truncated manifest (real tmpfs) ----


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mount a real tmpfs of a given size at a folder (as root, or with passwordless sudo as on
    GitHub's runners; a folder mounted already is resized); every one unmounted after the test.
    No mount, no test: it fails."""
    mounted: list[Path] = []

    def mount(folder: Path, size: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        how = f"remount,size={size}" if folder in mounted else f"size={size}"
        for command in (["mount"], ["sudo", "-n", "mount"]):
            if shutil.which(command[0]) is None:
                continue
            options = ["-t", "tmpfs", "-o", how, "tmpfs", str(folder)]
            if subprocess.run([*command, *options], capture_output=True, check=False).returncode == 0:
                mounted.extend([] if folder in mounted else [folder])
                return folder
        pytest.fail(f"cannot mount a tmpfs at {folder} (needs root or passwordless sudo)")

    yield mount
    for folder in reversed(mounted):
        for command in (["umount", "-l"], ["sudo", "-n", "umount", "-l"]):
            if shutil.which(command[0]) is None:
                continue
            if subprocess.run([*command, str(folder)], capture_output=True, check=False).returncode == 0:
                break


def _fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its file system has no byte left; returns the file."""
    filler = folder / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 65536):
            pass
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


def _said(exc: BaseException, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and the lines the CLI prints for ``exc`` (``MlregGroup`` hands it to ``report``)."""
    capsys.readouterr()
    code = report(exc)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert "this is a bug" not in err
    return code, err


def _files(root: Path) -> dict[str, bytes]:
    """The store's files (locks and the test's filler aside), byte for byte."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".mlreg-lock.") and p.name != "filler.bin"
    }


def _world(tmp_path: Path, tmpfs: Callable[[Path, str], Path] | None = None, size: str = "") -> World:
    """tests/unit/worlds.py's ``World`` (ens over pre and net, two fake Tritons, the fake registry),
    its store on a tmpfs of ``size`` when given; ens v1 promoted (net v1 serves)."""
    world = World(tmp_path)
    if tmpfs is not None:
        tmpfs(world.store_root, size)  # over the empty folder, before anything is stored
    world.promote("ens", "1")
    return world


def _register(world: World, version: str, weights: int = 0) -> None:
    """net ``version``, registered with a ``weights.bin`` of ``weights`` bytes."""
    world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    if weights:
        folder = world.registry.root / "net" / version
        (folder / "model" / "weights.bin").write_bytes(os.urandom(weights))
        digest = artifact_digest(folder / "model", folder / "config.pbtxt")
        world.registry.tags[("net", version)]["artifact_digest"] = digest


def _serving(world: World) -> dict[str, list[str]]:
    return {url: sorted(t.states.get("net", {})) for url, t in sorted(world.fleet.targets.items())}


def _settled(world: World, version: str) -> None:
    """net ``version`` serves on both targets and in the store's config, the alias names it, no
    lock is left and the store's copy verifies against the registered digest."""
    assert _serving(world) == {"t0:8001": [version], "t1:8001": [version]}
    assert serving_versions(world.config("net")) == [version]
    assert world.registry.models.aliases("net")["test"] == version
    store = world.fleet.store
    assert store.session.locks() == []
    store.versions.verify_version("net", version, world.registry.tags[("net", version)]["artifact_digest"])


def test_tmpdir_full_during_a_promotion_is_one_disk_full_error_and_a_rerun_promotes(
    tmp_path: Path,
    tmpfs: Callable[[Path, str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 2: TMPDIR (the promotion's work folder, where the registry's copy is fetched) on a real
    1 MB tmpfs.  Full from the start: the fetch in ``resolve`` fails -- "disk full at TMPDIR" (exit
    5), not an internal error.  Full once ``resolve`` is done: ``validate`` fails the same way
    inside the promotion (exit 8, nothing changed).  Space back: the rerun promotes."""
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    world = _world(tmp_path)
    _register(world, "2", weights=300_000)
    temp = tmpfs(tmp_path / "tmp", "1m")
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    before = (_files(world.store_root), _serving(world), world.registry.models.aliases("net"))
    filler = _fill(temp)
    with pytest.raises(OSError, match="No space left on device") as caught:
        world.promote("net", "2")
    code, err = _said(caught.value, capsys)
    assert code == StorageError.exit_code, err
    assert f"error: disk full at {temp} (TMPDIR): a file could not be written" in err
    assert f"fix: free space at {temp} ('df -h {temp}'), or point TMPDIR at a folder with room" in err
    assert (_files(world.store_root), _serving(world), world.registry.models.aliases("net")) == before
    assert world.fleet.store.session.locks() == []

    filler.unlink()

    def fill_after_resolve(stage: str, status: str, seconds: float, detail: str) -> None:
        if stage == "resolve":
            _fill(temp)

    with pytest.raises(PromotionFailed) as failed:
        world.promote("net", "2", on_stage=fill_after_resolve)
    code, err = _said(failed.value, capsys)
    assert code == PromotionFailed.exit_code, err
    assert f"error: promotion of net version 2 to 'test' failed: disk full at {temp} (TMPDIR)" in err
    assert "; nothing was changed" in err
    assert f"fix: free space at {temp}" in err
    assert (_files(world.store_root), _serving(world), world.registry.models.aliases("net")) == before
    assert world.fleet.store.session.locks() == []
    assert "the attempt was not recorded in MLflow (No space left on device)" in err  # its report

    (temp / "filler.bin").unlink()
    world.promote("net", "2")
    _settled(world, "2")


def test_a_local_store_full_at_upload_says_free_space_and_a_rerun_promotes(
    tmp_path: Path,
    tmpfs: Callable[[Path, str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 2: the store a 512 kB tmpfs, net v2's weights larger than its room: ``assemble`` fails
    "disk full at STORE" with the free-space fix (not "check the folder exists"); the partial
    upload is removed, nothing else changed.  The store grown, the rerun promotes."""
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    world = _world(tmp_path, tmpfs, "512k")
    _register(world, "2", weights=600_000)
    before = (_files(world.store_root), _serving(world), world.registry.models.aliases("net"))
    with pytest.raises(PromotionFailed) as failed:
        world.promote("net", "2")
    code, err = _said(failed.value, capsys)
    root = world.store_root
    assert code == PromotionFailed.exit_code, err
    assert (
        f"error: promotion of net version 2 to 'test' failed: disk full at {root}: cannot write "
        "'net/2/weights.bin' (No space left on device); rolled back" in err
    )
    assert f"fix: free space at {root} ('df -h {root}'), then run the command again" in err
    assert "check the folder exists" not in err
    assert failed.value.result.failed_stage == "assemble"
    assert (_files(root), _serving(world), world.registry.models.aliases("net")) == before
    assert world.fleet.store.session.locks() == []
    assert world.registry.recorded[-1]["tags"]["result"] == "rolled back"

    tmpfs(root, "4m")  # grown
    world.promote("net", "2")
    _settled(world, "2")


def test_a_store_full_at_the_uploaded_checkpoint_rolls_back_without_restoring_an_unchanged_config(
    tmp_path: Path,
    tmpfs: Callable[[Path, str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 7: the store (a 1 MB tmpfs) filled to its last byte at ``numbered`` (the re-pointed ens
    registered and uploaded): the deploy's config write fails before it changes the file.  The
    undo log finds the config as noted before the write, so it restores nothing there and reports
    no failure: "rolled back", the uploaded folders removed, the ens version this promotion
    registered deleted, net v1 serving, the alias unmoved.  Space back: the rerun promotes."""
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    world = _world(tmp_path, tmpfs, "1m")
    _register(world, "2")
    root = world.store_root
    before = (_files(root), _serving(world), world.registry.models.aliases("net"))
    loads = world.fleet.loads

    def full_at(point: str) -> None:
        if point == "numbered":  # deploy: ens re-pointed, registered as v2 and uploaded; no config yet
            _fill(root)

    monkeypatch.setattr(stages, "checkpoint", full_at)
    with pytest.raises(PromotionFailed) as failed:
        world.promote("net", "2")
    code, err = _said(failed.value, capsys)
    assert code == PromotionFailed.exit_code, err
    assert (
        f"failed: disk full at {root}: cannot write 'net/config.pbtxt' (No space left on device); "
        "rolled back, the previous versions serve (restored ens/2 removed, net/2 removed, "
        "ens v2 (registered by this promotion) deleted)" in err
    )
    assert "failed too" not in err
    assert f"fix: free space at {root}" in err
    result = failed.value.result
    assert (result.failed_stage, result.rollback, result.rollback_error) == ("deploy", "succeeded", "")
    assert (_files(root), _serving(world), world.registry.models.aliases("net")) == before
    assert ("ens", "2") not in world.registry.tags  # the version it registered, deleted
    assert world.fleet.loads == loads  # no replica was sent anything
    assert world.fleet.store.session.locks() == []
    assert world.registry.recorded[-1]["tags"]["result"] == "rolled back"

    monkeypatch.setattr(stages, "checkpoint", lambda point: None)
    (root / "filler.bin").unlink()
    world.promote("net", "2")
    _settled(world, "2")


def test_an_archive_on_another_file_system_is_moved_by_a_checked_copy_both_ways(
    tmp_path: Path, tmpfs: Callable[[Path, str], Path]
) -> None:
    """Item 3: the store's ``.mlreg-archive`` a tmpfs of its own (``rename`` fails with EXDEV).
    A promotion archives the version beyond the window by a copy (each file hashed as written and
    checked against the manifest, then the live one deleted); a promotion that fails brings back
    what it archived the same way; the rollback to an archived version brings it back from the
    archive; nothing says "not archived"."""
    world = _world(tmp_path)
    archive = tmpfs(tmp_path / ".mlreg-archive", "4m")
    assert archive.stat().st_dev != world.store_root.stat().st_dev
    for version in "23":
        _register(world, version)
    world.promote("net", "2")
    moved = world.promote("net", "3")  # keep 2: net v1 leaves before the load
    [stage] = [s for s in moved.stages if s.stage == "archive"]
    assert stage.detail.startswith("keep 2: archived net v1 (")
    # ens re-pointed: registered as v3 by deploy, folders 1, 2, 3 -- retain moves v1 once it serves
    [stage] = [s for s in moved.stages if s.stage == "retain"]
    assert stage.detail.startswith("keep 2: archived ens v1 (")
    assert "not archived" not in " ".join(s.detail for s in moved.stages)
    store, copy = world.fleet.store, world.fleet.store.archive()
    assert (store.list_versions("net"), copy.list_versions("net")) == (["2", "3"], ["1"])
    digest = world.registry.tags[("net", "1")]["artifact_digest"]
    assert copy.versions.verify_version("net", "1", digest, full=True).status == "verified"

    world.fleet.nan_answers.add(("net", "1"))  # the rollback to v1 fails its smoke test
    with pytest.raises(PromotionFailed, match="rolled back, the previous versions serve") as failed:
        world.promote("net", "1")
    detail = failed.value.result.stages[-1].detail
    assert "net/2 back from the archive" in detail  # the make_room of this attempt, undone
    assert (store.list_versions("net"), copy.list_versions("net")) == (["2", "3"], ["1"])
    assert store.versions.verify_version("net", "2", world.registry.tags[("net", "2")]["artifact_digest"])
    assert _serving(world) == {"t0:8001": ["3"], "t1:8001": ["3"]}
    assert world.registry.models.aliases("net")["test"] == "3"
    assert store.session.locks() == []

    world.fleet.nan_answers.clear()
    back = world.promote("net", "1")  # from the archive, verified; v2 leaves for it
    [stage] = [s for s in back.stages if s.stage == "archive"]
    assert stage.detail.startswith("keep 2: archived net v2 (")
    [stage] = [s for s in back.stages if s.stage == "retain"]
    assert stage.detail.startswith("keep 2: archived ens v2 (")
    _settled(world, "1")
    assert (store.list_versions("net"), copy.list_versions("net")) == (["1", "3"], ["2"])
    assert copy.versions.verify_version("net", "2", full=True).status == "verified"


def test_store_gc_moves_to_an_archive_on_another_file_system_and_a_rerun_has_nothing_left(
    tmp_path: Path, tmpfs: Callable[[Path, str], Path], registry_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3 through ``mlreg store gc``: the local environment's archive a tmpfs of its own;
    gc exits 0 and moves every version beyond the window (a copy checked, then the live one
    deleted); the archive's copies verify; no lock is left; a rerun moves nothing."""
    monkeypatch.setenv("MLREG_HOME", str(registry_home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = open_store(registry_home / "model_repository")
    source = tmp_path / "src" / "m"
    for version in "1234":
        (source / version).mkdir(parents=True)
        (source / version / "model.py").write_text(f"VERSION = {version}\n")
        (source / version / "weights.bin").write_bytes(os.urandom(50_000))
        store.versions.put_version("m", version, source / version)
    store.session.write_config(
        "m", 'name: "m"\nbackend: "python"\nversion_policy: { specific: { versions: [4] } }\n'
    )
    tmpfs(registry_home / ".mlreg-archive", "4m")
    done = CliRunner().invoke(app, ["store", "gc", "--keep", "2"])
    assert done.exit_code == 0, done.output
    assert "not moved" not in done.stdout
    assert "2 version(s), freed " in done.stdout
    archive = store.archive()
    assert (store.list_versions("m"), archive.list_versions("m")) == (["3", "4"], ["1", "2"])
    for version in "12":
        assert archive.versions.verify_version("m", version, full=True).status == "verified"
    assert store.session.locks() == []
    again = CliRunner().invoke(app, ["store", "gc", "--keep", "2", "--json"])
    assert again.exit_code == 0, again.output
    assert (json.loads(again.stdout)["moves"], json.loads(again.stdout)["failed"]) == ([], [])


def _truncate(world: World, version: str) -> Path:
    manifest = world.store_root / "net" / version / ".mlreg-manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    return manifest


def test_a_truncated_manifest_of_the_serving_version_is_listed_flagged_and_repaired_from_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4: net v2 serves and its manifest is cut to 40 bytes.  ``store ls`` lists it as
    "corrupt manifest" and goes on; ``status`` flags it; a promotion of a new version restores it
    from the registry (its way back) and goes ahead; a promotion of the serving version repairs it
    too (it is no no-op: its bytes cannot be verified), where both refused before."""
    from mlreg.ops import status, status_replicas

    world = _world(tmp_path)
    for version in "23":
        _register(world, version)
    world.promote("net", "2")
    manifest = _truncate(world, "2")
    root = str(world.store_root)

    listing = CliRunner().invoke(app, ["store", "ls", "--store", root])
    assert listing.exit_code == 0, listing.output
    rows = [line.split(None, 2) for line in listing.stdout.splitlines()[1:]]
    assert ["net", "2", "corrupt manifest  0"] in rows  # no file can be counted
    assert {(r[0], r[1]) for r in rows} == {
        ("ens", "1"),
        ("ens", "2"),
        ("pre", "1"),
        ("net", "1"),
        ("net", "2"),
    }
    listed = CliRunner().invoke(app, ["store", "ls", "--store", root, "--json"])
    [row] = [r for r in json.loads(listed.stdout)["versions"] if (r["model"], r["version"]) == ("net", "2")]
    assert row["state"] == "corrupt manifest"
    assert row["problems"][0].startswith(".mlreg-manifest.json is unreadable (truncated or not JSON)")

    assert (_serving(world), world.registry.models.aliases("net")["test"]) == (
        {"t0:8001": ["2"], "t1:8001": ["2"]},
        "2",
    )
    monkeypatch.setattr(status_replicas, "triton_connector", lambda settings, key=None: world.fleet.connect)
    [net] = status.model_status(world.settings, world.env, world.registry, ["net"])
    assert any(
        line.startswith("v2: its manifest net/2/.mlreg-manifest.json is unreadable (40 bytes")
        and "'mlreg store repair net 2'" in line
        for line in net["drift"]
    ), net["drift"]

    serving = world.promote("net", "2")  # the serving version: repaired, not a no-op
    assert not serving.noop
    _settled(world, "2")
    assert len(manifest.read_bytes()) > 40
    [net] = status.model_status(world.settings, world.env, world.registry, ["net"])
    assert net["drift"] == []

    _truncate(world, "2")
    result = world.promote("net", "3")  # v2, its way back, restored from the registry first
    [validate] = [s for s in result.stages if s.stage == "validate"]
    assert "net/2 (corrupt: restored by assemble)" in validate.detail
    [assemble] = [s for s in result.stages if s.stage == "assemble"]
    assert "net/2 restored from the registry (" in str(assemble.report)
    _settled(world, "3")
    world.fleet.store.versions.verify_version(
        "net", "2", world.registry.tags[("net", "2")]["artifact_digest"]
    )
