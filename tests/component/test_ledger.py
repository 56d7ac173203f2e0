"""The deployment ledger's chain (pipelines/ledger): where it lives, appends by conditional create,
never forks under concurrent writers (threads, processes, S3), and ``verify`` names any one edited,
removed or reordered event -- 100 of 100 trials -- on real local store folders and moto's
in-process S3 (which enforces ``If-None-Match``, as AWS does).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.ledger import LEDGER, Ledger, ledger_of
from pipelines.ledger.events import GENESIS, Event, Unreadable, decode, encode
from pipelines.storage import open_store
from pipelines.storage.base import Repository
from registry.errors import StorageError
from tests.unit.ledger_fixtures import fields


def chain_of(ledger: Ledger) -> list[Event]:
    events, findings = ledger.read_all()
    assert findings == []
    return events


def assert_one_chain(events: list[Event], count: int) -> None:
    """``count`` events at positions 1..count, each naming its predecessor's hash."""
    assert [e.seq for e in events] == list(range(1, count + 1))
    prev = GENESIS
    for event in events:
        assert event.prev == prev
        assert event.sealed().hash == event.hash
        prev = event.hash


# -- where it lives ---------------------------------------------------------------------------------


def test_a_local_ledger_lives_beside_the_store_never_in_what_triton_reads(tmp_path: Path) -> None:
    store = open_store(tmp_path / "repo")
    ledger = ledger_of(store.objects)
    ledger.append(**fields())
    assert (tmp_path / LEDGER / "repo" / "events" / "000000000001.json").is_file()
    assert (tmp_path / LEDGER / "repo" / "head.json").is_file()
    assert not (tmp_path / "repo").exists() or list((tmp_path / "repo").iterdir()) == []
    assert store.list_models() == []


def test_an_appended_event_is_stored_as_its_canonical_bytes_and_read_back(tmp_path: Path) -> None:
    ledger = ledger_of(open_store(tmp_path / "repo").objects)
    first = ledger.append(**fields())
    second = ledger.append(**fields(kind="unload", versions=(), version="", digests={}))
    stored = (tmp_path / LEDGER / "repo" / "events" / "000000000002.json").read_bytes()
    assert stored == encode(second)
    assert decode(stored) == second
    assert second.prev == first.hash
    assert second.prev_time == first.time
    assert second.prev_replica == "r0:8001"
    assert_one_chain(chain_of(ledger_of(open_store(tmp_path / "repo").objects)), 2)


def test_a_new_ledger_object_appends_after_the_last_event_another_wrote(tmp_path: Path) -> None:
    store = open_store(tmp_path / "repo")
    one, two = ledger_of(store.objects), ledger_of(store.objects)
    one.append(**fields())
    two.append(**fields())
    one.append(**fields())  # its head is stale: the create of 2 loses, it appends 3 after the winner
    assert_one_chain(chain_of(one), 3)


def test_an_append_after_a_removed_last_event_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "repo")
    ledger = ledger_of(store.objects)
    for _ in range(3):
        ledger.append(**fields())
    (tmp_path / LEDGER / "repo" / "events" / "000000000003.json").unlink()
    with pytest.raises(StorageError, match="event 3 was changed: it is missing"):
        ledger_of(store.objects).append(**fields())
    assert not (tmp_path / LEDGER / "repo" / "events" / "000000000003.json").exists()


# -- concurrent writers -----------------------------------------------------------------------------


