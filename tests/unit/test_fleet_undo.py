"""Issue 47 item 3: the undo log is a constructor argument of ``Fleet`` (a Fleet without one refuses
every change before anything is sent or written); "did anything change?" has one answer
(``UndoLog.changed``, which knows the store's journal); the deployers and the canary gate ask the
fleet and never edit the log; the fleet's view after a partial load keeps what the replica kept.

Stand-in replicas (tests/fakes.py ``FakeTarget``: a load serves the versions its config lists)
behind a real Fleet on a real local store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.core.undo import UndoLog
from pipelines.fleet.fleet import Change, Fleet, NoUndoLog
from pipelines.storage import Repository, open_store
from tests.fakes import FakeTarget

URLS = ["r0:8001", "r1:8001"]
ROOT = Path(__file__).resolve().parents[2]


def _config(*versions: int) -> str:
    listed = ", ".join(str(v) for v in versions)
    return f'name: "net"\nbackend: "python"\nversion_policy {{ specific {{ versions: [ {listed} ] }} }}\n'


def _store(tmp_path: Path) -> Repository:
    store = open_store(tmp_path / "store")
    source = tmp_path / "version"
    source.mkdir()
    (source / "model.py").write_text("x = 1\n")
    for version in ("1", "2"):  # a real Fleet loads only versions the store verifies
        store.versions.put_version("net", version, source)
    return store


def _replicas(*serving: str) -> dict[str, FakeTarget]:
    replicas = {url: FakeTarget(url) for url in URLS}
    for replica in replicas.values():
        if serving:
            replica.states["net"] = dict.fromkeys(serving, "READY")
    return replicas


def test_a_fleet_built_without_an_undo_log_refuses_every_change_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    written = set(store.session.changed_keys)  # the versions' upload
    replicas = _replicas("1")
    with Fleet(store, URLS, replicas.__getitem__, 5) as fleet:
        with pytest.raises(NoUndoLog, match="no undo log"):
            fleet.move(URLS[0], Change("net", _config(1, 2), ("2",)))
        with pytest.raises(NoUndoLog, match="no undo log"):
            fleet.apply(Change("net", _config(2), ("2",)))
        with pytest.raises(NoUndoLog, match="no undo log"):
            fleet.write_config("net", _config(2))
        assert fleet.states_of(URLS[1]) == {"net": {"1": "READY"}}  # a read-only fleet still reads
    assert all(r.configs == [] for r in replicas.values())  # no load reached a replica
    assert all(r.states == {"net": {"1": "READY"}} for r in replicas.values())
    assert store.read_config("net") is None  # no config written
    assert store.session.changed_keys == written  # nor anything else in the store

    # the positive control: the same moves with a log go through, each before-state noted first
    undo = UndoLog(gpu=False, journal=store.session)
    with Fleet(store, URLS, replicas.__getitem__, 5, undo=undo) as fleet:
        fleet.apply(Change("net", _config(2), ("2",)))
    assert undo.entries["net"].before == {url: ("1",) for url in URLS}
    assert undo.entries["net"].store  # the store's config write noted by the fleet itself
    assert all(r.states == {"net": {"2": "READY"}} for r in replicas.values())


def test_the_view_after_a_partial_load_is_what_the_replicas_hold(tmp_path: Path) -> None:
    """Swapping ``net`` 1->2 with a config that keeps v1 (the canary gate's candidate load, waiting
    for v2 only): both replicas hold {1, 2}, and so does the fleet's view."""
    store = _store(tmp_path)
    replicas = _replicas("1")
    with Fleet(store, URLS, replicas.__getitem__, 5, undo=UndoLog(gpu=False)) as fleet:
        for url in URLS:
            fleet.move(url, Change("net", _config(1, 2), ("2",)))
        for url in URLS:
            assert replicas[url].states["net"] == {"1": "READY", "2": "READY"}
            assert fleet.states_of(url) == replicas[url].model_states()
            assert fleet.ready(url, "net") == ["1", "2"]
        # a load whose config no longer lists v1: the replica drops it, so does the view
        fleet.move(URLS[0], Change("net", _config(2), ("2",)))
        assert replicas[URLS[0]].states["net"] == {"2": "READY"}
        assert fleet.states_of(URLS[0]) == replicas[URLS[0]].model_states()


def test_did_anything_change_has_one_answer_that_knows_the_stores_journal(tmp_path: Path) -> None:
    _store(tmp_path)
    store = open_store(tmp_path / "store")  # a new session: its journal holds nothing yet
    undo = UndoLog(gpu=False, journal=store.session)
    assert not undo.changed
    undo.wrote_config_of("net")  # noted before a write that never reached the store
    assert not undo.empty  # noted
    assert not undo.changed  # but nothing to put back: no rollback
    store.session.write_config("net", _config(1))
    assert undo.changed  # the store took it: the log says so
    touched = UndoLog(gpu=False, journal=store.session)
    touched.touched(URLS[0], "other", ("1",))  # a replica sent a change
    assert touched.changed


def test_a_private_model_the_gate_discards_is_unloaded_and_no_longer_the_logs_to_put_back(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    replicas = _replicas("1")
    undo = UndoLog(gpu=False, journal=store.session)
    private = "net-candidate"
    with Fleet(store, URLS, replicas.__getitem__, 5, undo=undo) as fleet:
        fleet.move(URLS[0], Change(private, _config(2), ("2",), files={"file:2/model.py": b"x = 1\n"}))
        assert replicas[URLS[0]].states[private] == {"2": "READY"}
        assert undo.entries[private].before == {URLS[0]: ()}  # noted: an abort would unload it
        assert fleet.discard(URLS[0], private) == ""
    assert private not in replicas[URLS[0]].states  # unloaded
    assert private not in undo.entries  # and no longer the log's to put back
    assert undo.replicas == []


def test_the_deployers_and_the_canary_gate_ask_the_fleet_and_never_edit_the_undo_log() -> None:
    """They reach the log only through the fleet (``release``, ``discard``, ``write_config``,
    ``apply``): no file of theirs names it."""
    files = sorted((ROOT / "pipelines" / "rollout").glob("*.py")) + [
        ROOT / "pipelines" / "promote" / "canary_gate.py"
    ]
    for path in files:
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        code = re.sub(r'"""(?:.|\n)*?"""', "", code)  # docstrings may say what the log does
        assert not re.search(r"\bundo\b|UndoLog", code), f"{path.relative_to(ROOT)} reaches the undo log"
