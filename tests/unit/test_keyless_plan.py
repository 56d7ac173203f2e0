"""A plan's keyless ``--dry-run`` against replicas locked to a key: the repository index is refused
("not authorised"), so the fleet reads what each replica serves by ``ModelReady`` on the store's
version folders (open on a locked replica: it reads, never loads), on a real local store.

The target is a small fake whose index raises what ``TritonControl`` raises for a missing key (the
refusal itself is tested on a real locked tritonserver in tests/integration/test_security.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.fleet.fleet import READY_BY_NAME_CAP, ready_by_name
from pipelines.storage import open_store
from registry.errors import TritonError


class LockedReplica:
    """A replica locked to a key: its index refuses, its readiness answers."""

    def __init__(self, ready: set[tuple[str, str]]) -> None:
        self.ready, self.asked = ready, 0

    def model_states(self) -> dict[str, dict[str, str]]:
        raise TritonError(
            "replica r refused the repository index call: not authorised", status="unauthorised"
        )

    def is_ready(self, model: str, version: str = "") -> bool:
        self.asked += 1
        return (model, version) in self.ready


def _store(tmp_path: Path, versions: dict[str, list[str]]) -> Path:
    for model, numbers in versions.items():
        (tmp_path / model).mkdir(parents=True)
        (tmp_path / model / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n')
        for number in numbers:
            (tmp_path / model / number).mkdir()
    return tmp_path


def test_a_locked_replica_is_read_by_readiness_on_the_stores_versions(tmp_path: Path) -> None:
    store = open_store(_store(tmp_path, {"net": ["1", "2"], "ens": ["1"]}))
    replica = LockedReplica({("net", "2"), ("ens", "1")})
    assert ready_by_name(replica, store) == {"net": {"2": "READY"}, "ens": {"1": "READY"}}  # type: ignore[arg-type]
    assert replica.asked == 3  # one question per stored version folder


def test_the_keyless_read_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(_store(tmp_path, {"net": [str(v) for v in range(1, 40)]}))
    monkeypatch.setattr("pipelines.fleet.fleet.READY_BY_NAME_CAP", 10)
    replica = LockedReplica({("net", "3")})
    assert ready_by_name(replica, store) == {"net": {"3": "READY"}}  # type: ignore[arg-type]
    assert replica.asked == 10
    assert READY_BY_NAME_CAP >= 256


def test_the_fleet_reads_a_locked_replica_by_readiness_and_keeps_other_errors(tmp_path: Path) -> None:
    """``Fleet.states_of`` falls back only on the key refusal; any other error still raises."""
    from pipelines.fleet.fleet import Fleet

    store = open_store(_store(tmp_path, {"net": ["1", "2"]}))
    locked = LockedReplica({("net", "1")})
    fleet = Fleet(store, ["r"], lambda url: locked, 5)  # type: ignore[arg-type,return-value]
    assert fleet.serving("net") == {"r": ["1"]}

    class Down(LockedReplica):
        def model_states(self) -> dict[str, dict[str, str]]:
            raise TritonError("replica r is unreachable", status="unreachable")

    down = Fleet(store, ["r"], lambda url: Down(set()), 5)  # type: ignore[arg-type,return-value]
    with pytest.raises(TritonError, match="unreachable"):
        down.serving("net")