def test_eight_threads_with_a_ledger_object_each_never_fork_the_chain(tmp_path: Path) -> None:
    store = open_store(tmp_path / "repo")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        ledger = ledger_of(store.objects)  # its own head: every create races the others
        start.wait(timeout=10)
        try:
            for _ in range(25):
                ledger.append(**fields(replica=f"r{index}:8001"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert not any(t.is_alive() for t in threads)
    events = chain_of(ledger_of(store.objects))
    assert_one_chain(events, 200)
    assert {e.replica for e in events} == {f"r{i}:8001" for i in range(8)}


def _process_writer(root: str, index: int, count: int) -> None:
    ledger = ledger_of(open_store(root).objects)
    for _ in range(count):
        ledger.append(**fields(replica=f"p{index}:8001"))


def test_four_processes_appending_at_once_never_fork_the_chain(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_process_writer, args=(str(tmp_path / "repo"), i, 20)) for i in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    events = chain_of(ledger_of(open_store(tmp_path / "repo").objects))
    assert_one_chain(events, 80)
    assert sorted(e.replica for e in events) == sorted(f"p{i}:8001" for i in range(4) for _ in range(20))


# -- verify names any one edited, removed or reordered event -----------------------------------------


def _tamper(rng: random.Random, folder: Path, count: int) -> tuple[str, set[int]]:
    """One change to one event (a swap moves two): what was done and the positions to name."""
    how = rng.choice(["remove", "edit", "edit-resealed", "swap", "garble"])
    position = rng.randint(1, count)
    path = folder / f"{position:012d}.json"
    if how == "remove":
        path.unlink()
    elif how == "swap":
        other = position + 1 if position < count else position - 1
        other_path = folder / f"{other:012d}.json"
        a, b = path.read_bytes(), other_path.read_bytes()
        path.write_bytes(b)
        other_path.write_bytes(a)
        return how, {position, other}
    elif how == "garble":
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data) - 1)] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        event = decode(path.read_bytes())
        changed = Event(**{**event.__dict__, "version": str(int(event.version) + 1)})
        if how == "edit-resealed":  # the hash recomputed too: the successor's link names it
            changed = changed.sealed()
        path.write_bytes(encode(changed))
    return how, {position}


def test_any_one_edited_removed_or_reordered_event_is_named_in_100_of_100_trials(tmp_path: Path) -> None:
    rng = random.Random(49)
    named = 0
    for trial in range(100):
        store = open_store(tmp_path / f"repo{trial}")
        ledger = ledger_of(store.objects)
        count = rng.randint(2, 12)
        for i in range(count):
            ledger.append(**fields(replica=f"r{i % 3}:8001", versions=(str(i + 1),)))
        how, positions = _tamper(rng, tmp_path / LEDGER / f"repo{trial}" / "events", count)
        findings = ledger_of(store.objects).read_all()[1]
        assert {f.position for f in findings} == positions, (trial, how, [f.line() for f in findings])
        if how != "garble":  # each named with its time and replica (a removed one: its successor's link)
            assert all(f.time for f in findings), (trial, how, findings)
            assert all(f.replica for f in findings), (trial, how, findings)
        named += 1
    assert named == 100


def test_a_removed_last_event_is_named_with_its_time_and_replica(tmp_path: Path) -> None:
    ledger = ledger_of(open_store(tmp_path / "repo").objects)
    for i in range(3):
        last = ledger.append(**fields(replica=f"r{i}:8001"))
    (tmp_path / LEDGER / "repo" / "events" / "000000000003.json").unlink()
    findings = ledger.read_all()[1]
    assert [f.line() for f in findings] == [
        f"event 3 ({last.time}, replica r2:8001): removed (head.json names it as the last event)"
    ]


def test_a_removed_first_event_is_named_from_its_successor(tmp_path: Path) -> None:
    ledger = ledger_of(open_store(tmp_path / "repo").objects)
    first = ledger.append(**fields(replica="r7:8001"))
    ledger.append(**fields())
    (tmp_path / LEDGER / "repo" / "events" / "000000000001.json").unlink()
    findings = ledger.read_all()[1]
    assert [(f.position, f.time, f.replica) for f in findings] == [(1, first.time, "r7:8001")]


def test_an_object_added_beside_the_events_is_named(tmp_path: Path) -> None:
    ledger = ledger_of(open_store(tmp_path / "repo").objects)
    ledger.append(**fields())
    (tmp_path / LEDGER / "repo" / "events" / "extra.json").write_text("{}")
    findings = ledger.read_all()[1]
    assert len(findings) == 1
    assert "events/extra.json' is not an event" in findings[0].what


# -- what is read back is untrusted ------------------------------------------------------------------


