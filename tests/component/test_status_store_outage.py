"""Issue 45 item 6 (first half): an S3 outage is not a fleet outage.  With S3 frozen, Triton 2.51's
repository index polls the repository and blocks past its caller's deadline while ``ModelReady`` and
the calls on loaded models answer in milliseconds (measured on the real server: FACTS.md); `mlreg
status` waited ~50 s and called every replica "unreachable: repository index failed ... Deadline
Exceeded".  Now it gives the index seconds, reads what each replica serves from its readiness and
names the store as what is down.

Real parts: the replicas are tests/standin_triton.py's gRPC stand-ins (``store_frozen``: their index
blocks as 2.51's does on a frozen S3 -- a real tritonserver on a SIGSTOPed moto_server costs a real
stack's start); the frozen store is a real TCP endpoint that accepts connections and never answers
(what a SIGSTOPed S3 server is to its clients), read through the real S3 store; a replica that is
really down is a port where nothing listens.  The registry is tests/fakes.py's (aliases in memory).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlreg.ops import status, status_replicas, status_rows, status_views
from pipelines.promote.environments import Environment
from registry.settings import Settings
from tests.fakes import FakeRegistry
from tests.standin_triton import Model, StandinFleet, Version

STORE_PATIENCE_S = 1.0  # the store's read timeout here (status's own is 5 s, tested in test_status.py)
# The index's deadline here, in the tests that wait it out (three times each): status's own is 5 s
# (asserted below), the behaviour the same at any bound; 2 s spares each test ~9 s.
INDEX_PATIENCE_S = 2.0


@pytest.fixture
def frozen_s3() -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 that accepts connections and never answers (a SIGSTOPed server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # never accepted: the kernel completes the handshake, nothing ever answers
    try:
        yield f"s3://127.0.0.1:{listener.getsockname()[1]}/models/repo"
    finally:
        listener.close()


def _dead_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"  # closed on return: nothing listens there


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[StandinFleet]:
    """Two stand-in replicas with frozen repositories: the first serves scorer v2, the second v1 and
    v2 (mid-promotion); both serve ens v1 (a model no alias names, found by its statistics)."""
    (tmp_path / "store").mkdir()
    standins = StandinFleet(tmp_path / "store", 2, key=os.environ["MLREG_CONTROL_KEY"])
    with standins:
        now = time.monotonic()
        for replica, versions in zip(standins.replicas, (["2"], ["1", "2"]), strict=True):
            replica.models["scorer"] = Model(versions={v: Version("READY", since=now) for v in versions})
            replica.models["ens"] = Model(versions={"1": Version("READY", since=now)})
            replica.store_frozen = True
        yield standins


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / ".mlreg", template_dir=tmp_path / "templates", triton_timeout=30.0)


def _registry() -> FakeRegistry:
    registry = FakeRegistry()
    registry.alias_map = {"scorer": {"production": "2"}}
    return registry


def test_a_frozen_store_reads_each_replica_from_its_readiness_within_seconds(
    tmp_path: Path, fleet: StandinFleet, frozen_s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setattr(status_views, "STORE_READ_TIMEOUT_S", STORE_PATIENCE_S)
    down = _dead_port()
    env = Environment("prod", frozen_s3, (*fleet.urls, down), "production", gpu=False)
    first, second = fleet.urls

    started = time.monotonic()
    found = status.environment_status(_settings(tmp_path), env, _registry())
    took = time.monotonic() - started

    # the store's two attempts, then calls that answer at once (before: ~50 s, every replica lost)
    assert took < 2 * STORE_PATIENCE_S + 3, took
    rows = {row.model: row for row in found.rows}
    assert rows["scorer"].serving_folders[first] == ["2"]
    assert rows["scorer"].serving_folders[second] == ["1", "2"]
    assert rows["ens"].serving_folders == {first: ["1"], second: ["1"], down: rows["ens"].serving[down]}
    for row in rows.values():  # nothing that answered is called unreachable; the dead one still is
        assert isinstance(row.serving[down], status_rows.Unreachable)
        assert not any(isinstance(row.serving[url], status_rows.Unreachable) for url in fleet.urls)
        assert row.read_by_readiness == [first, second]
        assert row.to_dict()["read_by_readiness"] == [first, second]
        assert not any("Deadline Exceeded" in line for line in row.drift)
    assert found.store_error  # the store is named as down ...
    assert found.readiness.startswith(f"the store ({frozen_s3}) did not answer: what each replica serves")
    assert f"{first}, {second}" in found.readiness
    assert down not in found.readiness
    # ... and the replicas were asked by readiness, their index never: once asked, it would block
    # every other control call of theirs behind it (as on the real server)
    for replica in fleet.replicas:
        assert replica.calls["RepositoryIndex"] == 0
        assert replica.calls["ModelReady"] >= 2
        assert not replica.index_blocked


def test_an_index_that_blocks_under_a_store_that_answers_names_the_blocked_index(
    tmp_path: Path, fleet: StandinFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store answers status but the index blocks all the same: its deadline is seconds, and
    the replica -- whose other control calls now wait behind it, as on the real server -- is named
    for that, not for a bare "Deadline Exceeded"."""
    assert status_replicas.INDEX_TIMEOUT_S == 5.0  # status's own bound (README: "given 5 s in status")
    monkeypatch.setattr(status_replicas, "INDEX_TIMEOUT_S", INDEX_PATIENCE_S)
    store = tmp_path / "store"
    env = Environment("prod", str(store), tuple(fleet.urls), "production", gpu=False)

    started = time.monotonic()
    found = status.environment_status(_settings(tmp_path), env, _registry(), ["scorer"])
    took = time.monotonic() - started

    # the index's deadline, liveness's (each INDEX_TIMEOUT_S), and the open-control probe's (its own
    # 5 s; before: 30 s each)
    assert took < 2 * status_replicas.INDEX_TIMEOUT_S + 5.0 + 3, took
    (row,) = found.rows
    blocked = status_replicas.INDEX_BLOCKED.format(seconds=status_replicas.INDEX_TIMEOUT_S, uri=store)
    assert row.serving == dict.fromkeys(fleet.urls, status_rows.Unreachable(blocked))
    assert (found.store_error, found.readiness) == ("", "")  # the store answered: not blamed
    assert all(replica.calls["RepositoryIndex"] == 1 for replica in fleet.replicas)


