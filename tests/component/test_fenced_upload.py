"""Issue 45 item 8 (first half): a fenced promotion's upload is removed by the lock's next holder
(pipelines/promote/litter.py), on a real local store.

The fenced promotion is played as tests/component/test_fencing.py plays it: a lease whose renewer never
runs (the holder's process stopped) and a short lease that really runs out; another store object on
the same folder takes the stale lock over.  Before: the fenced promotion's upload (scorer v10, new to
the store) stayed live under the prefix Triton reads, nobody's to remove.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipelines.core.litter import forget_uploads, marker_key, note_upload, remove_fenced_uploads
from pipelines.storage.base import Repository
from pipelines.storage.lease import Lease
from registry.errors import TritonError
from tests.unit.worlds import MEMBER, World

TTL = 0.2
OTHER = "other@elsewhere:2"
CONFIG = """name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy { specific { versions: [ 8 ] } }
"""


def _version(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(text)
    return folder


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """scorer v7 and v8 stored, the config lists 8."""
    root = tmp_path / "store"
    seed = Repository.local(root)
    for version in ("7", "8"):
        seed.versions.put_version("scorer", version, _version(tmp_path / "src" / version, f"v{version}\n"))
    seed.session.write_config("scorer", CONFIG)
    return root


def test_the_next_holder_removes_the_upload_of_a_promotion_that_lost_its_lock(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Lease, "_renew_loop", lambda self: None)  # the fenced holder is frozen
    mine = Repository.local(repo)
    with mine.session.lock("scorer", ttl=TTL) as lease:
        note_upload(mine, "scorer", "10")  # as assemble does, before the upload
        mine.versions.put_version("scorer", "10", _version(tmp_path / "src" / "10", "v10\n"))
        marker = json.loads((repo / marker_key("scorer", "10")).read_text())
        assert (marker["owner"], marker["token"]) == (lease.owner, lease.token)
        time.sleep(TTL * 1.25)  # frozen past its lease: the lock is another's to take
        other = Repository.local(repo)
        with other.session.lock("scorer", owner=OTHER, ttl=60):
            before = _tree(repo)
            lines = remove_fenced_uploads(other, ["scorer"], {})
            assert lines == [
                f"scorer/10 removed from {repo}: uploaded by {lease.owner}'s promotion, which lost its lock "
                "before it finished (a fenced promotion writes nothing, its undo included)"
            ]
            after = _tree(repo)
        assert mine.session.fenced()  # the fenced one could not have removed it itself
    assert [p for p in before if p not in after] == sorted(
        [marker_key("scorer", "10"), *[p for p in before if p.startswith("scorer/10/")]]
    )
    assert other.list_versions("scorer") == ["7", "8"]  # only what the fenced promotion made
    assert other.read_config("scorer") == CONFIG


def test_only_a_marked_unserved_folder_of_another_holder_is_removed(repo: Path, tmp_path: Path) -> None:
    store = Repository.local(repo)
    store.versions.put_version(
        "scorer", "11", _version(tmp_path / "src" / "11", "pushed by hand\n")
    )  # no marker
    store.objects.write(
        marker_key("scorer", "8"),
        json.dumps({"model": "scorer", "version": "8", "owner": "x", "token": "t1"}).encode(),
    )  # serves now
    store.objects.write(marker_key("scorer", "7"), b"{not json")  # not ours: named, left
    with store.session.lock("scorer", owner="me@here:1", ttl=60) as lease:
        note_upload(store, "scorer", "9")
        store.versions.put_version(
            "scorer", "9", _version(tmp_path / "src" / "9", "mine\n")
        )  # this holder's own
        lines = remove_fenced_uploads(store, ["scorer"], {})
        assert lines == [
            f"{repo}: {marker_key('scorer', '7')} is not an upload marker mlreg wrote: left as it is "
            "(remove it by hand)"
        ]
        assert store.list_versions("scorer") == ["7", "8", "9", "11"]
        assert not (repo / marker_key("scorer", "8")).exists()  # a serving version's stale marker dropped
        assert (repo / marker_key("scorer", "9")).exists()
        assert json.loads((repo / marker_key("scorer", "9")).read_text())["token"] == lease.token
        assert forget_uploads(store, [("scorer", "9")]) == []  # finished: the marker goes
    assert not (repo / marker_key("scorer", "9")).exists()
    assert remove_fenced_uploads(store, ["scorer"], {}) == []  # no lock held here: nothing is proven


def test_a_promotion_leaves_no_marker_and_its_resolve_removes_a_fenced_ones_upload(tmp_path: Path) -> None:
    """Wired into the promotion: ``resolve`` (under the locks it took) removes a fenced promotion's
    upload; ``assemble`` marks its own upload and ``record`` removes the marker once it succeeded."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    store = Repository.local(world.store_root)
    source = tmp_path / "fenced"
    (source / "model.py").parent.mkdir(parents=True)
    (source / "model.py").write_text("# a fenced promotion's upload of net v3\n")
    store.versions.put_version("net", "3", source)
    marker = {"model": "net", "version": "3", "owner": "ci@runner-7:99", "token": "f" * 24, "at": 0}
    store.objects.write(marker_key("net", "3"), json.dumps(marker).encode())
    result = world.promote("net", "2")
    assert (
        f"net/3 removed from {world.store_root}: uploaded by ci@runner-7:99's promotion, which lost its lock "
        "before it finished (a fenced promotion writes nothing, its undo included)"
    ) in result.notes
    assert store.list_versions("net") == ["1", "2"]
    assert not any(
        p.name.startswith(".mlreg-upload.") for p in world.store_root.iterdir()
    )  # net v2's gone too


