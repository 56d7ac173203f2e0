"""Fleet roll-out on three real tritonservers reading one repository in S3 (moto_server).

Light python-backend models (no TensorFlow, tests/integration/fleetstack.py): ``scorer`` (Y = X *
its version) and the ensemble ``scoring`` over it.  Traffic is spread over the three replicas
while the promotions run; the ``fleet`` environment of mlreg.toml declares a canary, waves and a
bake on Triton's metrics.
In file order: the first deployment, a good version through canary -> waves with no failed
request (the store and the replicas not yet moved untouched until the fleet has moved), a version
failing on part of the real requests and a slow one, both tripped by the bake and rolled back, a
replica hand-loaded with another version reported as drift by ``mlreg status``, a replica started
after the promotion, and a replica SIGKILLed during a wave.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.ops.status import model_status
from pipelines.core.plan import serving_versions
from pipelines.core.policy import Policy, Verdict, judge
from pipelines.core.reports import PromotionFailed
from pipelines.devstack import local_triton, processes
from pipelines.fleet import fleet as fanout
from pipelines.promote.environments import environment
from pipelines.rollout import staged
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from pipelines.triton.metrics import DERIVED, Counters
from registry.contracts.config import config_json
from registry.errors import PromotionError, UsageError
from registry.mlflow import MlflowRegistry, sqlite
from tests.conftest import failing_python_model
from tests.integration.fleetstack import BAKE_SECONDS, ENSEMBLE_CONFIG, FleetStack, scorer
from tests.integration.stacks import (
    SCORER_CONFIG,
    TEARDOWN_GRACE,
    Paused,
    paused_mlreg,
    s3_repository,
    stack_settings,
    triton_index,
    tritons,
    unloaded_on,
)
from tests.integration.traffic import Traffic

pytestmark = pytest.mark.integration

REPLICAS = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[FleetStack]:
    root = tmp_path_factory.mktemp("fleet")
    settings, _ = stack_settings(root)
    store = s3_repository(s3_server, "fleet")
    # servers is the list ``tritons`` stops on leaving: a replica restarted into it is stopped too
    with tritons(settings, root, [store] * REPLICAS, name="replica") as servers:
        work = root / "work"
        work.mkdir()
        stack = FleetStack(settings, MlflowRegistry(settings), store, [], work, root, servers)
        stack.write_environment()
        yield stack


def scoring_traffic(urls: list[str]) -> Traffic:
    """Ensemble requests to every replica (one thread each) while a promotion runs."""
    return Traffic(
        urls, lambda triton, rng: triton.infer("scoring", {"X": rng.random(4).astype(np.float32)}, ["Y"])
    )


def test_first_deployment_reaches_every_replica(fleet: FleetStack) -> None:
    assert fleet.register("scorer", SCORER_CONFIG, scorer("v1")) == "1"
    assert fleet.register("scoring", ENSEMBLE_CONFIG, None, members={"scorer": "1"}) == "1"
    result = fleet.promote("scoring", "1")
    assert result.ok
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["1"]
        assert fleet.ready(url, "scoring") == ["1"]


def test_a_good_version_rolls_out_canary_then_waves_with_no_failed_request(
    fleet: FleetStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also the bake's ``queue_ratio`` check passing on real Triton metrics (its other side, a
    version making requests wait, is test_perf_check.py's): judged by the real ``judge``, noted."""
    assert fleet.register("scorer", SCORER_CONFIG, scorer("v2")) == "2"
    seen: dict[str, Any] = {}
    judged: list[tuple[tuple[str, ...], Verdict]] = []

    def noted(old: Counters, new: Counters, policy: Policy) -> Verdict:
        judged.append((tuple(c.metric for c in policy.checks), judge(old, new, policy)))
        return judged[-1][1]

    monkeypatch.setattr(staged, "judge", noted)

    def connect(url: str) -> TritonControl:
        """Real replicas; when the last wave begins, what the others and the store hold is noted."""
        control = TritonControl(url, timeout=10, load_timeout=120)
        if url == fleet.urls[2]:
            load = control.load

            def noting_load(model: str, config: str | None = None, *args: Any) -> None:
                if not seen:
                    store = open_store(fleet.store)
                    seen["store"] = (store.read_config("scorer"), store.read_config("scoring"))
                    seen["pins"] = [fleet.pinned(u) for u in fleet.urls]
                    seen["ready"] = [fleet.ready(u, "scorer") for u in fleet.urls]
                load(model, config, *args)

            setattr(control, "load", noting_load)  # noqa: B010 (an instance attribute, on purpose)
        return control

    before = (open_store(fleet.store).read_config("scorer"), open_store(fleet.store).read_config("scoring"))
    fleet.write_environment(queue_ratio=3)  # the bake's checks as a list, the queue time's among them
    try:
        with scoring_traffic(fleet.urls) as traffic:
            result = fleet.promote("scorer", "2", connect=connect)
    finally:
        fleet.write_environment()
    # mid-roll-out: the store untouched, the moved replicas' ensemble following their latest
    # scorer (-1, a per-replica override), the last one still on its own pin and version
    assert seen["store"] == before
    assert seen["pins"] == [-1, -1, 1]
    assert seen["ready"] == [["2"], ["2"], ["1"]]  # each moved replica swapped straight to v2
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > 100
    deploy = next(s for s in result.stages if s.stage == "deploy")
    assert "over 3 replica(s) in 3 wave(s)" in deploy.detail
    assert deploy.detail.count("bake ok: failure ratio 0.000") == 2  # after the canary and wave 2
    assert len(judged) == 2
    for checks, verdict in judged:  # the queue check judged (the old version answered too) and passed
        assert checks == ("requests", "failure_ratio", "latency_ratio", "queue_ratio")
        assert verdict.ok, verdict.detail
        assert verdict.old.requests > 0
        queue_ratio = DERIVED["queue_ratio"].value(verdict.old, verdict.new)
        assert queue_ratio is not None
        assert queue_ratio <= 3, (verdict.old, verdict.new)
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["2"], url
        assert fleet.pinned(url) == 2, url
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == ["2"]
    assert fleet.registry.models.aliases("scorer")["fleet"] == "2"


