"""A staged roll-out over 50 replicas: the stand-in Triton fleet (tests/standin_triton.py), all in
this process on loopback, under a canary, waves of 10/50/100 % and a 1 s bake on the replicas' own
metrics.  The real-server side of the same roll-outs is tests/integration/test_fleet.py; the
figures at 50, 100 and 200 replicas are benchmarks/fleet_scale.py's.

In file order: a version rolls out to every replica (the model-repository calls each replica got
counted), a version whose traffic fails on one replica trips the last bake and every replica is
back exactly, a version that 5 % of the replicas have no memory for is refused there before any
load, those replicas named and left as they served, the rest converged; and the stand-in's own
control: it reads the store and locks its control calls as Triton does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.core.plan import serving_versions
from pipelines.core.policy import Policy, waves_of
from pipelines.core.reports import PromotionFailed
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from pipelines.triton.control_key import ControlKey
from registry.contracts.config import config_json
from registry.errors import TritonError
from registry.mlflow import MlflowRegistry
from tests.integration.fleetstack import FleetStack, scorer
from tests.integration.stacks import SCORER_CONFIG, stack_settings, unloaded_on
from tests.standin_triton import StandinFleet

pytestmark = pytest.mark.integration

REPLICAS = 50
SHORT = math.ceil(REPLICAS * 0.05)  # 5 % of the fleet: max_unavailable
WAVES = (10.0, 50.0, 100.0)
BAKE = 0.5  # seconds (the benchmark's figures are with the 1 s; here the behaviour only)
REPOSITORY_CALLS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")


class ScaleStack(FleetStack):
    standins: StandinFleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleStack]:
    """50 stand-in replicas on one local store (their control API locked to the tests' key), the
    ``fleet`` environment over them, and scorer v1 promoted everywhere (no bake: nothing served)."""
    root = tmp_path_factory.mktemp("fleet-scale")
    settings, _ = stack_settings(root)
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    key = os.environ["MLREG_CONTROL_KEY"]  # tests/conftest.py: what every client of the tests sends
    standins = StandinFleet(store, REPLICAS, load_delay=0.1, rate=50, metrics_interval=0.5, key=key)
    with standins:
        stack = ScaleStack(settings, MlflowRegistry(settings), str(store), standins.urls, work, root, [])
        stack.standins = standins
        write_environment(root, store, standins)
        assert stack.promote("scorer", stack.register("scorer", SCORER_CONFIG, scorer("v1"))).ok
        yield stack


def write_environment(root: Path, store: Path, standins: StandinFleet) -> None:
    targets = ", ".join(f'"{url}"' for url in standins.urls)
    waves = ", ".join(f"{w:g}" for w in WAVES)
    (root / "mlreg.toml").write_text(
        f'[environments.fleet]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
        f"canary = 1\nwaves = [{waves}]\nbake_seconds = {BAKE:g}\nmax_parallel = {REPLICAS}\n"
        f"max_unavailable = {SHORT}\nmetrics = {standins.metrics_table()}\n"
    )


def waves(fleet: ScaleStack) -> list[list[str]]:
    return waves_of(fleet.urls, Policy(canary=1, waves=WAVES))


def ready(fleet: ScaleStack) -> dict[str, list[str]]:
    return {r.grpc_url: r.ready("scorer") for r in fleet.standins.replicas}


def test_a_version_rolls_out_over_50_replicas_with_one_load_each(fleet: ScaleStack) -> None:
    version = fleet.register("scorer", SCORER_CONFIG, scorer("v2"))
    fleet.standins.reset_counts()
    with fleet.explained():
        result = fleet.promote("scorer", version)
    assert result.ok
    deploy = next(s for s in result.stages if s.stage == "deploy")
    assert f"over {REPLICAS} replica(s) in 4 wave(s)" in deploy.detail
    assert deploy.detail.count("bake ok:") == 3  # after the canary, 10 % and 50 %
    assert ready(fleet) == dict.fromkeys(fleet.urls, [version])
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == [version]
    assert fleet.registry.models.aliases("scorer")["fleet"] == version
    calls = {r.grpc_url: r.calls for r in fleet.standins.replicas}
    # the restart watch (issue 45): one repository index per moved replica before each later wave
    # and after the last -- at most one per replica per wave
    watched = {url: len(waves(fleet)) - i for i, wave in enumerate(waves(fleet)) for url in wave}
    for url, counted in calls.items():
        # one swap, straight to the new version, and one unload without the key (refused): the
        # probe that no replica takes anyone's model-control calls (pipelines/fleet/replicas.py)
        assert (counted["RepositoryModelLoad"], counted["RepositoryModelUnload"]) == (1, 1), (url, counted)
        assert sum(counted[m] for m in REPOSITORY_CALLS) <= 4 + watched[url], (url, counted)
        # with the other control calls (today a liveness check before the plan, readiness after
        # the load and again in verify; requests -- verify's, the bake's probes -- are not control)
        assert sum(n for m, n in counted.items() if m != "ModelInfer") <= 7 + watched[url], (url, counted)
    assert all(r.scrapes >= 7 for r in fleet.standins.replicas)  # the baseline and two per bake


def test_one_replica_failing_the_last_bake_puts_every_replica_back_exactly(fleet: ScaleStack) -> None:
    """The new version's traffic fails on one replica of the third wave: the bake after it (the
    last one, before the last wave) trips on the failure ratio, and the undo log puts each of the
    25 moved replicas back on the serving version; the last wave never loaded it."""
    [serving] = ready(fleet)[fleet.urls[0]]
    version = fleet.register("scorer", SCORER_CONFIG, scorer("fails-on-one"))
    canary, second, third, last = waves(fleet)
    fleet.standins.replica(third[-1]).failing.add(("scorer", version))
    before = fleet.state()
    with (
        fleet.explained(),
        pytest.raises(
            PromotionFailed, match=rf"the bake after wave 3 of 4 tripped on scorer v{version}"
        ) as info,
    ):
        fleet.promote("scorer", version)
    assert "(failure_ratio)" in info.value.message
    assert "rolled back" in info.value.message
    assert info.value.result.rolled_back
    moved = canary + second + third
    assert len(moved) == REPLICAS // 2
    expected = before
    for url in moved:  # Triton's index keeps a version loaded and given back, UNAVAILABLE
        expected = unloaded_on(expected, url, "scorer", version)
    assert fleet.state() == expected  # the store's objects, every replica's index, every alias
    assert ready(fleet) == dict.fromkeys(fleet.urls, [serving])
    for url in last:
        assert version not in fleet.standins.replica(url).states()["scorer"], url


def test_five_percent_of_replicas_failing_their_load_are_named_and_the_rest_converge(
    fleet: ScaleStack,
) -> None:
    """3 replicas (5 %, never the canary) fail the new version's load (Triton keeps serving the old
    one): each is put back as it served, named in the deploy stage's line, the plan and the report;
    max_unavailable = 3 lets the others go on, and the alias moves."""
    [serving] = ready(fleet)[fleet.urls[0]]
    version = fleet.register("scorer", SCORER_CONFIG, scorer("v-fails-to-load"))
    _, second, third, last = waves(fleet)
    failing = [second[-1], third[len(third) // 2], last[-1]]
    assert len(failing) == SHORT
    for url in failing:
        fleet.standins.replica(url).fail_loads = "CUDA out of memory (stand-in)"
    try:
        with fleet.explained():
            result = fleet.promote("scorer", version)
    finally:
        for url in failing:
            fleet.standins.replica(url).fail_loads = ""
    assert result.ok
    deploy = next(s for s in result.stages if s.stage == "deploy")
    for url in failing:
        assert f"{url} (" in deploy.detail.split("skipped under max_unavailable: ")[1], url
    document = result.to_dict()  # what --json prints and the MLflow run keeps
    assert sorted(document["plan"]["skipped"]) == sorted(failing)
    [report] = [s["report"] for s in document["stages"] if s["stage"] == "deploy"]
    assert sorted(report["skipped"]) == sorted(failing)
    assert all("CUDA out of memory (stand-in)" in why for why in report["skipped"].values())
    expected = {url: [serving] if url in failing else [version] for url in fleet.urls}
    assert ready(fleet) == expected
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == [version]
    assert fleet.registry.models.aliases("scorer")["fleet"] == version


def test_a_stand_in_reads_the_store_as_triton_does_and_takes_control_calls_only_with_the_key(
    fleet: ScaleStack,
) -> None:
    """The positive control of the figures above: a stand-in's load reads the store (a version
    whose folder is not there fails, UNAVAILABLE with Triton's words, what served stays READY), and
    its model-repository calls refuse a caller without the control key, as Triton's do."""
    url = fleet.urls[-1]
    [serving] = ready(fleet)[url]
    missing = SCORER_CONFIG + "version_policy { specific { versions: [ 99 ] } }\n"
    with TritonControl(url) as triton:
        with pytest.raises(
            TritonError, match=r"version 99 is at UNAVAILABLE state: .*scorer/99' does not exist"
        ):
            triton.load("scorer", config=config_json(missing))
        assert triton.model_states()["scorer"]["99"] == "UNAVAILABLE"
    assert fleet.standins.replica(url).ready("scorer") == [serving]
    with TritonControl(url, key=ControlKey("not-the-key", "a test")) as stranger:
        with pytest.raises(TritonError, match="refused the repository index call: not authorised"):
            stranger.model_states()