def test_store_gc_removes_a_fenced_promotions_upload_under_the_locks_it_takes(
    repo: Path, tmp_path: Path
) -> None:
    """The other way it goes: ``mlreg store gc`` (retention.collect, under each model's lock)."""
    from pipelines.promote import retention

    store = Repository.local(repo)
    store.versions.put_version("scorer", "10", _version(tmp_path / "src" / "10", "a fenced promotion's\n"))
    marker = {"model": "scorer", "version": "10", "owner": "ci@runner-7:99", "token": "e" * 24}
    store.objects.write(marker_key("scorer", "10"), json.dumps(marker).encode())
    dry = retention.collect(store, dict, lambda model, version: "", keep=5, dry_run=True)
    assert dry.litter == []  # a dry run removes nothing
    assert store.list_versions("scorer") == ["7", "8", "10"]
    report = retention.collect(store, dict, lambda model, version: "", keep=5)
    assert report.litter == [
        f"scorer/10 removed from {repo}: uploaded by ci@runner-7:99's promotion, which lost its lock before "
        "it finished (a fenced promotion writes nothing, its undo included)"
    ]
    assert report.to_dict()["fenced_uploads_removed"] == report.litter
    assert report.litter[0] in report.detail()
    assert store.list_versions("scorer") == ["7", "8"]
    assert not (repo / marker_key("scorer", "10")).exists()


# -- issue 45 review, F4: "serves" asked of the replicas too ---------------------------------------

FENCED = {"model": "scorer", "version": "10", "owner": "ci@runner-7:99", "token": "f" * 24, "at": 0}


def _fenced_upload(repo: Path, tmp_path: Path) -> Repository:
    """scorer v10 uploaded by a promotion that lost its lock (its marker names another lease)."""
    store = Repository.local(repo)
    store.versions.put_version("scorer", "10", _version(tmp_path / "src" / "10", "v10\n"))
    store.objects.write(marker_key("scorer", "10"), json.dumps(FENCED).encode())
    return store


