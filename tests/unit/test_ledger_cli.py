"""``mlreg ledger verify`` and ``mlreg history --replica R --at TIME`` / ``--model M`` on a real
local store's ledger: what the user reads, the exit code, and the JSON document."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.ledger import LEDGER, ledger_of
from pipelines.ledger.events import Event
from pipelines.storage import open_store
from tests.cli import CliRunner
from tests.unit.ledger_fixtures import fields

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with environment 'staging' on a local store; its ledger holds 4 events."""
    (tmp_path / "mlreg.toml").write_text(
        f'[environments.staging]\nstore = "{tmp_path / "repo"}"\ntargets = ["t0:8001", "t1:8001"]\n'
        'alias = "staging"\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / ".mlreg"))
    return tmp_path


def _events(project: Path) -> list[Event]:
    ledger = ledger_of(open_store(project / "repo").objects)
    return [
        ledger.append(**fields(replica="t0:8001", model="scorer", versions=("1",))),
        ledger.append(**fields(replica="t1:8001", model="scorer", versions=("1",))),
        ledger.append(**fields(replica="t0:8001", model="scorer", versions=("1", "2"))),
        ledger.append(**fields(replica="t0:8001", model="scorer", versions=("2",), kind="config")),
    ]


def _between(a: Event, b: Event) -> str:
    first = datetime.fromisoformat(a.time)
    second = datetime.fromisoformat(b.time)
    return (first + (second - first) / 2).isoformat()


def test_verify_says_the_ledger_verifies_and_exits_0(project: Path) -> None:
    _events(project)
    result = runner.invoke(app, ["ledger", "verify", "--env", "staging"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{project / LEDGER / 'repo'}: 4 events: verifies"


def test_verify_names_a_removed_event_and_exits_1(project: Path) -> None:
    events = _events(project)
    (project / LEDGER / "repo" / "events" / "000000000002.json").unlink()
    result = runner.invoke(app, ["ledger", "verify", "--env", "staging", "--json"])
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["ok"] is False
    assert document["findings"] == [
        {
            "position": 2,
            "time": events[1].time,
            "replica": "t1:8001",
            "what": "removed (the ledger has no event at this position)",
        }
    ]
    human = runner.invoke(app, ["ledger", "verify", "--env", "staging"])
    assert human.exit_code == 1
    assert f"event 2 ({events[1].time}, replica t1:8001): removed" in human.output


def test_history_at_a_time_answers_what_a_replica_served_then(project: Path) -> None:
    events = _events(project)
    at = _between(events[2], events[3])  # v1 and v2 both loaded on t0, the config not yet sent
    result = runner.invoke(app, ["history", "--replica", "t0:8001", "--at", at, "--env", "staging", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["serving"] == {"scorer": ["1", "2"]}
    before = (datetime.fromisoformat(events[0].time) - timedelta(seconds=1)).isoformat()
    early = runner.invoke(app, ["history", "--replica", "t0:8001", "--at", before, "--env", "staging"])
    assert early.exit_code == 0
    assert "t0:8001 served nothing mlreg loaded at" in early.output


def test_history_of_a_model_lists_every_replicas_spans(project: Path) -> None:
    events = _events(project)
    result = runner.invoke(app, ["history", "--model", "scorer", "--env", "staging", "--json"])
    assert result.exit_code == 0, result.output
    spans = [
        (s["replica"], s["versions"], s["since"], s["until"]) for s in json.loads(result.output)["served"]
    ]
    assert spans == [
        ("t0:8001", ["1"], events[0].time, events[2].time),
        ("t1:8001", ["1"], events[1].time, ""),
        ("t0:8001", ["1", "2"], events[2].time, events[3].time),
        ("t0:8001", ["2"], events[3].time, ""),
    ]


def test_history_refuses_a_replica_without_a_time_and_an_unknown_replica(project: Path) -> None:
    _events(project)
    result = runner.invoke(app, ["history", "--replica", "t0:8001", "--env", "staging"])
    assert result.exit_code != 0
    assert "--replica needs --at TIME" in result.output
    unknown = runner.invoke(
        app, ["history", "--replica", "t9:8001", "--at", "2026-12-06T08:00:00Z", "-e", "staging"]
    )
    assert unknown.exit_code != 0
    assert "has no event of replica 't9:8001'" in unknown.output
    bad = runner.invoke(app, ["history", "--replica", "t0:8001", "--at", "yesterday", "--env", "staging"])
    assert bad.exit_code != 0
    assert "'yesterday' is not an ISO 8601 time" in bad.output


def test_verify_checks_every_receipt_against_the_public_key_and_names_one_another_key_signed(
    project: Path,
) -> None:
    from pipelines.ledger import Recorder
    from pipelines.ledger.receipts import ReceiptSigner
    from tests.unit.ledger_fixtures import receipt_keys

    source = project / "src" / "scorer"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text('name: "scorer"\nbackend: "python"\nmax_batch_size: 0\n')
    (source / "1" / "model.py").write_text("X = 1\n")
    store = open_store(project / "repo")
    store.versions.put_version("scorer", "1", source / "1")
    (project / "ours").mkdir()
    (project / "theirs").mkdir()
    ours, public = receipt_keys(project / "ours")
    theirs, _ = receipt_keys(project / "theirs")
    (project / "receipts.pub").write_bytes(public)
    good = Recorder(ledger_of(store.objects), store, "staging", signer=ReceiptSigner(ours))
    good.sent("t0:8001", "scorer", ("1",), ())
    result = runner.invoke(app, ["ledger", "verify", "-e", "staging", "--receipt-key", "receipts.pub"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("1 events, 1 receipts verified: verifies")
    other = Recorder(ledger_of(store.objects), store, "staging", signer=ReceiptSigner(theirs))
    forged = other.sent("t1:8001", "scorer", ("1",), ())
    assert forged is not None
    result = runner.invoke(
        app, ["ledger", "verify", "-e", "staging", "--receipt-key", "receipts.pub", "--json"]
    )
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["findings"] == []  # the chain itself is whole
    assert document["receipts_verified"] == 1
    assert document["bad_receipts"] == [
        f"{forged.where()}: its receipt does not verify: the receipt's signature does not verify with the "
        "receipt key"
    ]