def _stored(tmp_path: Path) -> bytes:
    ledger_of(open_store(tmp_path / "repo").objects).append(**fields())
    return (tmp_path / LEDGER / "repo" / "events" / "000000000001.json").read_bytes()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d.replace(b'"kind":"load"', b'"kind":"launch"'), "field 'kind' is not"),
        (lambda d: d.replace(b'"seq":1', b'"seq":1,"seq":2'), "a key is repeated"),
        (lambda d: d.replace(b'"seq":1', b'"seq":NaN'), "NaN is not a JSON number"),
        (lambda d: d.replace(b'"detail":""', b'"detail":"a\\nb"'), "field 'detail' is not printable"),
        (lambda d: d.replace(b'"model":"m"', b'"model":"../x"'), "field 'model' is not a model name"),
        (lambda d: d.replace(b'"env":"local"', b'"env":"local","extra":1'), "unexpected or missing: extra"),
        (lambda d: d + b" " * 70_000, "more than the 65536 an event may have"),
        (lambda d: d.replace(b":", b": ", 1), "not the event's canonical encoding"),
        (lambda d: b"[" + d + b"]", "not a JSON object"),
    ],
)
def test_bytes_that_are_not_an_event_are_refused_saying_why(tmp_path: Path, change: Any, why: str) -> None:
    with pytest.raises(Unreadable, match=why.replace("(", r"\(")):
        decode(change(_stored(tmp_path)))


def test_a_deeply_nested_event_is_refused_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(Unreadable, match="not JSON|is not"):
        decode(b"[" * 30_000 + b"]" * 30_000)


# -- on S3 ---------------------------------------------------------------------------------------------


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
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ledger")
            yield "ledger"


def _keys(bucket: str) -> list[str]:
    import boto3

    found = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in found.get("Contents", []))


def test_on_s3_the_ledger_sits_beside_the_prefix_and_two_writers_never_fork_it(s3_bucket: str) -> None:
    """Two writers, each a step behind the other, on S3: every append first loses its conditional
    create to the other writer's event (412 to ``If-None-Match: *``), reads the winner and appends
    after it.  The race is provoked in turn, not by threads: moto's check of ``If-None-Match`` and
    its put are two steps (moto/s3/responses.py: ``get_object`` then ``put_object``), so two
    threads can both "create" one key on moto, which AWS never lets happen -- the threaded and
    multi-process races run on the local store, whose create is one atomic ``link``."""
    store = open_store(f"s3://{s3_bucket}/models/staging", region="us-east-1")
    first, second = ledger_of(store.objects), ledger_of(store.objects)
    first.append(**fields(replica="s0:8001"))
    for _ in range(9):
        second.append(**fields(replica="s1:8001"))  # knows none, or an old head: loses, then follows
        first.append(**fields(replica="s0:8001"))  # its head is one behind: loses, then follows
    second.append(**fields(replica="s1:8001"))
    assert_one_chain(chain_of(ledger_of(store.objects)), 20)
    replicas = [event.replica for event in chain_of(ledger_of(store.objects))]
    assert replicas.count("s0:8001") == replicas.count("s1:8001") == 10
    keys = _keys(s3_bucket)
    assert all(k.startswith("models/.mlreg-ledger/staging/") for k in keys), keys
    assert "models/.mlreg-ledger/staging/head.json" in keys
    assert store.list_models() == []
    # the place `mlreg ledger verify --json` and the ledger's errors name: its folder, with its slash
    assert first.uri == f"s3://{s3_bucket}/models/.mlreg-ledger/staging/"


def test_on_s3_a_store_at_the_buckets_root_keeps_its_ledger_in_files_triton_ignores(s3_bucket: str) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="rooted")
    store = open_store("s3://rooted", region="us-east-1")
    ledger = ledger_of(store.objects)
    ledger.append(**fields())
    ledger.append(**fields())
    assert _keys("rooted") == [
        ".mlreg-ledger.events.000000000001.json",
        ".mlreg-ledger.events.000000000002.json",
        ".mlreg-ledger.head.json",
    ]
    assert store.list_models() == []  # no folder at the root: Triton sees no model
    assert_one_chain(chain_of(ledger_of(store.objects)), 2)


def test_on_s3_a_removed_event_is_named(s3_bucket: str) -> None:
    import boto3

    store = open_store(f"s3://{s3_bucket}/tamper/prod", region="us-east-1")
    ledger = ledger_of(store.objects)
    for i in range(4):
        ledger.append(**fields(replica=f"r{i}:8001"))
    boto3.client("s3", region_name="us-east-1").delete_object(
        Bucket=s3_bucket, Key="tamper/.mlreg-ledger/prod/events/000000000002.json"
    )
    findings = ledger_of(store.objects).read_all()[1]
    assert [(f.position, f.replica) for f in findings] == [(2, "r1:8001")]
    assert json.loads(encode(ledger.read_all()[0][0]))["seq"] == 1