def test_a_version_failing_on_real_requests_trips_the_bake_and_is_rolled_back(fleet: FleetStack) -> None:
    assert fleet.register("scorer", SCORER_CONFIG, scorer("v3", fails=True)) == "3"
    with (
        scoring_traffic(fleet.urls),
        pytest.raises(PromotionFailed, match=r"tripped on scorer v3 \(failure_ratio\)") as info,
    ):
        fleet.promote("scorer", "3")
    message = info.value.message
    assert f"rolled back on {fleet.urls[0]}, the other replicas never loaded it" in message
    assert "rolled back, the previous versions serve" in message
    ratio = float(message.split("failure ratio ")[1].split(" ")[0])
    assert 0.2 < ratio < 0.8  # about half of the random inputs are out of range
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["2"], url
        assert fleet.pinned(url) == 2, url
    # never loaded there -- read on the index, which lists a version loaded and given back (the
    # canary's v3, the positive control)
    assert triton_index(fleet.urls[0], "scorer").get("3") == "UNAVAILABLE"
    for url in fleet.urls[1:]:
        assert "3" not in fleet.serving(url, "scorer"), url
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == ["2"]
    assert fleet.registry.models.aliases("scorer")["fleet"] == "2"


def test_a_slow_version_trips_the_bake_on_latency_and_is_rolled_back(fleet: FleetStack) -> None:
    """v4 sleeps 1 s in every request, the serving v2 answers in milliseconds: with
    max_latency_ratio = 2 the bake could pass only if v2's mean latency passed 0.5 s, a margin no
    load on this machine comes near, so the trip is decided by the sleep, not by two measurements.
    The canary answers ~3 requests in a 3 s bake: min_requests = 1 (the requests check comes
    first: a canary that answered none would trip on it, named so, not pass)."""
    assert fleet.register("scorer", SCORER_CONFIG, scorer("v4", delay=1.0)) == "4"
    fleet.write_environment(max_latency_ratio=2, min_requests=1, bake_seconds=3)
    try:
        with (
            fleet.explained(),
            scoring_traffic(fleet.urls),
            pytest.raises(PromotionFailed, match=r"tripped on scorer v4 \(latency_ratio\)") as info,
        ):
            fleet.promote("scorer", "4")
    finally:
        fleet.write_environment()
    message = info.value.message
    new_us = float(message.split("mean latency ")[1].split(" us")[0])
    assert new_us >= 1_000_000  # every request of v4 sleeps 1 s: its own latency, not a comparison
    assert "max_latency_ratio = 2" in message
    assert f"rolled back on {fleet.urls[0]}, the other replicas never loaded it" in message
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["2"], url
        assert fleet.pinned(url) == 2, url
    # never loaded there -- read on the index, which lists a version loaded and given back (the
    # canary's v4, the positive control)
    assert triton_index(fleet.urls[0], "scorer").get("4") == "UNAVAILABLE"
    for url in fleet.urls[1:]:
        assert "4" not in fleet.serving(url, "scorer"), url
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == ["2"]
    assert fleet.registry.models.aliases("scorer")["fleet"] == "2"


