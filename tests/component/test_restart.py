"""Issue 45 item 3: a replica that restarts during a promotion, on the stand-in fleet
(tests/standin_triton.py, ``Replica.crash``: the server dies, answers nothing for ``restart_after``
s, then starts again serving nothing, as an explicit-mode tritonserver restarted by its supervisor).
The stand-in is used, not a real tritonserver: a real crash mid-load and a restart on the same ports
cost a real fleet's start per case (tests/integration/test_fleet.py kills real replicas at every
stage; what a restart adds is the waiting and the moving again, which the stand-in drives exactly).

Real parts otherwise: an MLflow registry on sqlite, a local store, the whole promotion.  Four
replicas, waves canary / 50 % / 100 % (1, 1, 2 replicas), no bake.

Before: the canary crashed mid-load came back serving nothing and the rollback failed with "not
put back"; a replica that restarted after its wave served nothing while the promotion said it
promoted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import pipelines.fleet.fleet as fanout
from mlreg.ops.status import model_status
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.promote.environments import environment
from pipelines.storage import open_store
from registry.mlflow import MlflowRegistry
from tests.integration.fleetstack import FleetStack, scorer
from tests.integration.stacks import SCORER_CONFIG, stack_settings
from tests.standin_triton import StandinFleet

REPLICAS = 4


class RestartStack(FleetStack):
    standins: StandinFleet
    serving: str  # type: ignore[assignment]  # the version every replica serves before each test

    def ready_everywhere(self) -> dict[str, list[str]]:
        return {r.grpc_url: r.ready("scorer") for r in self.standins.replicas}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartStack]:
    root = tmp_path_factory.mktemp("restart")
    settings, _ = stack_settings(root)
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    key = os.environ["MLREG_CONTROL_KEY"]  # tests/conftest.py: what every client of the tests sends
    standins = StandinFleet(store, REPLICAS, load_delay=0.05, rate=20, metrics_interval=0.5, key=key)
    with standins:
        made = RestartStack(settings, MlflowRegistry(settings), str(store), standins.urls, work, root, [])
        made.standins = standins
        targets = ", ".join(f'"{url}"' for url in standins.urls)
        (root / "mlreg.toml").write_text(
            f'[environments.fleet]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
            f"canary = 1\nwaves = [50, 100]\nbake_seconds = 0\nmax_parallel = 2\n"
            f"metrics = {standins.metrics_table()}\n"
        )
        made.serving = made.register("scorer", SCORER_CONFIG, scorer("v1"))
        assert made.promote("scorer", made.serving).ok
        yield made


@pytest.fixture
def fleet(stack: RestartStack) -> Iterator[RestartStack]:
    """Every replica up and serving ``stack.serving`` before and after each test."""
    for replica in stack.standins.replicas:
        replica.restart_after, replica.crash_on_load, replica.on_load = 1.0, "", None
    assert stack.ready_everywhere() == dict.fromkeys(stack.urls, [stack.serving])
    yield stack
    for replica in stack.standins.replicas:
        replica.down_until, replica.on_load = 0.0, None


def test_a_canary_killed_during_its_load_and_restarted_is_given_back_the_serving_version(
    fleet: RestartStack,
) -> None:
    serving = fleet.serving
    candidate = fleet.register("scorer", SCORER_CONFIG, scorer("crashes-its-canary"))
    canary = fleet.standins.replicas[0]
    canary.crash_on_load = "scorer"
    with pytest.raises(PromotionFailed) as failed:
        fleet.promote("scorer", candidate)
    message = failed.value.message
    assert canary.restarts >= 1
    assert "the rollback failed" not in message, message
    assert (
        f"{canary.grpc_url} dropped during the promotion and came back (a restart): waited for, then put back"
        in message
    )
    assert fleet.ready_everywhere() == dict.fromkeys(
        fleet.urls, [serving]
    )  # the canary too, after its restart
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == [serving]
    assert fleet.registry.models.aliases("scorer")["fleet"] == serving


def test_a_replica_that_restarts_after_its_wave_is_given_its_waves_state_again(fleet: RestartStack) -> None:
    candidate = fleet.register("scorer", SCORER_CONFIG, scorer("a-restart-mid-roll-out"))
    canary, second, *last = fleet.standins.replicas

    restarts = canary.restarts

    def crash_the_canary(model: str) -> None:  # the second wave's load: the canary (wave 1) dies
        if model == "scorer" and canary.restarts == restarts:
            canary.restart_after = 0.5
            canary.crash()

    second.on_load = crash_the_canary
    fleet.standins.reset_counts()
    result = fleet.promote("scorer", candidate)
    assert result.ok
    assert canary.restarts == restarts + 1
    assert fleet.ready_everywhere() == dict.fromkeys(fleet.urls, [candidate])  # the canary moved again
    assert (
        f"{canary.grpc_url} restarted during the roll-out (it no longer held scorer v{candidate}): "
        "loaded again" in "\n".join(result.notes)
    )
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == [candidate]
    assert fleet.registry.models.aliases("scorer")["fleet"] == candidate
    # the restart watch's own calls: one repository index per moved replica per later wave and one
    # after the last (benchmarks/restart_calls.py measures them against a roll-out without the watch)
    checks = {second.grpc_url: 2, last[0].grpc_url: 1, last[1].grpc_url: 1}
    for url, count in checks.items():
        assert fleet.standins.replica(url).calls["RepositoryIndex"] <= 2 + count, (url, count)
    fleet.serving = candidate


def test_a_replica_that_does_not_come_back_is_named_once_with_the_fix(
    fleet: RestartStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "RESTART_WAIT_S", 1.0)
    serving = fleet.serving
    candidate = fleet.register("scorer", SCORER_CONFIG, scorer("its-canary-stays-down"))
    canary = fleet.standins.replicas[0]
    canary.restart_after = 30.0  # longer than mlreg waits
    canary.crash_on_load = "scorer"
    with pytest.raises(PromotionFailed) as failed:
        fleet.promote("scorer", candidate)
    message = failed.value.message
    assert "the rollback failed too" in message
    assert message.count("waited 1s for it to come back: it did not") == 1, message  # named once
    assert "run 'mlreg status' to see what serves" in (failed.value.fix or "")
    assert {u: v for u, v in fleet.ready_everywhere().items() if u != canary.grpc_url} == dict.fromkeys(
        fleet.urls[1:], [serving]
    )
    canary.down_until = 0.0  # its supervisor brings it back: it serves nothing (explicit mode)
    assert canary.ready("scorer") == []
    env = environment(fleet.settings, "fleet")
    [row] = model_status(fleet.settings, env, fleet.registry, ["scorer"])
    command = f"mlreg promote scorer --version {serving} --env fleet"
    assert (
        f"{canary.grpc_url} serves nothing of scorer: to load what the store wants there, run '{command}'"
        in row.drift
    )
    assert fleet.promote("scorer", serving).ok  # the rerun status names puts it back
    assert canary.ready("scorer") == [serving]