def test_a_replica_whose_index_answers_is_read_from_it(tmp_path: Path, fleet: StandinFleet) -> None:
    for replica in fleet.replicas:
        replica.store_frozen = False
    env = Environment("prod", str(tmp_path / "store"), tuple(fleet.urls), "production", gpu=False)

    found = status.environment_status(_settings(tmp_path), env, _registry(), ["scorer"])

    (row,) = found.rows
    assert row.serving_folders == dict(zip(fleet.urls, (["2"], ["1", "2"]), strict=True))
    assert (row.read_by_readiness, found.readiness) == (None, "")
    assert all(replica.calls["ModelReady"] == 0 for replica in fleet.replicas)


def test_the_report_says_which_replicas_were_read_from_readiness_and_exits_as_drift() -> None:
    from mlreg.ops.status import StatusReport

    note = status.readiness_note("s3://models/repo", ["a:8001", "b:8001"], "read timeout")
    report = StatusReport("prod", [], readiness=note)
    assert report.to_dict()["readiness"] == note
    assert report.drift  # exit 1: what serves was not read the usual way
    assert note.startswith("the store (s3://models/repo) did not answer: what each replica serves was read")
    assert "a:8001, b:8001" in note
    assert status.readiness_note("s3://models/repo", [], "read timeout") == ""  # every index answered


def test_a_replica_stuck_behind_a_blocked_index_is_named_though_no_model_is_known(
    tmp_path: Path, fleet: StandinFleet, frozen_s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else's index call already blocks the first replica's control calls (as on the real
    server); the store does not answer and no alias names a model: that replica is still named,
    with why, and the other read from its readiness."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setattr(status_views, "STORE_READ_TIMEOUT_S", STORE_PATIENCE_S)
    monkeypatch.setattr(status_replicas, "INDEX_TIMEOUT_S", INDEX_PATIENCE_S)
    stuck, free = fleet.replicas
    stuck.index_blocked = True
    env = Environment("prod", frozen_s3, tuple(fleet.urls), "production", gpu=False)

    found = status.environment_status(_settings(tmp_path), env, FakeRegistry())

    blocked = status_replicas.INDEX_BLOCKED.format(seconds=status_replicas.INDEX_TIMEOUT_S, uri=frozen_s3)
    assert found.unreachable == {stuck.grpc_url: blocked}
    rows = {row.model: row for row in found.rows}  # found by the free replica's statistics
    assert rows["scorer"].serving == {
        stuck.grpc_url: status_rows.Unreachable(blocked),
        free.grpc_url: ["1", "2"],
    }
    assert rows["scorer"].read_by_readiness == [free.grpc_url]
    assert stuck.calls["RepositoryIndex"] == free.calls["RepositoryIndex"] == 0