def test_a_dry_run_shows_the_roll_out_wave_by_wave(
    fleet: FleetStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlreg.cli.main import app
    from tests.cli import CliRunner

    monkeypatch.setenv("MLREG_HOME", str(fleet.settings.home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the fleet's embedded registry
    args = ["promote", "scorer", "--version", "4", "--env", "fleet", "--dry-run", "--skip-quality"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    a, b, c = fleet.urls
    bake = f"bake {BAKE_SECONDS} s"
    assert f"roll-out: canary [{a}] ▸ {bake} ▸ wave 2 [{b}] ▸ {bake} ▸ wave 3 [{c}]" in result.output
    plan = CliRunner().invoke(app, [*args, "--json"])
    assert json.loads(plan.output)["plan"]["rollout"]["waves"] == [[a], [b], [c]]
    for url in fleet.urls:  # nothing moved
        assert fleet.ready(url, "scorer") == ["2"], url


def test_a_replica_hand_loaded_with_another_version_shows_as_drift(fleet: FleetStack) -> None:
    odd = fleet.urls[2]
    store = open_store(fleet.store)
    scorer_v1 = SCORER_CONFIG + "version_policy { specific { versions: [ 1 ] } }\n"
    following = (store.read_config("scoring") or "").replace("model_version: 2", "model_version: -1")
    with TritonControl(odd) as triton:
        triton.load("scoring", config=config_json(following))  # the ensemble follows the latest scorer
        triton.load("scorer", config=config_json(scorer_v1))
        triton.wait_ready("scorer", "1")
    try:
        env = environment(fleet.settings, "fleet")
        scorer_row, scoring_row = model_status(fleet.settings, env, fleet.registry, ["scorer", "scoring"])
        assert scorer_row["serving"] == {fleet.urls[0]: ["2"], fleet.urls[1]: ["2"], odd: ["1"]}
        assert scorer_row["drift"] == [f"{odd} serves v1, store wants v2"]
        assert scoring_row["target_pins"] == {
            fleet.urls[0]: {"scorer": "2"},
            fleet.urls[1]: {"scorer": "2"},
            odd: {"scorer": "-1"},
        }
        assert scoring_row["drift"] == [f"{odd} pins scorer v-1, the store's config pins v2"]
    finally:
        with TritonControl(odd) as triton:  # back to the store's configs, as overrides: a plain
            triton.load("scorer", config=config_json(store.read_config("scorer") or ""))  # load keeps one
            triton.load("scoring", config=config_json(store.read_config("scoring") or ""))
    assert fleet.ready(odd, "scorer") == ["2"]
    assert fleet.pinned(odd) == 2


def test_a_replica_started_after_the_promotion_serves_the_promoted_versions(fleet: FleetStack) -> None:
    """What a Kubernetes scale-out or pod restart does: --load-model=* on the store."""
    install = local_triton.locate_triton()
    state = fleet.root / "replica-late"
    backends = local_triton.build_backend_dir(install, fleet.settings.backends_source, state / "backends")
    ports = (local_triton.free_port(), local_triton.free_port(), local_triton.free_port())
    prefix = f"mlreg_fleet_late_{ports[0]}_"
    command = local_triton.server_command(install, fleet.store, backends, ports, prefix)
    env = local_triton.server_env(install)
    process = local_triton.triton_process(
        command + ["--load-model=*"], env, ports[1], state / "triton.log", 60
    )
    started = process.start()
    url = f"127.0.0.1:{ports[0]}"
    # the ensemble re-pointed at scorer v2 is served from the folder MLflow numbered it (issue 48,
    # one number): the version the fleet's first replica serves, whatever its number
    serving = fleet.ready(fleet.urls[0], "scoring")
    assert len(serving) == 1
    try:
        with TritonControl(url) as triton:
            triton.wait_ready("scoring", serving[0], timeout=60)
        assert fleet.ready(url, "scoring") == serving
        assert fleet.ready(url, "scorer") == fleet.ready(fleet.urls[0], "scorer") == ["2"]
        assert fleet.pinned(url) == 2
    finally:
        local_triton.stop_pid(started.pid, prefix, grace=TEARDOWN_GRACE, process=started)


def test_a_replica_killed_during_a_wave_stops_the_rollout_naming_it_and_a_rerun_completes(
    fleet: FleetStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the victim is not restarted until the roll-out ended: the wait for a dropped replica to come
    # back (30 s in production) still runs and still finds it gone, in 2 s of the suite's time
    monkeypatch.setattr(fanout, "RESTART_WAIT_S", 2.0)
    assert fleet.register("scorer", SCORER_CONFIG, scorer("v5")) == "5"
    victim, process = fleet.servers[2]

    def connect(url: str) -> TritonControl:
        """Real replicas; the last one is SIGKILLed when the second wave starts (a real kill at a
        known point of the roll-out)."""
        control = TritonControl(url, timeout=10, load_timeout=120)
        if url == fleet.urls[1]:
            load = control.load

            def killing_load(model: str, config: str | None = None, *args: Any) -> None:
                if config is not None and process.poll() is None:
                    os.killpg(victim.pid, signal.SIGKILL)
                    process.wait(timeout=30)
                load(model, config, *args)

            setattr(control, "load", killing_load)  # noqa: B010 (an instance attribute, on purpose)
        return control

    with (
        fleet.explained(),
        pytest.raises(PromotionFailed, match=f"after wave 2 of 3 failed: replica {victim.grpc_url}") as info,
    ):
        with scoring_traffic(fleet.urls[:2]):  # the bake needs requests; the victim's would only fail
            fleet.promote("scorer", "5", connect=connect)
    assert info.value.result is not None
    assert info.value.result.rolled_back  # by the roll-out's own abort; nothing left for the rollback
    assert "every touched replica is back on the store's config" in info.value.message
    assert "rollback failed" not in info.value.message
    for url in fleet.urls[:2]:  # the others: consistent, on the old version
        assert fleet.ready(url, "scorer") == ["2"], url
        assert fleet.pinned(url) == 2, url
    assert serving_versions(open_store(fleet.store).read_config("scorer")) == ["2"]
    assert "model_version: 2" in (open_store(fleet.store).read_config("scoring") or "")
    assert fleet.registry.models.aliases("scorer")["fleet"] == "2"
    [row] = model_status(fleet.settings, environment(fleet.settings, "fleet"), fleet.registry, ["scorer"])
    assert any(line.startswith(f"{victim.grpc_url} unreachable") for line in row["drift"])
    before = fleet.state(fleet.urls[:2])
    assert "scorer/2/model.py" in before["objects"]  # the snapshot sees the store
    with pytest.raises(PromotionError, match=rf"unreachable \({victim.grpc_url}\), max_unavailable = 0"):
        fleet.promote("scorer", "5")  # while it is down: refused before anything changes
    assert fleet.state(fleet.urls[:2]) == before  # the store's objects, both live replicas, aliases
    assert "promoted_fleet" not in (fleet.registry.models.version("scorer", "5").tags or {})

    local_triton.remove_shm(victim.shm_prefix)
    fleet.servers[2] = local_triton.start_server(  # locked as the fleet's others (stacks.tritons)
        fleet.store,
        fleet.root / "replica-2-again",
        fleet.settings.backends_source,
        control_key=os.environ["MLREG_CONTROL_KEY"],
    )
    fleet.write_environment()
    with TritonControl(fleet.urls[2]) as triton:  # as a restarted pod's --load-model=* would
        triton.load("scoring")
    with fleet.explained(), scoring_traffic(fleet.urls) as traffic:
        result = fleet.promote("scorer", "5")
    assert result.ok
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["5"], url
        assert fleet.pinned(url) == 5, url
    assert fleet.registry.models.aliases("scorer")["fleet"] == "5"


def _environment_with(fleet: FleetStack, targets: list[str], extra: str) -> None:
    """The ``fleet`` environment over ``targets`` (live or not), with ``extra`` policy lines."""
    listed = ", ".join(f'"{url}"' for url in targets)
    metrics = ", ".join(f'"{info.grpc_url}" = "{info.metrics_url}"' for info, _ in fleet.servers)
    (fleet.root / "mlreg.toml").write_text(
        f'[environments.fleet]\nstore = "{fleet.store}"\ntargets = [{listed}]\ngpu = false\n'
        f"canary = 1\nwaves = [100]\nmetrics = {{ {metrics} }}\n{extra}"
    )


def test_a_rerun_repairs_an_ensemble_left_on_the_latest_member_or_missing_on_a_replica(
    fleet: FleetStack,
) -> None:
    """What an interrupted roll-out leaves (the ensemble following -1 on one replica) and a replica
    restarted without the ensemble: promoting the serving version again repairs both, and the
    promotion's verify checks the ensemble on every replica."""
    a, _, c = fleet.urls
    store = open_store(fleet.store)
    following = (store.read_config("scoring") or "").replace("model_version: 5", "model_version: -1")
    with TritonControl(a) as triton:
        triton.load("scoring", config=config_json(following))
    with TritonControl(c) as triton:
        triton.unload("scoring")
    assert fleet.pinned(a) == -1
    assert fleet.ready(c, "scoring") == []
    result = fleet.promote("scorer", "5")
    assert result.stage_names()[0] != "noop"
    assert [(s.model, s.reload) for s in result.plan.steps if not s.noop] == [("scoring", True)]
    # the ensemble pinned at scorer v5 is served from the folder MLflow numbered it (issue 48, one
    # number): the version the store's config serves, on every replica
    served = sorted(serving_versions(store.read_config("scoring") or ""), key=int)
    assert len(served) == 1
    for url in fleet.urls:
        assert fleet.ready(url, "scoring") == served, url
        assert fleet.pinned(url) == 5, url
        assert fleet.ready(url, "scorer") == ["5"], url
    assert fleet.promote("scorer", "5").stage_names() == ["noop", "repair"]


def test_a_replica_skipped_under_max_unavailable_is_named_in_every_report(fleet: FleetStack) -> None:
    from pipelines.devstack.local_triton import free_port

    ghost = f"127.0.0.1:{free_port()}"
    _environment_with(fleet, [*fleet.urls, ghost], "max_unavailable = 1\n")
    try:
        assert fleet.register("scorer", SCORER_CONFIG, scorer("v6")) == "6"
        result = fleet.promote("scorer", "6")
    finally:
        fleet.write_environment()
    deploy = next(s for s in result.stages if s.stage == "deploy")
    assert f"skipped under max_unavailable: {ghost} (" in deploy.detail  # the human output's line
    document = result.to_dict()  # what --json prints
    assert list(document["plan"]["skipped"]) == [ghost]
    [report] = [s["report"] for s in document["stages"] if s["stage"] == "deploy"]
    assert list(report["skipped"]) == [ghost]
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["6"], url
        assert fleet.pinned(url) == 6, url
    assert fleet.registry.models.aliases("scorer")["fleet"] == "6"


@pytest.mark.parametrize(
    ("max_unavailable", "error", "message"),
    [
        (2, PromotionError, r"no replica is reachable \(127\.0\.0\.1:\d+, 127\.0\.0\.1:\d+\)"),
        (5, UsageError, r"max_unavailable = 5 is more than the fleet's 2 replica\(s\)"),
    ],
)
def test_a_fleet_with_no_reachable_replica_is_refused_and_the_alias_stays(
    fleet: FleetStack, max_unavailable: int, error: type[Exception], message: str
) -> None:
    from pipelines.devstack.local_triton import free_port

    # registered first: the state compared holds every version's tags (stacks.refusal_state), the
    # candidate's too, so the refusal must leave the new version's own tags alone as well
    version = fleet.register("scorer", SCORER_CONFIG, scorer("v7"))
    before = fleet.state()
    ghosts = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    _environment_with(fleet, ghosts, f"max_unavailable = {max_unavailable}\n")
    try:
        with pytest.raises(error, match=message):
            fleet.promote("scorer", version)
    finally:
        fleet.write_environment()
    assert fleet.state() == before  # store, every replica, aliases
    assert "promoted_fleet" not in (fleet.registry.models.version("scorer", version).tags or {})


def test_an_abort_never_loads_the_previous_versions_corrupt_bytes(fleet: FleetStack) -> None:
    """The serving version's model.py is altered in S3 (same size: the answers' sign flips); a new
    version fails to load on the canary.  The promotion restores v6 from the registry's artifacts
    before any change, so the abort loads the registered bytes: every replica answers X * 6."""
    store = open_store(fleet.store)
    key = "scorer/6/model.py"
    good = store.objects.read(key)
    assert good is not None
    assert b"y = (x * self.factor)" in good
    store.objects.write(key, good.replace(b"y = (x * self.factor)", b"y = (x *-self.factor)"))
    with pytest.raises(PromotionFailed, match="scorer weights are missing") as info:
        fleet.promote(
            "scorer",
            fleet.register("scorer", SCORER_CONFIG, failing_python_model("scorer weights are missing")),
        )
    validate = next(s for s in info.value.result.stages if s.stage == "validate")
    assert "scorer/6 (corrupt: restored by assemble)" in validate.detail
    assert "rolled back" in info.value.message
    assert store.objects.read(key) == good  # the registered bytes are back in the store
    digest = fleet.registry.models.version("scorer", "6").tags["artifact_digest"]
    store.versions.verify_version("scorer", "6", digest)
    x = np.array([1, 2, 3, 4], np.float32)
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == ["6"], url
        with TritonControl(url) as triton:
            np.testing.assert_allclose(triton.infer("scoring", {"X": x}, ["Y"])["Y"], x * 6)


def test_a_serving_version_tampered_in_store_and_registry_refuses_the_promotion_before_any_change(
    fleet: FleetStack,
) -> None:
    """Item 3 of the undo issue, on S3 with every replica: the serving version's model.py altered
    (same size) in the store and in MLflow's artifacts alike, so an abort could not load it again:
    the promotion is refused before any change, naming the fix; every object of the store, what
    each replica serves and pins, and every alias are as before."""
    store = open_store(fleet.store)
    [serving] = serving_versions(store.read_config("scorer"))
    key = f"scorer/{serving}/model.py"
    good = store.objects.read(key)
    assert good is not None
    assert b"y = (x * self.factor)" in good
    bad = good.replace(b"y = (x * self.factor)", b"y = (x *-self.factor)")
    record = sqlite.model_version(fleet.registry.uri, "scorer", serving)
    source = record.local_source() if record is not None else None
    assert source is not None, f"scorer v{serving}: no local artifacts"
    registered = source / "model.py"
    kept = registered.read_bytes()
    new = fleet.register("scorer", SCORER_CONFIG, scorer("after-tamper"))
    store.objects.write(key, bad)
    registered.write_bytes(bad)
    try:
        before = fleet.state()
        with pytest.raises(
            PromotionFailed, match=f"scorer v{serving}, the version an abort would load"
        ) as info:
            fleet.promote("scorer", new)
        assert "nothing was changed" in info.value.message
        assert "--no-way-back" in (info.value.fix or "")
        assert [s.stage for s in info.value.result.stages][-1] == "validate"  # before any live stage
        assert fleet.state() == before
    finally:
        store.objects.write(key, good)
        registered.write_bytes(kept)


@contextlib.contextmanager
def _paused_at_first_wave(
    fleet: FleetStack, version: str, env_extra: dict[str, str] | None = None, resume: Path | None = None
) -> Iterator[Paused]:
    """``mlreg promote scorer`` in a process of its own, paused by the test hook once its canary
    moved (``wave:1``), on an environment without a bake (the canary, then the rest); the fleet's
    environment back and the process killed if still running on the way out."""
    env = {"MLREG_HOME": str(fleet.settings.home), **(env_extra or {})}
    args = ("promote", "scorer", "--version", version, "--env", "fleet", "--skip-quality")
    _environment_with(fleet, fleet.urls, "")
    try:
        with paused_mlreg(env, "wave:1", *args, resume=resume) as paused:
            yield paused
    finally:
        fleet.write_environment()


def test_a_closed_terminal_at_the_first_wave_puts_every_touched_replica_back(fleet: FleetStack) -> None:
    """Item 2 of the undo issue on a real fleet: SIGHUP (a closed SSH session) once the canary moved
    in its wave: the undo log puts the canary back, the other replicas never moved, the locks are
    released, and mlreg exits 129 saying so."""
    version = fleet.register("scorer", SCORER_CONFIG, scorer("hang-up"))
    before = fleet.state()
    with _paused_at_first_wave(fleet, version) as paused:
        assert version in fleet.ready(fleet.urls[0], "scorer")  # the canary moved
        paused.process.send_signal(signal.SIGHUP)
        code, err = paused.finish(300)
    assert code == 129, err
    assert "interrupted (SIGHUP)" in err, err
    assert "rolled back, the previous versions serve" in err, err
    assert "Traceback" not in err
    # every object of the store, the aliases, what every replica lists and pins: the canary's index
    # keeps the version it loaded and gave back (UNAVAILABLE); the others never listed it
    assert fleet.state() == unloaded_on(before, fleet.urls[0], "scorer", version)
    assert open_store(fleet.store).session.locks() == []  # released on the way out


def test_a_promotion_frozen_past_its_lease_touches_nothing_once_another_took_its_lock(
    fleet: FleetStack, tmp_path: Path
) -> None:
    """Item 9 of the undo issue: promotion A (lease 3 s) moves the canary, then is frozen (SIGSTOP)
    past its lease; promotion B takes the stale locks over and promotes its own version everywhere.
    A, resumed, is fenced: it writes nothing to the store, moves no replica (its undo included) and
    says so -- B's version still serves on every replica, with its folder, config and alias."""
    mine = fleet.register("scorer", SCORER_CONFIG, scorer("frozen"))
    theirs = fleet.register("scorer", SCORER_CONFIG, scorer("taker"))
    resume = tmp_path / "resume"
    with _paused_at_first_wave(fleet, mine, {"MLREG_LOCK_LEASE": "3"}, resume) as paused:
        assert mine in fleet.ready(fleet.urls[0], "scorer")  # the canary serves A's version now
        os.kill(paused.process.pid, signal.SIGSTOP)  # frozen: its lease is not renewed any more
        locks = open_store(fleet.store).session.locks
        # past the 3 s lease by the store's clock: every lock A holds reads stale
        assert processes.poll_until(lambda: (held := locks()) and all(lock.stale for lock in held), 60, 0.25)
        with fleet.explained():
            assert fleet.promote("scorer", theirs).ok  # takes the stale locks over
        before = fleet.state()
        for url in fleet.urls:
            assert fleet.ready(url, "scorer") == [theirs], url
        resume.touch()
        os.kill(paused.process.pid, signal.SIGCONT)
        code, err = paused.finish(300)
    assert code == 8, err
    assert "it lost its lock, so nothing was put back" in err, err
    assert "lock of scorer lost" in err, err
    assert "Traceback" not in err
    after = fleet.state()
    assert after == before  # every object of the store, what each replica serves and pins, aliases
    for url in fleet.urls:
        assert fleet.ready(url, "scorer") == [theirs], url
    assert fleet.registry.models.aliases("scorer")["fleet"] == theirs
    assert f"scorer/{theirs}/model.py" in after["objects"]


def test_stack_up_replicas_starts_a_local_fleet_the_local_environment_targets(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from mlreg.ops.context import environment
    from pipelines.devstack.stack import running_servers, stack_down, stack_status, stack_up
    from pipelines.promote.environments import resolve_targets

    root = tmp_path_factory.mktemp("local-fleet")
    home = root / ".mlreg"
    settings, _ = stack_settings(root)
    try:
        status = stack_up(settings, ui=False, replicas=2)
        assert status.info is not None
        assert len(status.replicas) == 1
        assert status.replicas[0].repository == status.info.repository  # one repository
        urls = resolve_targets(settings, environment(settings, "local"))
        assert urls == (status.info.grpc_url, status.replicas[0].grpc_url)
        for url in urls:
            with TritonControl(url) as triton:
                assert triton.is_live()
        assert stack_up(settings, ui=False, replicas=2).replicas == status.replicas  # reused
        assert stack_status(settings).to_dict()["replicas"] == [status.replicas[0].grpc_url]
        os.kill(status.info.pid, signal.SIGKILL)  # the primary killed: `stack down` still stops the rest
        assert processes.poll_until(lambda: not local_triton.pid_alive(status.info.pid), 10, 0.1)
    finally:
        stopped = stack_down(settings)
    assert [info.pid for info in stopped] == [status.replicas[0].pid]
    assert not local_triton.pid_alive(status.replicas[0].pid)
    assert running_servers(settings) == []
    assert not list(home.glob("stack/replica-*/triton.json"))


# -- issue 38: an ensemble rerun that repairs, an ensemble the store lost ----------------------------


def _cli(fleet: FleetStack, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """``mlreg ARGS`` in this process, on the fleet's project and its embedded registry."""
    from mlreg.cli.main import app
    from tests.cli import CliRunner

    monkeypatch.setenv("MLREG_HOME", str(fleet.settings.home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    return CliRunner().invoke(app, list(args))


def test_a_rerun_through_the_serving_ensemble_repairs_the_alias_its_member_was_left_with(
    fleet: FleetStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6 of issue 38: what MLflow going down at ``alias-moved:scorer`` leaves -- scorer's alias
    on a version that never served, every replica and the store as before -- and the rerun through
    the ensemble that serves (re-pointed: a registered version, in the Triton folder of its
    number): `mlreg promote scoring --version N` says it already serves and moves scorer's alias
    back; status is clean."""
    store = open_store(fleet.store)
    [serving] = serving_versions(store.read_config("scorer"))
    ensemble = fleet.registry.models.aliases("scoring")["fleet"]
    # one number (issue 48): the re-pointed ensemble serves from the folder MLflow numbered it
    assert (serving_versions(store.read_config("scoring")), ensemble != "1") == ([ensemble], True)
    before = fleet.state()
    failed = max({str(v.version) for v in fleet.registry.models.versions("scorer")} - {serving}, key=int)
    fleet.registry.models.set_alias("scorer", "fleet", failed)  # moved by the record stage, never put back

    status = _cli(fleet, monkeypatch, "status", "--env", "fleet")
    assert status.exit_code == 1, status.output
    assert f"alias fleet=v{failed} but the store serves v{serving}" in status.output

    rerun = _cli(fleet, monkeypatch, "promote", "scoring", "--version", ensemble, "--env", "fleet")
    assert rerun.exit_code == 0, rerun.output
    assert f"scoring version {ensemble} already serves in 'fleet': nothing to do" in rerun.output
    assert f"alias 'fleet' of scorer moved back to v{serving} (was {failed})" in rerun.output
    assert "Traceback" not in rerun.output
    assert fleet.state() == before  # every object of the store, every replica's index and pins, aliases
    assert store.session.locks() == []
    status = _cli(fleet, monkeypatch, "status", "--env", "fleet")
    assert status.exit_code == 0, status.output


def test_status_says_what_serves_an_ensemble_whose_store_folder_was_deleted(
    fleet: FleetStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9 of issue 38: the store's ``scoring/`` deleted while scoring answers on every replica:
    status exits 1 saying what Triton still serves (the registered version, its own folder) instead of
    "nothing serves it"; promoting that version again puts the folder back and status is clean."""
    store = open_store(fleet.store)
    [serving] = serving_versions(store.read_config("scorer"))
    ensemble = fleet.registry.models.aliases("scoring")["fleet"]
    for key in store.objects.list_prefix("scoring/"):
        store.objects.delete(key)
    x = np.array([1, 2, 3, 4], np.float32)
    for url in fleet.urls:  # still loaded, though gone from the repository index
        assert fleet.serving(url, "scoring") == {}, url
        with TritonControl(url) as triton:
            np.testing.assert_allclose(triton.infer("scoring", {"X": x}, ["Y"])["Y"], x * int(serving))
    aliases = fleet.state()["aliases"]

    status = _cli(fleet, monkeypatch, "status", "--env", "fleet")
    assert status.exit_code == 1, status.output
    row = next(line.split() for line in status.output.splitlines() if line.startswith("scoring "))
    assert row[:3] == ["scoring", ensemble, "-"]
    # one number (issue 48): Triton's folder is the registered version, so no "[folder]" label
    assert " ".join(row[3:]) == "; ".join(f"{url}: {ensemble}" for url in fleet.urls)
    assert f"the store lost its folder; Triton still serves v{ensemble} (promote" in status.output
    assert "nothing serves it" not in status.output

    _environment_with(fleet, fleet.urls, "")  # the canary, then the rest: no bake without traffic
    try:
        rerun = _cli(fleet, monkeypatch, "promote", "scoring", "--version", ensemble, "--env", "fleet")
    finally:
        fleet.write_environment()
    assert rerun.exit_code == 0, rerun.output
    assert serving_versions(store.read_config("scoring")) == [ensemble]  # the folder is back
    for url in fleet.urls:
        assert fleet.ready(url, "scoring") == [ensemble], url
        assert fleet.pinned(url) == int(serving), url
    assert fleet.state()["aliases"] == aliases
    assert store.session.locks() == []
    status = _cli(fleet, monkeypatch, "status", "--env", "fleet")
    assert status.exit_code == 0, status.output
