"""The ledger hooked where every call goes out (the ``Fleet``), asked "what served where, when":
100 real promotions, rollbacks and failed promotions that undo (pipelines/promote/runner.py over the
fake Tritons of tests/unit/worlds.py, a real local store), then 1,000 random (replica, time)
questions answered from the ledger and compared with what the fake servers themselves held -- a
truth kept by the test, never read from the ledger.  Also: the promotion's events are mirrored
into its MLflow run (``ledger.jsonl``), and a ledger that cannot be written never fails a promotion.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipelines.ledger import LEDGER, ledger_of
from pipelines.ledger.query import served_at
from pipelines.ledger.recorder import operation
from pipelines.storage import open_store
from registry.errors import MlregError
from tests.unit.ledger_fixtures import receipt_keys
from tests.unit.worlds import MEMBER, World

Truth = dict[str, dict[str, tuple[str, ...]]]  # url -> model -> READY versions


def truth(world: World) -> Truth:
    """What each fake server holds READY now (its own state, not the ledger's)."""
    held: Truth = {}
    for url, target in world.fleet.targets.items():
        models = {
            model: tuple(sorted((v for v, s in states.items() if s == "READY"), key=int))
            for model, states in target.states.items()
        }
        held[url] = {m: v for m, v in sorted(models.items()) if v}
    return held


def _operate(world: World, rng: random.Random, registered: list[str]) -> str:
    """One promotion, rollback or failed promotion (undone); returns which."""
    kind = rng.choice(["promote", "promote", "rollback", "undo"])
    if kind == "promote" or len(registered) < 3:
        version = str(len(registered) + 1)
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
        registered.append(version)
        world.promote("net", version)
        return "promote"
    if kind == "rollback":
        with operation("rollback"):
            world.promote("net", rng.choice(registered[:-1]))
        return "rollback"
    version = str(len(registered) + 1)
    world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    registered.append(version)
    world.fleet.fail_load.add(("net", version, rng.choice(["t0:8001", "t1:8001"])))
    with pytest.raises(MlregError):
        world.promote("net", version)
    world.fleet.fail_load.clear()  # a later rollback to it loads
    return "undo"


def test_100_operations_then_1000_random_questions_are_answered_right(tmp_path: Path) -> None:
    rng = random.Random(4903)
    world = World(tmp_path)
    world.promote("ens", "1")
    registered = ["1"]
    windows: list[tuple[datetime, datetime, Truth]] = []  # (after an operation, before the next, truth)
    kinds = []
    for _ in range(100):
        ended = datetime.now(UTC)
        held = truth(world)
        time.sleep(0.002)
        began = datetime.now(UTC)
        windows.append((ended, began, held))
        kinds.append(_operate(world, rng, registered))
    windows.append((datetime.now(UTC), datetime.now(UTC), truth(world)))
    assert {"promote", "rollback", "undo"} <= set(kinds)

    events, findings = ledger_of(open_store(world.store_root).objects).read_all()
    assert findings == []
    assert {e.operation for e in events} >= {"promote", "rollback", "undo"}
    assert any(e.result == "failed" for e in events)
    for _ in range(1000):
        ended, began, held = rng.choice(windows)
        at = ended + (began - ended) * rng.random()
        url = rng.choice(["t0:8001", "t1:8001"])
        assert served_at(events, url, at) == held.get(url, {}), (url, at)


def test_a_promotions_events_name_its_replicas_versions_and_digests(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.promote("ens", "1")
    events = ledger_of(open_store(world.store_root).objects).read_all()[0]
    loads = [(e.replica, e.model, e.versions, e.kind, e.result) for e in events]
    assert ("t0:8001", "net", ("1",), "load", "ok") in loads
    assert ("t1:8001", "ens", ("1",), "load", "ok") in loads
    manifest = open_store(world.store_root).versions.read_manifest("net", "1")
    assert manifest is not None
    net = next(e for e in events if e.model == "net")
    assert net.digests == {"1": manifest.digest}
    assert net.operation == "promote"
    assert len({e.promotion for e in events}) == 1


def test_the_promotions_events_are_mirrored_into_its_mlflow_run(tmp_path: Path) -> None:
    world = World(tmp_path)
    result = world.promote("ens", "1")
    stored = ledger_of(open_store(world.store_root).objects).read_all()[0]
    run = world.registry.recorded[-1]
    assert result.run_id == f"run-{len(world.registry.recorded)}"
    folder = tmp_path / LEDGER / "store" / "events"
    stored_bytes = [(folder / f"{e.seq:012d}.json").read_bytes() for e in stored]
    assert run["artifacts"]["ledger.jsonl"] == b"".join(stored_bytes)
    assert run["params"]["ledger_promotion"] == stored[0].promotion


def test_a_ledger_that_cannot_be_written_never_fails_the_promotion(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / LEDGER).write_text("a file where the ledger's folder would be")
    result = world.promote("ens", "1")
    assert result.ok
    assert truth(world)["t0:8001"] == {"ens": ("1",), "net": ("1",), "pre": ("1",)}
    assert (tmp_path / LEDGER).read_text() == "a file where the ledger's folder would be"


def test_an_environment_with_a_receipt_key_gets_a_verifiable_receipt_for_each_load(tmp_path: Path) -> None:
    import dataclasses

    from pipelines.ledger.receipts import verify_receipt

    world = World(tmp_path)
    key, public = receipt_keys(tmp_path)
    world.env = dataclasses.replace(world.env, receipt_key=str(key))
    world.promote("ens", "1")
    events = ledger_of(open_store(world.store_root).objects).read_all()[0]
    loads = [e for e in events if e.kind == "load" and e.result == "ok"]
    assert len(loads) == 6  # pre, net, ens on two replicas
    for event in loads:
        assert event.receipt is not None
        statement = verify_receipt(event.receipt, public)
        assert statement["subject"][0]["name"] == f"{event.model}/{event.version}"
        assert statement["subject"][0]["digest"]["sha256"] == event.digests[event.version]
        assert statement["predicate"]["policy"] == {"uri": "mlreg:environment/test"}


def test_a_receipt_key_that_names_no_file_is_refused_where_the_environment_is_read(tmp_path: Path) -> None:
    from pipelines.promote.environments import load_environments
    from registry.errors import UsageError
    from registry.settings import Settings

    (tmp_path / "mlreg.toml").write_text(
        '[environments.prod]\nstore = "s3://b/p"\ntargets = ["t0:8001"]\nreceipt_key = "keys/missing.pem"\n'
    )
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    with pytest.raises(UsageError, match="receipt_key must be the path of the receipts' EC private key"):
        load_environments(settings)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "missing.pem").write_text("-")
    assert load_environments(settings)["prod"].receipt_key == str(tmp_path / "keys" / "missing.pem")
