"""An adversarial review of the deployment ledger (issue 49) and the alias relay (issue 50): each
test is an attack that worked before its fix, and asserts the state the attack must not reach
(what a stand-in server received, a file's bytes, the queue's rows, what was deployed)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mlreg.relay import record
from mlreg.relay.actions import dispatch
from mlreg.relay.config import Target
from pipelines.ledger import ledger_of
from pipelines.ledger.chain import verify_chain
from pipelines.storage import open_store
from pipelines.storage.base import Repository
from registry.errors import StorageError
from tests.unit.relay_world import MODEL, Clock, StandIn, home_with_registry, make_relay, set_alias

TOKEN = b"ghp_reviewtoken0123456789"
# a planted event's position: any 12 digits are read; 2 million keeps the unfixed walk (one finding
# per position, ~0.2 GB) short enough for its mutant to run on a shared machine
FAR = 2_000_000


# -- GitHub dispatch: the token never leaves for another host -----------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """Records every request's path and Authorization header; answers ``answer`` (a redirect to
    ``location`` when it is a 3xx)."""

    seen: list[tuple[str, str, str | None]]
    answer = 204
    location = ""

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(self.answer)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _any

    def log_message(self, *args: object) -> None:
        return


def _server(answer: int, location: str = "") -> tuple[ThreadingHTTPServer, list[Any]]:
    seen: list[Any] = []
    handler = type("Handler", (Recorder,), {"seen": seen, "answer": answer, "location": location})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def servers() -> Iterator[Callable[[int, str], tuple[str, list[Any]]]]:
    started: list[ThreadingHTTPServer] = []

    def start(answer: int, location: str = "") -> tuple[str, list[Any]]:
        server, seen = _server(answer, location)
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _target(api: str) -> Target:
    return Target("dispatch", "acme/models", "promote.yml", "main", "env:UNUSED", api)


@pytest.mark.parametrize("code", [301, 302, 303, 307])
def test_a_dispatch_answered_with_a_redirect_never_sends_the_token_to_the_host_it_names(
    servers: Callable[[int, str], tuple[str, list[Any]]], code: int
) -> None:
    elsewhere, seen_elsewhere = servers(204, "")
    api, seen_api = servers(code, f"{elsewhere}/steal")
    status, why = dispatch(_target(api), {"action": "promote"}, TOKEN)
    assert len(seen_api) == 1
    assert seen_api[0][2] == f"Bearer {TOKEN.decode()}"  # the API itself did get it
    assert seen_elsewhere == []  # the redirect was not followed: nothing, token or not, went there
    assert status == code
    assert TOKEN.decode() not in why


def test_a_token_with_a_character_no_header_takes_is_never_quoted_in_the_answer(
    servers: Callable[[int, str], tuple[str, list[Any]]],
) -> None:
    api, seen = servers(204, "")
    token = b"ghp_first\nX-Injected: ghp_secondhalf"
    status, why = dispatch(_target(api), {"action": "promote"}, token)  # raised ValueError('...token...')
    assert status == 0
    assert "ghp_first" not in why
    assert "secondhalf" not in why
    assert seen == []  # nothing sent


# -- the ledger: a planted position, a linked head pointer ---------------------------------------------


def _ledger_with_events(tmp_path: Path, count: int):  # type: ignore[no-untyped-def]
    store = open_store(str(tmp_path / "store"))
    ledger = ledger_of(store.objects)
    from tests.unit.ledger_fixtures import fields

    for _ in range(count):
        ledger.append(**fields())
    return ledger


def test_an_event_planted_at_a_huge_position_is_named_without_walking_every_position(tmp_path: Path) -> None:
    ledger = _ledger_with_events(tmp_path, 2)
    root = Path(ledger.objects.root)  # type: ignore[attr-defined]
    planted = root / "events" / f"{FAR:012d}.json"
    planted.write_bytes((root / "events" / f"{1:012d}.json").read_bytes())
    result: dict[str, Any] = {}

    def run() -> None:
        result["found"] = ledger.read_all()

    worker = threading.Thread(target=run, daemon=True)  # before the fix: 10**12 positions walked
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "verify walked every position up to the planted one"
    events, findings = result["found"]
    assert [e.seq for e in events] == [1, 2]
    whats = [f.what for f in findings]
    assert any("holds event 1" in w or "cannot be read" in w for w in whats)  # the planted one named
    assert len(findings) < 1100  # bounded, however far the planted position
    assert any("positions" in w and f"{FAR - 1}" in w for w in whats)  # the gap named, as one


def test_a_small_gap_still_names_each_removed_position() -> None:
    from pipelines.ledger.events import Event

    found: dict[int, Event | str] = {1: "x", 5: "y"}
    positions = sorted(f.position for f in verify_chain(found, None) if "removed" in f.what)
    assert positions == [2, 3, 4]


def test_a_head_pointer_linked_to_another_file_is_never_written_through(tmp_path: Path) -> None:
    ledger = _ledger_with_events(tmp_path, 1)
    head = Path(ledger.objects.root) / ledger.head_key  # type: ignore[attr-defined]
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not mlreg's\n")
    head.unlink()
    head.symlink_to(victim)
    from tests.unit.ledger_fixtures import fields

    with pytest.raises(StorageError, match="link"):
        ledger.append(**fields())
    assert victim.read_bytes() == b"not mlreg's\n"  # before the fix: 1 KiB pointer written over it
    assert head.is_symlink()  # not ours: left where it was


# -- the relay: names from the database and the queue's file, a planted record -------------------------


def _made(tmp: Path, word: str) -> list[Path]:
    near = [*tmp.rglob("*"), *tmp.parent.iterdir(), *tmp.parent.parent.iterdir()]
    return [p for p in near if word in p.name]


@pytest.fixture
def world(registry_state: Callable[[str], Path], tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", versions=5)
    clock, standin = Clock(), StandIn(served={MODEL: "1"})
    relay = make_relay(settings, tmp_path / "store", standin, clock)
    return settings, relay, standin, clock, tmp_path


def test_an_alias_written_in_the_database_for_a_model_named_with_path_characters_is_never_queued(
    world,
) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    db = settings.home / "mlflow.db"
    bad = "../../../xq9outside"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO registered_model_aliases (name, alias, version) VALUES (?, ?, ?)",
            (bad, "champion", 2),
        )
    summary = relay.reconcile()
    assert summary["queued"] == []
    assert len(summary["errors"]) == 1
    assert bad not in json.dumps(summary)
    relay.drain()
    assert standin.deploys == []
    assert relay.queue.recent_jobs() == []
    assert _made(tmp, "xq9outside") == []  # no record, no lock file, anywhere near


def test_a_job_planted_in_the_queue_file_with_path_characters_is_refused_before_any_lock(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    bad = "x/../../../xq9planted"
    with sqlite3.connect(relay.queue.path) as conn:
        conn.execute(
            "INSERT INTO jobs (env, model, version, source, state, created, updated) "
            "VALUES ('production', ?, '2', 'event', 'pending', 0, 0)",
            (bad,),
        )
    done = relay.drain()
    assert [state for _, state in done] == ["refused"]
    assert standin.deploys == []
    assert _made(tmp, "xq9planted") == []


def test_a_record_planted_with_a_future_time_does_not_stop_the_relay_deploying(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    store = Repository.local(tmp / "store")
    forged = record.Deployed("production", MODEL, "2", "1", clock.now + 10**9)
    store.objects.write(record.key("production", MODEL), json.dumps(forged.to_dict()).encode())
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.reconcile()
    relay.drain()
    assert standin.deploys == [("production", MODEL, "2")]  # before the fix: "dispatched already"
    assert record.read(store.objects, "production", MODEL).previous == "1"


def test_a_record_within_the_grace_still_holds_a_dispatch_back(world) -> None:  # type: ignore[no-untyped-def]
    settings, relay, standin, clock, tmp = world
    store = Repository.local(tmp / "store")
    record.write(store.objects, "production", MODEL, "2", "1", clock.now - 5)
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.reconcile()
    relay.drain()
    assert standin.deploys == []  # the positive control: a real in-flight dispatch is not repeated
    jobs = relay.queue.recent_jobs()
    assert [(j["version"], j["state"]) for j in jobs] == [("2", "noop")]
    assert "dispatched already" in jobs[0]["note"]


def test_an_event_file_replaced_by_a_link_is_named_never_read_through(tmp_path: Path) -> None:
    ledger = _ledger_with_events(tmp_path, 3)
    events = Path(ledger.objects.root) / "events"  # type: ignore[attr-defined]
    second, third = events / f"{2:012d}.json", events / f"{3:012d}.json"
    elsewhere = tmp_path / "kept-elsewhere.json"
    elsewhere.write_bytes(second.read_bytes())  # the very bytes: read through the link, all verifies
    second.unlink()
    second.symlink_to(elsewhere)
    third.unlink()
    third.symlink_to("/dev/zero")  # read whole, it never ends
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(found=ledger.read_all()), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "a linked event was read without bound"
    events_read, findings = result["found"]
    assert [e.seq for e in events_read] == [1]
    named = [(f.position, f.what) for f in findings]
    assert any(p == 2 and "link" in w for p, w in named), named
    assert any(p == 3 for p, _ in named), named  # a link to a device: not listed, or no regular file
    assert second.is_symlink()  # named, left as found
    assert third.is_symlink()


@pytest.mark.parametrize("field", ["deployed", "previous"])
def test_a_record_planted_with_a_version_that_is_no_number_is_refused_not_shown(
    tmp_path: Path, field: str
) -> None:
    store = Repository.local(tmp_path / "store")
    doc = record.Deployed("production", MODEL, "2", "1", 1.0).to_dict() | {field: "\x1b]0;owned\x07 9"}
    store.objects.write(record.key("production", MODEL), json.dumps(doc).encode())
    with pytest.raises(StorageError, match="not one the relay wrote"):
        record.read(store.objects, "production", MODEL)


def test_a_record_s_history_keeps_only_entries_the_relay_writes(tmp_path: Path) -> None:
    store = Repository.local(tmp_path / "store")
    mine = {"version": "2", "previous": "1", "at": 5.0}
    doc = record.Deployed("production", MODEL, "2", "1", 5.0).to_dict() | {
        "history": [{"version": "../x", "previous": "1", "at": 1.0}, mine, {"version": "3"}]
    }
    store.objects.write(record.key("production", MODEL), json.dumps(doc).encode())
    assert record.read(store.objects, "production", MODEL).history == [mine]


def test_a_receipt_moved_onto_an_event_of_another_model_with_the_same_digest_is_refused(
    tmp_path: Path,
) -> None:
    import subprocess

    from mlreg.ops.ledger import Verified, _check_receipts
    from pipelines.ledger.receipts import ReceiptSigner, statement
    from tests.unit.ledger_fixtures import fields

    key = tmp_path / "receipts.pem"
    subprocess.run(
        ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True
    )
    public = subprocess.run(
        ["openssl", "ec", "-in", str(key), "-pubout"], check=True, capture_output=True
    ).stdout
    digest = f"{3:064x}"
    signed = ReceiptSigner(key).sign(
        statement(
            model="a",
            version="3",
            manifest_digest=digest,
            signature_digest="",
            resource="s3://x/a/3",
            policy="p",
            verified_at="2026-12-06T00:00:00Z",
            passed=True,
            verifier_version="0",
        )
    )
    store = open_store(str(tmp_path / "store"))
    ledger = ledger_of(store.objects)
    honest = ledger.append(**fields(model="a", versions=("3",), receipt=signed))
    forged = ledger.append(**fields(model="b", versions=("3",), receipt=signed))  # b's digest set to a's
    result = Verified("local", "x", 2, [])
    _check_receipts([honest, forged], public, result)
    assert result.receipts == 1  # the honest one
    assert len(result.bad_receipts) == 1
    assert "another model" in result.bad_receipts[0]
