"""The relay's receiver over real HTTP (its starlette app on a real uvicorn, 127.0.0.1), its
durable queue and its store record: a forged, replayed or stale delivery deploys nothing; an
alias nobody follows is ignored; a move is deployed once and its rollback target recorded."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from mlreg.relay import record
from mlreg.relay.queue import Queue
from mlreg.relay.wire import MAX_BODY, Refused, sign, signature_ok, verify
from pipelines.storage.base import Repository
from tests.unit.relay_world import (
    MODEL,
    SECRET,
    Clock,
    StandIn,
    delivery,
    home_with_registry,
    make_relay,
    served_app,
    set_alias,
)


def post(base: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"{base}/webhook", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def world(registry_state: Callable[[str], Path], tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", versions=5)
    clock, standin = Clock(), StandIn(served={MODEL: "1"})
    relay = make_relay(settings, tmp_path / "store", standin, clock)
    return settings, relay, standin, clock, tmp_path


def test_forged_replayed_and_stale_deliveries_are_refused_and_deploy_nothing(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    db = settings.home / "mlflow.db"
    set_alias(db, MODEL, "champion", "2")
    with served_app(relay) as base:
        headers, body = delivery(MODEL, "champion", "2", clock.now, secret=b"not-the-secret")
        forged = post(base, headers, body)
        headers, body = delivery(MODEL, "champion", "2", clock.now)
        tampered = post(base, headers, body.replace(b'"2"', b'"3"'))
        unsigned = post(base, {k: v for k, v in headers.items() if k != "x-mlflow-signature"}, body)
        stale_headers, stale_body = delivery(MODEL, "champion", "2", clock.now - 301)
        stale = post(base, stale_headers, stale_body)
        future_headers, future_body = delivery(MODEL, "champion", "2", clock.now + 301)
        future = post(base, future_headers, future_body)
        big = post(base, headers, b"x" * (MAX_BODY + 1))
        assert (forged[0], tampered[0], unsigned[0], stale[0], future[0], big[0]) == (
            401,
            401,
            401,
            401,
            401,
            413,
        )
        assert relay.queue.pending() == []  # nothing queued by any of them
        first = post(base, headers, body)
        replay = post(base, headers, body)
    assert first == (202, {"queued": {"production": "queued"}})
    assert replay[0] == 409
    relay.drain()
    relay.drain()
    assert standin.deploys == [("production", MODEL, "2")]  # the one good delivery, once
    assert standin.served[MODEL] == "2"
    stored = record.read(Repository.local(tmp / "store").objects, "production", MODEL)
    assert (stored.deployed, stored.previous) == ("2", "1")  # the rollback target: what served before


def test_an_alias_or_model_nobody_follows_is_ignored_and_logged(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, _ = world
    set_alias(settings.home / "mlflow.db", MODEL, "staging", "3")
    status, doc = relay.receive(*delivery(MODEL, "staging", "3", clock.now))
    assert (status, relay.queue.pending()) == (202, [])
    assert "nobody follows alias 'staging'" in str(doc["ignored"])
    assert relay.queue.last_event()["outcome"].startswith("ignored")  # type: ignore[index]
    relay.drain()
    assert standin.deploys == []


def test_a_move_to_what_already_serves_deploys_nothing(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "1")  # the version that serves
    assert relay.receive(*delivery(MODEL, "champion", "1", clock.now))[0] == 202
    assert [state for _, state in relay.drain()] == ["noop"]
    assert standin.deploys == []
    assert relay.queue.last_final("production", MODEL, "1", ("noop",)) is not None
    assert (
        Repository.local(tmp / "store").objects.read(record.key("production", MODEL)) is None
    )  # no record written


def test_the_queue_survives_a_restart_and_still_refuses_a_replay(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "4")
    headers, body = delivery(MODEL, "champion", "4", clock.now)
    assert relay.receive(headers, body)[0] == 202
    relay.queue.close()  # the process stops before acting
    again = make_relay(settings, tmp / "store", standin, clock)
    assert again.receive(headers, body)[0] == 409  # the delivery id is on disk
    assert [(job.model, job.version) for job in again.queue.pending()] == [(MODEL, "4")]
    again.drain()
    assert standin.deploys == [("production", MODEL, "4")]


def test_a_refused_version_is_recorded_and_not_retried_until_the_alias_moves(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, _ = world
    db = settings.home / "mlflow.db"
    standin.refuse.add("3")
    set_alias(db, MODEL, "champion", "3")
    relay.reconcile()
    assert [state for _, state in relay.drain()] == ["refused"]
    assert relay.reconcile()["queued"] == []  # the refusal is kept: nothing queued again
    set_alias(db, MODEL, "champion", "4")
    assert relay.reconcile()["queued"] == [{"environment": "production", "model": MODEL, "version": "4"}]
    relay.drain()
    assert standin.served[MODEL] == "4"
    assert standin.deploys == [("production", MODEL, "4")]


def test_a_job_whose_alias_moved_on_is_superseded(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, _ = world
    db = settings.home / "mlflow.db"
    set_alias(db, MODEL, "champion", "2")
    relay.receive(*delivery(MODEL, "champion", "2", clock.now))
    set_alias(db, MODEL, "champion", "1")  # moved back before the relay acted (no event reached it)
    assert [state for _, state in relay.drain()] == ["superseded"]
    assert standin.deploys == []


def test_a_held_store_lock_leaves_the_job_pending(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.receive(*delivery(MODEL, "champion", "2", clock.now))
    other = Repository.local(tmp / "store")
    with record.lock(other.session, "production", MODEL, None):  # another relay acts on this environment
        assert [state for _, state in relay.drain()] == ["busy"]
    assert standin.deploys == []
    assert [state for _, state in relay.drain()] == ["done"]
    assert standin.deploys == [("production", MODEL, "2")]


def test_signature_checks_are_constant_time_over_the_raw_bytes() -> None:
    body = b'{"entity": "model_version_alias", "action": "created", "data": {}}'
    header = sign(SECRET, "d1", "100", body)
    assert signature_ok(SECRET, "d1", "100", body, header)
    assert signature_ok(SECRET, "d1", "100", body, f"v1,AAAA {header}")  # a rotated secret's pair
    assert not signature_ok(SECRET, "d1", "100", body + b" ", header)  # re-serialised: refused
    assert not signature_ok(SECRET, "d2", "100", body, header)
    assert not signature_ok(SECRET, "d1", "100", body, header.replace("v1,", "v2,"))
    with pytest.raises(Refused) as refused:
        verify({"x-mlflow-delivery-id": "d1", "x-mlflow-timestamp": "100"}, body, SECRET, 100.0, 300.0)
    assert refused.value.status == 401


def test_a_second_queue_on_one_file_sees_the_same_jobs(tmp_path: Path) -> None:
    one, two = Queue(tmp_path / "q.db"), Queue(tmp_path / "q.db")
    assert one.enqueue("production", MODEL, "2", "event", 1.0) == "queued"
    assert two.enqueue("production", MODEL, "2", "event", 2.0) == "duplicate"
    assert two.enqueue("production", MODEL, "3", "event", 3.0) == "replaced"
    assert [(job.version, job.source) for job in one.pending()] == [("3", "event")]
    assert one.first_delivery("d", 1.0, 600.0)
    assert not two.first_delivery("d", 2.0, 600.0)


def test_a_busy_queue_answers_503_and_records_nothing_so_the_retry_is_taken(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, _ = world
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.queue = Queue(relay.queue.path, busy_s=0.2)
    headers, body = delivery(MODEL, "champion", "2", clock.now)
    holder = sqlite3.connect(relay.queue.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the queue's file
    try:
        assert relay.receive(headers, body)[0] == 503
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert relay.queue.pending() == []
    assert relay.receive(headers, body) == (202, {"queued": {"production": "queued"}})  # MLflow's retry
    relay.drain()
    assert standin.deploys == [("production", MODEL, "2")]


def test_a_stopping_relay_starts_no_new_job(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, _ = world
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.receive(*delivery(MODEL, "champion", "2", clock.now))
    relay.stopping.set()  # SIGTERM: the job under way finishes, no other starts
    assert relay.drain() == []
    assert [(job.version, job.attempts) for job in relay.queue.pending()] == [("2", 0)]  # for the next start
    assert standin.deploys == []
