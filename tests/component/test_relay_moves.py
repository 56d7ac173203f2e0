"""100 alias moves followed by two relays on one environment (issue 50's "Done when"):

- the alias is written into a real embedded MLflow registry (its sqlite file) each move; 10 % of
  the moves are written straight to the database (no event is ever sent), 10 % are delivered
  again (the same delivery id replayed, and the alias set again to the version it names: MLflow
  fires a second event with a new id), and the relays are down for 30 % of the moves (the
  delivery is lost after MLflow's retries; they come back the next interval);
- both relays get every delivery MLflow sends while they are up (two webhooks), reconcile every
  interval and drain their own queues in two threads at once, over one real local store.

Asserted: every move reaches the environment within 3 reconcile intervals, no version is deployed
twice for one move (0 duplicates across both relays), and the store's record names as rollback
target the version that served before each deployment -- 100 of 100."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

from mlreg.relay import record
from pipelines.storage.base import Repository
from tests.unit.relay_world import MODEL, Clock, StandIn, delivery, home_with_registry, make_relay, set_alias

MOVES = 100
VERSIONS = 12
INTERVALS_PER_MOVE = 4  # a move, then 4 reconcile intervals before the next one
WITHIN = 3


def test_100_moves_reach_the_environment_once_each_with_the_right_rollback_target(
    registry_state: Callable[[str], Path], tmp_path: Path
) -> None:
    rng = random.Random(50)
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", VERSIONS)
    db = settings.home / "mlflow.db"
    set_alias(db, MODEL, "champion", "1")
    clock, standin = Clock(), StandIn(served={MODEL: "1"}, pause=0.002)
    relays = [
        make_relay(
            settings, tmp_path / "store", standin, clock, queue_file=tmp_path / f"relay{i}" / "queue.db"
        )
        for i in range(2)
    ]
    kinds = ["direct"] * 10 + ["repeated"] * 10 + ["down"] * 30 + ["event"] * 50
    rng.shuffle(kinds)
    current, late, refused_replays, lost = "1", [], 0, 0
    for move, kind in enumerate(kinds):
        version = rng.choice([str(v) for v in range(1, VERSIONS + 1) if str(v) != current])
        before, deploys_before = current, len(standin.deploys)
        set_alias(db, MODEL, "champion", version)
        if kind in ("event", "repeated"):
            headers, body = delivery(MODEL, "champion", version, clock.now)
            assert all(relay.receive(headers, body)[0] == 202 for relay in relays)
        if kind == "repeated":
            refused_replays += sum(relay.receive(headers, body)[0] == 409 for relay in relays)
            again = delivery(MODEL, "champion", version, clock.now)  # set again: a new event, same version
            assert all(relay.receive(*again)[0] == 202 for relay in relays)
        lost += kind == "down"
        reached = None
        for interval in range(INTERVALS_PER_MOVE):
            down = kind == "down" and interval == 0  # down when the move happens: the event is lost
            if not down:
                _drain_both(relays)
            if reached is None and standin.served[MODEL] == version:
                reached = interval
            clock.now += 1.0
            if not down:
                for relay in relays:
                    relay.reconcile()
        if reached is None or reached > WITHIN:
            late.append((move, kind, reached))
        deployed = standin.deploys[deploys_before:]
        assert deployed == [("production", MODEL, version)], f"move {move} ({kind}): deploys {deployed}"
        stored = record.read(Repository.local(tmp_path / "store").objects, "production", MODEL)
        assert (stored.deployed, stored.previous) == (version, before), f"move {move}: rollback target"
        current = version
    assert late == []
    assert len(standin.deploys) == MOVES  # one per move, across both relays: 0 duplicates
    assert refused_replays == 2 * kinds.count("repeated")  # each replay refused by each relay (409)
    assert lost == 30


def _drain_both(relays: list) -> None:  # type: ignore[type-arg]
    """Both relays drain their queues at once (two threads, one store lock between them)."""
    threads = [threading.Thread(target=relay.drain) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for relay in relays:  # a relay that found the lock held tries again in the same interval
        relay.drain()
