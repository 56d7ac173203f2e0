"""The promotion's guarantees that only a real server saw before (tests/mutants/mutants.toml): the
locks in sorted name order, and an abort in the last wave of a fleet moved ``max_parallel = 4`` at
once puts every replica back.  The world of tests/unit/worlds.py: a real local store, fake Tritons.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.policy import Policy
from pipelines.core.reports import PromotionFailed
from pipelines.promote.environments import Environment
from pipelines.storage import locking
from pipelines.storage.objects import lock_key
from registry.errors import TritonError
from tests.unit.worlds import MEMBER, World

REPLICAS = tuple(f"t{i}:8001" for i in range(6))


def _deployed(world: World) -> World:
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def _serving(world: World) -> dict[str, Any]:
    return {
        "configs": {m: world.config(m) for m in ("pre", "net", "ens")},
        "serving": {url: t.model_states() for url, t in sorted(world.fleet.targets.items())},
        "pins": {url: dict(t.ensembles) for url, t in sorted(world.fleet.targets.items())},
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens")},
    }


def test_locks_are_taken_in_sorted_name_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README "Locks": every model whose config the promotion writes, in sorted name order (two
    promotions of two members of one ensemble can then never hold one lock each and wait)."""
    world = _deployed(World(tmp_path))
    taken: list[str] = []
    held = locking.held

    def recorded(store: Any, name: str, *args: Any, **kwargs: Any) -> AbstractContextManager[Any]:
        taken.append(name)
        return held(store, name, *args, **kwargs)

    monkeypatch.setattr(locking, "held", recorded)
    world.promote("net", "2")
    assert taken == ["ens", "net"]  # net's swap re-points ens: both locked, ens first by name
    assert world.fleet.store.session.read_lock("net") is None  # and released at the end
    assert world.fleet.store.session.read_lock("ens") is None


@pytest.fixture
def fleet_world(tmp_path: Path) -> World:
    world = World(tmp_path)
    policy = Policy(canary=1, waves=(100.0,), max_parallel=4)
    world.env = Environment("test", str(world.store_root), REPLICAS, "test", gpu=False, policy=policy)
    return _deployed(world)


def test_an_abort_in_the_last_wave_with_max_parallel_4_puts_every_replica_back(fleet_world: World) -> None:
    """README "Every exit restores" on a fleet moved four at a time: the last replica's load fails,
    and the undo (as many replicas at once as the roll-out moved) puts every touched one back."""
    world = fleet_world
    before = _serving(world)
    world.fleet.fail_load.add(("net", "2", REPLICAS[-1]))
    with pytest.raises(PromotionFailed, match=rf"{REPLICAS[-1]}.*rolled back") as info:
        world.promote("net", "2")
    loaded = {e[1] for e in world.loads() if e[2] == "net" and "2" in e[3]}
    assert loaded == set(REPLICAS), loaded  # every replica was sent v2: the abort came in the last wave
    assert _serving(world) == before  # every replica, the store's configs and the aliases as before
    assert "every touched replica is back on the store's config" in info.value.message


OTHER = "other@elsewhere:2"


def test_a_promotion_that_lost_its_lease_puts_nothing_back_and_says_so(tmp_path: Path) -> None:
    """README "The lease": a holder whose lock another promotion took over touches nothing --
    its undo included -- and the sentence "nothing was put back" is what the state shows: the
    store's configs, the uploads and every replica as they were when it failed, and the other
    holder's lock left alone."""
    world = _deployed(World(tmp_path))
    lock = world.store_root / lock_key("net")
    handle = world.fleet.handle
    at_failure: dict[str, Any] = {}

    def taken_over_then_failing(target: Any, call: Any) -> None:
        handle(target, call)
        if call.method == "load" and call.model == "net" and "2" in call.versions:
            intruder = {"owner": OTHER, "token": "theirs", "ttl": 60, "expires_at": time.time() + 60}
            lock.write_text(json.dumps(intruder))  # the other promotion took the lock over
            at_failure.update(_serving(world), net_v2=world.fleet.store.versions.read_manifest("net", "2"))
            raise TritonError(f"{call.url}: model 'net' version 2 failed to load")

    world.fleet.handle = taken_over_then_failing  # type: ignore[method-assign]
    for target in world.fleet.targets.values():
        target.handler = taken_over_then_failing
    with pytest.raises(
        PromotionFailed, match=r"it lost its lock, so nothing was put back \(lock of net lost"
    ) as info:
        world.promote("net", "2")
    assert at_failure, "the load of net v2 was never sent"
    assert _serving(world) == {k: v for k, v in at_failure.items() if k != "net_v2"}  # nothing put back
    assert (
        world.fleet.store.versions.read_manifest("net", "2") == at_failure["net_v2"]
    )  # its upload not removed
    assert json.loads(lock.read_text())["owner"] == OTHER  # the new holder's lock left alone
    assert info.value.exit_code == PromotionFailed.exit_code
    assert "rolled back" not in info.value.message