def test_a_ledger_store_object_is_not_the_repository_session(tmp_path: Path) -> None:
    """Its writes are no change of the repository: no journal entry an undo would take back."""
    store: Repository = open_store(tmp_path / "repo")
    ledger_of(store.objects).append(**fields())
    assert store.session.changed_keys == set()


def test_an_append_never_follows_an_event_that_does_not_name_its_head(tmp_path: Path) -> None:
    store = open_store(tmp_path / "repo")
    ledger = ledger_of(store.objects)
    ledger.append(**fields())
    head = ledger.append(**fields())
    forged = Event(
        seq=3, prev="f" * 64, prev_time=head.time, prev_replica=head.replica, time=head.time, **fields()
    ).sealed()
    assert ledger.objects.create(ledger.key(3), encode(forged))
    with pytest.raises(StorageError, match="event 3 does not follow event 2: the ledger was changed"):
        ledger.append(**fields())
    assert ledger.seqs() == [1, 2, 3]


def test_a_recorder_whose_ledger_cannot_be_written_notes_it_and_never_raises(tmp_path: Path) -> None:
    from pipelines.ledger import Recorder

    store = open_store(tmp_path / "repo")
    (tmp_path / LEDGER).write_text("a file where the ledger's folder would be")
    recorder = Recorder(ledger_of(store.objects), store, "local")
    assert recorder.sent("r0:8001", "m", ("1",), ()) is None
    assert len(recorder.problems) == 1
    assert "the m call to r0:8001 is not in the ledger" in recorder.problems[0]
    assert recorder.events == []


def test_a_background_recorder_appends_every_call_in_the_order_each_replica_sent_it(tmp_path: Path) -> None:
    from pipelines.ledger import Recorder

    store = open_store(tmp_path / "repo")
    recorder = Recorder(ledger_of(store.objects), store, "local", background=True)
    start = threading.Barrier(8)

    def replica(index: int) -> None:
        start.wait(timeout=10)
        for version in range(1, 21):
            assert recorder.sent(f"r{index}:8001", "m", (str(version),), ()) is None  # returns at once

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    recorder.flush()
    assert recorder.problems == []
    events = chain_of(ledger_of(store.objects))
    assert_one_chain(events, 160)
    for index in range(8):
        mine = [e for e in events if e.replica == f"r{index}:8001"]
        assert [e.version for e in mine] == [str(v) for v in range(1, 21)]
        assert [e.time for e in mine] == sorted(e.time for e in mine)


def test_what_a_replica_or_a_failure_said_is_recorded_printable_and_verifies(tmp_path: Path) -> None:
    from pipelines.ledger import Recorder

    store = open_store(tmp_path / "repo")
    recorder = Recorder(ledger_of(store.objects), store, "local")
    said = 'failed to load\x00 "\x1b[31m' + "x" * 5000
    event = recorder.sent("r0:8001\x07", "m", ("1",), (), result="failed", detail=said)
    assert event is not None
    assert event.replica == "r0:8001?"
    assert event.detail.startswith('failed to load? "?[31mxxx')
    assert len(event.detail) == 1024
    assert chain_of(ledger_of(store.objects)) == [event]


def test_an_event_no_reader_would_take_is_never_written(tmp_path: Path) -> None:
    ledger = ledger_of(open_store(tmp_path / "repo").objects)
    with pytest.raises(StorageError, match="is not one the ledger takes: field 'model' is not a model name"):
        ledger.append(**fields(model="../escape"))
    assert ledger.seqs() == []


def test_the_verb_that_asked_names_the_operation_of_the_fleets_made_under_it(tmp_path: Path) -> None:
    from pipelines.ledger.recorder import for_fleet, operation

    store = open_store(tmp_path / "repo")
    with operation("sync"):
        synced = for_fleet(store, "prod")
        with operation("rollback"):
            rolled = for_fleet(store, "prod")
    plain = for_fleet(store, "prod")
    assert synced is not None
    assert rolled is not None
    assert plain is not None
    assert (synced.operation, rolled.operation, plain.operation) == ("sync", "rollback", "promote")
    assert synced.background
    assert synced.promotion != plain.promotion
    assert synced.sent("r0:8001", "m", ("1",), (), undo=True) is None  # in the background
    synced.flush()
    assert [(e.operation, e.promotion) for e in chain_of(ledger_of(store.objects))] == [
        ("undo", synced.promotion)
    ]