@pytest.mark.parametrize(
    "replicas",
    [
        {"t0:8001": {"scorer": {"8": "READY", "10": "READY"}}, "t1:8001": {"scorer": {"8": "READY"}}},
        {"t0:8001": {"scorer": {"8": "READY", "10": "LOADING"}}},
        {"t0:8001": {"scorer": {"8": "READY"}, "scorer__mlreg_quality": {"10": "READY"}}},
    ],
    ids=["ready-on-the-canary", "still-loading", "the-gate-s-private-name"],
)
def test_an_upload_a_replica_still_holds_is_kept(repo: Path, tmp_path: Path, replicas: dict) -> None:  # type: ignore[type-arg]
    """A promotion fenced during its canary gate left v10 loaded there; the store's config lists
    only v8.  Before: the next holder deleted v10's folder under the replica serving it.  Now kept,
    its marker too (the proof stays for when the replica is put back), and said so."""
    store = _fenced_upload(repo, tmp_path)
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], replicas)
    assert lines == [
        f"scorer/10 (uploaded by ci@runner-7:99's promotion, which lost its lock) kept in {repo}: a replica "
        "still holds it; 'mlreg status' names where -- put that replica back, then rerun"
    ]
    assert store.list_versions("scorer") == ["7", "8", "10"]
    assert _tree(repo / "scorer" / "10")  # its files, every one
    assert (repo / marker_key("scorer", "10")).exists()


def test_an_upload_is_not_removed_while_a_replica_cannot_be_asked(repo: Path, tmp_path: Path) -> None:
    store = _fenced_upload(repo, tmp_path)
    replicas = {"t0:8001": {"scorer": {"8": "READY"}}, "t1:8001": TritonError("t1:8001 does not answer")}
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], replicas)  # type: ignore[arg-type]
    assert lines == [
        "upload markers of scorer not checked: t1:8001 cannot be asked what it serves, so no upload is "
        "removed now (the next promotion or 'mlreg store gc' does)"
    ]
    assert store.list_versions("scorer") == ["7", "8", "10"]
    assert (repo / marker_key("scorer", "10")).exists()


def test_an_upload_no_replica_holds_is_removed(repo: Path, tmp_path: Path) -> None:
    """The positive control: v10 failed (UNAVAILABLE) or is absent everywhere: litter, removed."""
    store = _fenced_upload(repo, tmp_path)
    replicas = {
        "t0:8001": {"scorer": {"8": "READY", "10": "UNAVAILABLE"}},
        "t1:8001": {"scorer": {"8": "READY"}},
    }
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], replicas)
    assert [line.split(":")[0] for line in lines] == ["scorer/10 removed from " + str(repo).split(":")[0]]
    assert store.list_versions("scorer") == ["7", "8"]
    assert not (repo / marker_key("scorer", "10")).exists()


def test_resolve_keeps_a_fenced_candidate_the_canary_still_serves(tmp_path: Path) -> None:
    """Wired into the promotion: net v3, a fenced promotion's upload, is still READY on the canary
    t0 (the store's config lists v1): the next promotion's resolve keeps its folder and marker."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    store = Repository.local(world.store_root)
    source = tmp_path / "fenced"
    source.mkdir()
    (source / "model.py").write_text("# a fenced promotion's upload of net v3\n")
    store.versions.put_version("net", "3", source)
    marker = {"model": "net", "version": "3", "owner": "ci@runner-7:99", "token": "f" * 24, "at": 0}
    store.objects.write(marker_key("net", "3"), json.dumps(marker).encode())
    world.fleet.connect("t0:8001").states["net"]["3"] = "READY"  # the fenced gate's candidate, left loaded
    after_resolve: list[tuple[list[str], bool]] = []

    def on_start(stage: str) -> None:
        if stage != "resolve" and not after_resolve:  # resolve ended: what it left
            after_resolve.append(
                (store.list_versions("net"), (world.store_root / marker_key("net", "3")).exists())
            )

    result = world.promote("net", "2", on_start=on_start)
    assert after_resolve == [(["1", "3"], True)]  # v2 is uploaded later, by assemble
    assert (
        f"net/3 (uploaded by ci@runner-7:99's promotion, which lost its lock) kept in {world.store_root}: "
        "a replica still holds it; 'mlreg status' names where -- put that replica back, then rerun"
    ) in result.notes
