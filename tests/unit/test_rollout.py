"""Fleet roll-out logic on fakes: policy parsing, wave sizes, the bake's verdict, Triton's metrics
text, DNS discovery, and the staged roll-out's order and its undo (fake replicas, tests/fakes.py's
FakeTarget: the real ones are in tests/integration/test_fleet.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.core.plan import Role, Step
from pipelines.core.policy import Check, Policy, judge, parse_policy, waves_of
from pipelines.core.undo import UndoLog
from pipelines.fleet import discovery
from pipelines.fleet.fleet import Change, Fleet
from pipelines.fleet.replicas import reachable
from pipelines.promote.environments import environment, resolve_targets
from pipelines.rollout.probes import Probes, Target
from pipelines.rollout.staged import Move, StagedRollout, following_latest
from pipelines.storage import open_store
from pipelines.triton import metrics
from registry.errors import PromotionError, TritonError, UsageError
from registry.settings import Settings
from tests.fakes import Call, FakeTarget, Handler

CONFIG = 'name: "m"\nbackend: "python"\nversion_policy { specific { versions: [ 2 ] } }\n'
OLD_CONFIG = CONFIG.replace("[ 2 ]", "[ 1 ]")
URLS = [f"r{i}:8001" for i in range(4)]


def _settings(tmp_path: Path, toml: str) -> Settings:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    (tmp_path / "mlreg.toml").write_text(toml)
    return settings


# -- policy ------------------------------------------------------------------------------------


def test_a_policy_is_read_from_mlreg_toml(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        '[environments.prod]\nstore = "s3://b/p"\ntargets = ["a:8001", "b:8001"]\ncanary = "25%"\n'
        "waves = [50, 100]\nbake_seconds = 30\nmax_parallel = 4\nmax_failure_ratio = 0.02\n"
        'metrics = { "a:8001" = "http://a:9000/metrics" }\n',
    )
    policy = environment(settings, "prod").policy
    assert policy == Policy(
        canary=25.0,
        waves=(50.0, 100.0),
        bake_seconds=30.0,
        max_parallel=4,
        checks=(
            Check("requests", min=10, key="min_requests"),
            Check("failure_ratio", max=0.02, key="max_failure_ratio"),
            Check("latency_ratio", max=2.0, key="max_latency_ratio"),
            Check("probe_failure_ratio", max=0.01),  # on by default (issue 35)
        ),
        metrics=(("a:8001", "http://a:9000/metrics"),),
    )
    assert policy.metrics_url("a:8001") == "http://a:9000/metrics"
    assert policy.metrics_url("b:8001") == "http://b:8002/metrics"


def test_an_environment_without_rollout_keys_has_no_policy(tmp_path: Path) -> None:
    settings = _settings(tmp_path, '[environments.s]\nstore = "/tmp/x"\ntargets = ["a:8001"]\n')
    assert environment(settings, "s").policy is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("waves = [100, 50]", r"waves = \[100.0, 50.0\]: percents must rise strictly and end at 100"),
        ("waves = [25, 50]", r"waves = \[25.0, 50.0\]: percents must rise strictly and end at 100"),
        ("waves = 100", r"waves must be a list such as \[25, 100\], not 100"),
        ("canary = 0", "canary .* must be an integer >= 1, not 0"),
        ('canary = "150%"', "canary percent must be within 0..100"),
        ("max_parallel = 0", "max_parallel must be an integer >= 1, not 0"),
        ("max_parallel = true", "max_parallel must be an integer >= 1, not True"),
        ("max_unavailable = -1", "max_unavailable must be an integer >= 0, not -1"),
        ('bake_seconds = "x"', "bake_seconds must be a number, not 'x'"),
        ("max_failure_ratio = 2", "max_failure_ratio must be within 0..1"),
        ("max_latency_ratio = 0.5", "max_latency_ratio must be >= 1"),
        ('metrics = "http://x"', "metrics must be a table of target"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(tmp_path: Path, line: str, message: str) -> None:
    settings = _settings(tmp_path, f'[environments.prod]\nstore = "/tmp/x"\ntargets = ["a:8001"]\n{line}\n')
    with pytest.raises(UsageError, match=r"mlreg.toml \[environments.prod\]: " + message) as info:
        environment(settings, "prod")
    assert info.value.fix


def test_discover_and_targets_together_are_refused(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001"]\ndiscover = "dns:t:8001"\n'
    )
    with pytest.raises(UsageError, match='discover must be one "dns:NAME:PORT" string, without targets'):
        environment(settings, "p")


@pytest.mark.parametrize("spec", ["dns:triton", "dns::8001", "srv:triton:8001", "dns:t:99999"])
def test_a_bad_discover_spec_is_refused(spec: str) -> None:
    with pytest.raises(UsageError, match="discover = "):
        discovery.parse(spec)


def test_discovery_lists_every_a_and_aaaa_record() -> None:
    def lookup(name: str, port: int, *_: Any) -> list[Any]:
        assert (name, port) == ("triton-headless", 8001)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 8001)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 8001)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", 8001, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 8001)),
        ]

    assert discovery.resolve("dns:triton-headless:8001", lookup) == (
        "10.0.0.1:8001",
        "10.0.0.2:8001",
        "[fd00::1]:8001",
    )


def test_discovery_on_the_real_resolver_and_in_an_environment(tmp_path: Path) -> None:
    settings = _settings(tmp_path, '[environments.p]\nstore = "/tmp/x"\ndiscover = "dns:localhost:8001"\n')
    found = resolve_targets(settings, environment(settings, "p"))
    assert "127.0.0.1:8001" in found
    with pytest.raises(PromotionError, match="cannot resolve no-such-host.invalid"):
        discovery.resolve("dns:no-such-host.invalid:8001")


# -- waves and verdicts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "canary", "waves", "sizes"),
    [
        (4, 1, (25.0, 100.0), [1, 3]),
        (4, 1, (50.0, 100.0), [1, 1, 2]),
        (10, 10.0, (30.0, 60.0, 100.0), [1, 2, 3, 4]),
        (3, 1, (100.0,), [1, 2]),
        (1, 1, (25.0, 100.0), [1]),
        (2, 5, (100.0,), [2]),
        (5, 40.0, (50.0, 100.0), [2, 1, 2]),
    ],
)
def test_wave_sizes(n: int, canary: int | float, waves: tuple[float, ...], sizes: list[int]) -> None:
    groups = waves_of([f"r{i}" for i in range(n)], Policy(canary=canary, waves=waves))
    assert [len(g) for g in groups] == sizes
    assert [u for g in groups for u in g] == [f"r{i}" for i in range(n)]


def test_the_verdict_trips_on_failures_and_latency() -> None:
    policy = Policy()  # the default checks: min_requests 10, max_failure_ratio 0.01, max_latency_ratio 2
    old = metrics.Counters(success=1000, failure=0, duration_us=1000 * 500)
    assert judge(old, metrics.Counters(100, 0, 100 * 900), policy).ok
    failing = judge(old, metrics.Counters(80, 20, 100 * 500), policy)
    assert (failing.ok, failing.metric) == (False, "failure_ratio")
    assert "failure ratio 0.200 (20 of 100 requests) against 0.000" in failing.detail
    slow = judge(old, metrics.Counters(100, 0, 100 * 1500), policy)
    assert (slow.ok, slow.metric) == (False, "latency_ratio")
    assert "mean latency 1500 us against 500 us for the old version (x3.00)" in slow.detail
    idle = judge(old, metrics.Counters(3, 0, 300), policy)
    assert (idle.ok, idle.metric) == (False, "requests")


def test_triton_metrics_text_is_read_per_model_and_version() -> None:
    text = "\n".join(
        [
            "# HELP nv_inference_request_success Number of successful inference requests",
            'nv_inference_request_success{model="m",version="1"} 10',
            'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 3',
            'nv_inference_request_failure{model="m",reason="OTHER",version="1"} 1',
            'nv_inference_request_duration_us{model="m",version="1"} 14000',
            'nv_inference_request_success{model="e",version="1"} 7',
            'nv_inference_count{model="m",version="1"} 10',
        ]
    )
    snapshot = metrics.parse(text)
    assert snapshot[("m", "1")] == metrics.Counters(10, 4, 14000)
    assert snapshot[("e", "1")].success == 7
    later = metrics.parse(text.replace("} 10", "} 30"))
    assert metrics.window(snapshot, later)[("m", "1")].success == 20
    assert metrics.window(later, snapshot)[("m", "1")].success == 10  # a restarted server


# -- the staged roll-out on fake replicas ---------------------------------------------------------


Log = list[tuple[str, str, bool]]  # (url, model or "unload <model>", sent a config override)


def _replica(log: Log, dead: bool) -> Handler:
    """A replica's handler: each load and unload written to ``log``; a dead one refuses all."""

    def handle(target: FakeTarget, call: Call) -> None:
        if dead:
            what = {"is_live": "live check"}.get(call.method, call.method)
            raise TritonError(f"{what} failed on {call.url}: connection refused", fix="start it")
        if call.method == "load":
            log.append((call.url, call.model, call.config is not None))
        elif call.method == "unload":
            log.append((call.url, f"unload {call.model}", False))

    return handle


def _fleet(dead: set[str] | None = None) -> tuple[dict[str, FakeTarget], Log]:
    log: Log = []
    # a replica answers ready for whatever version it is asked about: these tests judge the order of
    # the moves and their undo, and their moves' versions need not match the configs they send
    replicas = {u: FakeTarget(u, _replica(log, u in (dead or set())), ready=lambda *_: True) for u in URLS}
    return replicas, log


def _opener(replicas: dict[str, FakeTarget]) -> Callable[[str], Any]:
    return replicas.__getitem__


def _snapshot(new_ok: float, new_failed: float, old_ok: float) -> metrics.Snapshot:
    return {
        ("m", "2"): metrics.Counters(new_ok, new_failed, (new_ok + new_failed) * 100),
        ("m", "1"): metrics.Counters(old_ok, 0, old_ok * 100),
    }


def _step(model: str, text: str, previous: str | None, previous_versions: list[str]) -> Step:
    return Step(model, "2", Role.MODEL, None, text, previous, previous_versions, upload=False)


def _move(
    model: str, text: str, versions: list[str], previous: str | None = None, baked_old: tuple[str, ...] = ()
) -> Move:
    step = _step(model, text, previous, ["1"] if previous else [])
    return Move(step, Change(model, text, tuple(versions)), baked_old)


class Rig:
    """Fake replicas behind a real Fleet (a local store) and an undo log, as the deployer uses them."""

    def __init__(self, tmp_path: Path, policy: Policy, dead: set[str] | None = None, **kwargs: Any) -> None:
        self.replicas, self.log = _fleet(dead)
        store = open_store(tmp_path / "store")
        source = tmp_path / "version"
        source.mkdir()
        (source / "model.py").write_text("x = 1\n")
        for model in ("m", "e", "n"):  # a real Fleet loads only versions the store verifies
            for version in ("1", "2"):
                store.versions.put_version(model, version, source)
        self.undo = UndoLog(gpu=False, journal=store.session)
        self.fleet = Fleet(store, URLS, _opener(self.replicas), 10, policy.max_parallel, undo=self.undo)
        self.staged = StagedRollout(URLS, self.fleet, policy, **kwargs)
        # these moves' versions need not match their configs (see _fleet): the restart watch, which
        # reads what each replica holds against them, would take that for a restart (test_restart.py)
        self.staged.watch.check = lambda urls, moves: None  # type: ignore[method-assign]

    def run_and_undo(self, moves: list[Move]) -> PromotionError:
        """The roll-out fails; the runner's replay of the undo log follows (as on_error does)."""
        self.undo.plan(m.step for m in moves)
        for move in moves:  # each replica serves the version a model had in the store before
            for replica in self.replicas.values():
                if move.step.previous_config is not None:
                    replica.states[move.step.model] = {v: "READY" for v in move.step.previous_versions}
        with pytest.raises(PromotionError) as info:
            self.staged.run(moves)
        self.report = self.undo.replay(self.fleet, self.fleet.store)
        return info.value


def test_waves_move_in_order_and_the_store_config_is_never_sent(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Policy(waves=(50.0, 100.0), max_parallel=2))
    rollouts = rig.staged.run([_move("m", CONFIG, ["2"]), _move("e", CONFIG.replace('"m"', '"e"'), ["1"])])
    assert [u for u, model, _ in rig.log if model == "m"][:1] == ["r0:8001"]  # the canary first
    assert {u for u, _, _ in rig.log} == set(URLS)
    assert all(override for _, _, override in rig.log)  # per replica: the load API's config override
    assert [t.url for t in rollouts[0].targets][:2] == ["r0:8001", "r1:8001"]
    assert all(t.ok for r in rollouts for t in r.targets)
    # every move noted before it was made: the canary, wave 2, then wave 3's two in parallel (either first)
    assert rig.undo.replicas[:2] == URLS[:2]
    assert sorted(rig.undo.replicas) == URLS
    at = {url: [i for i, (u, _, _) in enumerate(rig.log) if u == url] for url in URLS}
    # canary r0, then wave 2 (r1), then wave 3 (r2 and r3, two at a time): each wave done first
    assert max(at["r0:8001"]) < min(at["r1:8001"])
    assert max(at["r1:8001"]) < min(at["r2:8001"] + at["r3:8001"])


def test_a_tripped_bake_is_undone_on_the_touched_replicas_only(tmp_path: Path) -> None:
    baked = {"done": False}  # the scrapes before the bake window, then after it

    def scrape(url: str) -> metrics.Snapshot:
        if not baked["done"]:
            return _snapshot(0, 0, 0)
        return _snapshot(80, 20, 100) if url == URLS[0] else _snapshot(0, 0, 100)

    policy = Policy(waves=(100.0,), bake_seconds=5)
    rig = Rig(tmp_path, policy, scrape=scrape, sleep=lambda s: baked.update(done=True))
    error = rig.run_and_undo([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert "bake after wave 1 of 2 tripped on m v2 (failure_ratio)" in error.message
    assert "failure ratio 0.200 (20 of 100 requests)" in error.message
    assert rig.log == [("r0:8001", "m", True), ("r0:8001", "m", True)]  # moved, then back: both overrides
    assert [c["version_policy"]["specific"]["versions"] for c in rig.replicas["r0:8001"].configs] == [
        ["2"],
        ["1"],
    ]
    assert rig.report.ok


def test_the_undo_unloads_a_model_new_to_the_store_and_restores_the_others(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Policy(waves=(100.0,)), dead={"r1:8001"})
    error = rig.run_and_undo([_move("m", CONFIG, ["2"], previous=OLD_CONFIG), _move("n", CONFIG, ["1"])])
    assert "wave 2 of 2 failed" in error.message
    assert [e for e in rig.log if e[0] == "r0:8001"] == [  # moved both, then undone newest change first
        ("r0:8001", "m", True),
        ("r0:8001", "n", True),
        ("r0:8001", "unload n", False),
        ("r0:8001", "m", True),
    ]


def test_a_repointed_ensemble_follows_the_latest_member_per_replica_without_touching_the_store(
    tmp_path: Path,
) -> None:
    ensemble_text = (
        'name: "e"\nplatform: "ensemble"\nensemble_scheduling { step [ { model_name: "m" model_version: 1 '
        'input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }\n'
    )
    ensemble = Step("e", "1", Role.ENSEMBLE, None, ensemble_text, ensemble_text, ["1"], upload=False)
    member = _step("m", CONFIG, OLD_CONFIG, ["1"])
    [move] = following_latest([ensemble], [member], gpu=False)
    assert (move.change.model, move.change.versions, move.baked_old) == ("e", ("1",), ())
    assert "model_version: -1" in (move.change.config or "")
    rig = Rig(tmp_path, Policy(canary=1, waves=(100.0,)))
    rig.staged.run([move, _move("m", CONFIG, ["2"], previous=OLD_CONFIG)])
    assert [(u, m) for u, m, _ in rig.log][:2] == [
        ("r0:8001", "e"),
        ("r0:8001", "m"),
    ]  # -1 first, per replica
    pins = [c["ensemble_scheduling"]["step"][0]["model_version"] for c in rig.replicas["r3:8001"].configs[:1]]
    assert pins == ["-1"]
    assert rig.fleet.store.read_config("e") is None  # the store is written by the deployer, at the end


def test_a_replica_failing_mid_wave_stops_the_rollout_naming_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Policy(waves=(100.0,)), dead={"r2:8001"})
    error = rig.run_and_undo([_move("m", CONFIG, ["2"])])
    assert "wave 2 of 2 failed: load failed on r2:8001" in error.message
    assert rig.report.failed == [
        "r2:8001: unload failed on r2:8001: connection refused"
    ]  # the dead one, named
    restored = [u for u, model, _ in rig.log if model == "unload m"]  # new to the store: unloaded
    assert "r0:8001" in restored
    assert "r3:8001" not in restored  # never touched: never loaded it


def test_unreachable_replicas_refuse_the_promotion_unless_tolerated() -> None:
    replicas, _ = _fleet(dead={"r3:8001"})
    with pytest.raises(PromotionError, match=r"1 replica\(s\) unreachable \(r3:8001\), max_unavailable = 0"):
        reachable(URLS, _opener(replicas), 0)
    up, skipped = reachable(URLS, _opener(replicas), 1)
    assert up == tuple(URLS[:3])
    assert skipped == {"r3:8001": "live check failed on r3:8001: connection refused"}  # named, with why


def test_a_fleet_with_no_reachable_replica_is_refused_whatever_max_unavailable() -> None:
    replicas, _ = _fleet(dead=set(URLS))
    with pytest.raises(
        PromotionError, match=r"no replica is reachable \(r0:8001, r1:8001, r2:8001, r3:8001\)"
    ):
        reachable(URLS, _opener(replicas), 5)


def test_parse_policy_returns_none_without_keys() -> None:
    assert parse_policy("x", {"store": "/tmp"}) is None


def test_a_replica_whose_metrics_cannot_be_read_aborts_the_bake_naming_it(tmp_path: Path) -> None:
    baked = {"done": False}

    def scrape(url: str) -> metrics.Snapshot:
        if url == URLS[3] and baked["done"]:  # the replica went away during the bake window
            return metrics.scrape("http://127.0.0.1:9/metrics", timeout=1)  # nothing listens on port 9
        return _snapshot(0, 0, 0)

    policy = Policy(waves=(100.0,), bake_seconds=5)
    rig = Rig(tmp_path, policy, scrape=scrape, sleep=lambda s: baked.update(done=True))
    error = rig.run_and_undo([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert "bake after wave 1 of 2 failed: replica r3:8001: cannot read Triton's metrics" in error.message
    assert error.fix == "bring the replica back (its metrics port must answer), then promote again"
    assert rig.log == [("r0:8001", "m", True), ("r0:8001", "m", True)]  # the canary back on the store's


def test_a_plan_shows_its_roll_out_wave_by_wave() -> None:
    from mlreg.cli.output import rollout_line
    from pipelines.core.plan import Plan
    from pipelines.promote.environments import Environment

    policy = Policy(
        canary=1,
        waves=(50.0, 100.0),
        bake_seconds=60,
        max_parallel=2,
        checks=(Check("latency_ratio", max=1.5),),
    )
    env = Environment("production", "s3://models/prod", tuple(URLS), "production", gpu=True, policy=policy)
    rollout = Plan(env, tuple(URLS), "m", "2").to_dict()["rollout"]
    assert rollout["waves"] == [["r0:8001"], ["r1:8001"], ["r2:8001", "r3:8001"]]
    assert rollout_line(rollout) == (
        "canary [r0:8001] ▸ bake 60 s ▸ wave 2 [r1:8001] ▸ bake 60 s ▸ wave 3 [r2:8001, r3:8001] "
        "(max_parallel 2; bake checks: latency_ratio <= 1.5)"
    )
    plain = Environment("staging", "/tmp/store", tuple(URLS), "staging", gpu=False)
    assert Plan(plain, tuple(URLS), "m", "2").to_dict()["rollout"] is None


# -- issue 20: a policy refuses nonsense, a bake refuses counters that are not counts ----------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("bake_seconds = inf", r"bake_seconds = inf must be finite and at most a day \(86400\)"),
        ("bake_seconds = 86401", r"bake_seconds = 86401 must be finite and at most a day \(86400\)"),
        ("metrics_port = 0", r"metrics_port must be a port within 1..65535, not 0"),
        ("metrics_port = 70000", r"metrics_port must be a port within 1..65535, not 70000"),
        ("bake_second = 60", r"unknown key\(s\) 'bake_second' \(did you mean 'bake_seconds'\?\)"),
        (
            "max_unavailabel = 0\ncanary = 1",
            r"unknown key\(s\) 'max_unavailabel' \(did you mean 'max_unavailable'\?\)",
        ),
        ("colour = 'red'", r"unknown key\(s\) 'colour' \(fix: rename or remove"),
    ],
)
def test_a_nonsense_policy_is_refused_naming_the_key_and_the_fix(
    tmp_path: Path, line: str, message: str
) -> None:
    settings = _settings(tmp_path, f'[environments.prod]\nstore = "/tmp/x"\ntargets = ["a:8001"]\n{line}\n')
    with pytest.raises(UsageError, match=r"mlreg.toml \[environments.prod\]: " + message) as info:
        environment(settings, "prod")
    assert info.value.fix


def test_an_unknown_key_names_every_valid_key_in_the_fix(tmp_path: Path) -> None:
    settings = _settings(tmp_path, '[environments.p]\nstore = "/tmp/x"\ntarget = ["a:8001"]\n')
    with pytest.raises(UsageError, match=r"'target' \(did you mean 'targets'\?\)") as info:
        environment(settings, "p")
    assert str(info.value.fix).startswith(
        "rename or remove them; the valid keys are: alias, bake, bake_seconds,"
    )


def test_every_key_the_environment_reads_is_a_valid_key() -> None:
    """The keys ``environments.py`` reads of a section (raw["x"], raw.get("x")) are never refused."""
    import re

    from pipelines.promote import environments

    source = Path(environments.__file__).read_text()
    read = set(re.findall(r'raw(?:\.get\(|\[)"(\w+)"', source))
    assert {"store", "targets", "alias", "gpu", "discover"} <= read
    assert read <= environments.ENVIRONMENT_KEYS


@pytest.mark.parametrize("example", ["infra/k8s/mlreg.toml", "infra/compose/mlreg.toml"])
def test_the_shipped_environments_have_no_unknown_key(tmp_path: Path, example: str) -> None:
    from pipelines.promote.environments import load_environments

    root = Path(__file__).resolve().parents[2]
    settings = _settings(tmp_path, (root / example).read_text())
    assert "production" in load_environments(settings)


@pytest.mark.parametrize(
    ("policy", "replicas", "message", "fix"),
    [
        (Policy(canary=3), 3, r"canary = 3 takes 3 of the fleet's 3 replica\(s\)", "set canary = 1"),
        (Policy(canary=50.0), 1, r'canary = "50%" takes 1 of the fleet\'s 1 replica', "add replicas"),
        (Policy(canary=60.0), 2, r'canary = "60%" takes 2 of the fleet\'s 2 replica', "set canary = 1"),
        (
            Policy(max_unavailable=5),
            2,
            r"max_unavailable = 5 is more than the fleet's 2 replica\(s\)",
            "set max_unavailable = 1 or less",
        ),
        (Policy(), 0, "the fleet has no replica", "add targets"),
    ],
)
def test_a_policy_the_fleet_cannot_follow_is_refused(
    policy: Policy, replicas: int, message: str, fix: str
) -> None:
    from pipelines.core.policy import check_fleet

    with pytest.raises(UsageError, match=r"^mlreg.toml \[environments.p\]: " + message) as info:
        check_fleet(policy, replicas, "mlreg.toml [environments.p]")
    assert str(info.value.fix).startswith(fix)
    if replicas and "canary" in message:
        assert "no replica left to compare with" in info.value.message


def test_a_policy_the_fleet_can_follow_passes() -> None:
    from pipelines.core.policy import check_fleet

    check_fleet(Policy(canary=1, max_unavailable=2), 2, "here")
    check_fleet(Policy(canary=50.0), 2, "here")


def test_nan_counters_fail_the_verdict() -> None:
    nan = float("nan")
    verdict = judge(metrics.Counters(100, 0, 100), metrics.Counters(nan, nan, nan), Policy())
    assert (verdict.ok, verdict.metric) == (False, "counters")
    assert "not counts: new Counters(success=nan" in verdict.detail


def test_a_counter_that_is_not_a_number_refuses_the_scrape_naming_the_metric(tmp_path: Path) -> None:
    text = 'nv_inference_request_success{model="m",version="2"} NaN\n'
    assert metrics.parse(text)[("m", "2")].success != metrics.parse(text)[("m", "2")].success  # NaN kept
    page = tmp_path / "metrics"
    page.write_text(text + 'nv_inference_request_failure{model="m",version="2"} lots\n')
    with pytest.raises(PromotionError, match="are not counts: nv_inference_request_failure") as info:
        metrics.scrape(page.as_uri())
    assert """{model="m",version="2"} = 'lots' is not a number""" in info.value.message
    assert "answers something else" in str(info.value.fix)


def test_faults_name_a_nan_a_negative_value_and_a_counter_that_went_down() -> None:
    nan = float("nan")
    assert metrics.faults("m", {"2"}, {("m", "2"): metrics.Counters(nan, 0, 0)}) == [
        'nv_inference_request_success{model="m",version="2"} is nan, not a count'
    ]
    assert metrics.faults("m", {"2"}, {("m", "2"): metrics.Counters(1, -1, 0)}) == [
        'nv_inference_request_failure{model="m",version="2"} is -1, not a count'
    ]
    before, after = {("m", "1"): metrics.Counters(50, 0, 500)}, {("m", "1"): metrics.Counters(3, 0, 30)}
    assert metrics.faults("m", {"1", "2"}, before, after) == [
        'nv_inference_request_success{model="m",version="1"} went down from 50 to 3 '
        "(a counter reset: the replica restarted)",
        'nv_inference_request_duration_us{model="m",version="1"} went down from 500 to 30 '
        "(a counter reset: the replica restarted)",
    ]
    assert metrics.faults("m", {"2"}, before, after) == []  # another version: not judged here
    assert metrics.faults("m", {"1"}, after, before) == []


def _baking_rig(tmp_path: Path, replica: str, bad: Callable[[bool], metrics.Snapshot]) -> Rig:
    """Fake replicas all answering good counters but ``replica``, whose scrape is ``bad(baked)``."""
    baked = {"done": False}

    def scrape(url: str) -> metrics.Snapshot:
        if url == replica:
            return bad(baked["done"])
        return _snapshot(100, 0, 100) if baked["done"] else _snapshot(0, 0, 0)

    policy = Policy(waves=(100.0,), bake_seconds=5)
    return Rig(tmp_path, policy, scrape=scrape, sleep=lambda s: baked.update(done=True))


def test_nan_counters_fail_the_bake_naming_the_replica_and_the_metric(tmp_path: Path) -> None:
    nan = float("nan")
    rig = _baking_rig(tmp_path, URLS[2], lambda baked: _snapshot(nan, nan, nan))
    error = rig.run_and_undo([_move("m", CONFIG, ["2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert error.message.startswith(
        "the bake after wave 1 of 2 failed: replica r2:8001: "
        'nv_inference_request_success{model="m",version="1"} is nan, not a count'
    )
    assert str(error.fix).startswith("make http://r2:8002/metrics answer Triton's")
    assert rig.log == [("r0:8001", "m", True), ("r0:8001", "m", True)]  # the canary put back
    assert rig.report.ok


def test_a_counter_reset_during_the_bake_fails_it_naming_the_replica(tmp_path: Path) -> None:
    rig = _baking_rig(tmp_path, URLS[0], lambda baked: _snapshot(2, 0, 0) if baked else _snapshot(40, 0, 0))
    error = rig.run_and_undo([_move("m", CONFIG, ["2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert (
        'failed: replica r0:8001: nv_inference_request_success{model="m",version="2"} went down from 40 '
        "to 2 (a counter reset: the replica restarted)" in error.message
    )
    assert rig.log == [("r0:8001", "m", True), ("r0:8001", "m", True)]


def test_a_summary_of_faults_names_each_once_and_counts_the_rest() -> None:
    assert metrics.summary(["a", "b", "a", "c", "d"]) == "a; b (and 2 more)"
    assert metrics.summary(["a", "a"]) == "a"


# -- issue 25: the bake as a list of checks over one table of named metrics -------------------------


def test_a_bake_reads_a_checks_list_and_the_flat_keys_alike(tmp_path: Path) -> None:
    listed = _settings(
        tmp_path,
        '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001", "b:8001"]\nbake_seconds = 30\n'
        '[environments.p.bake]\nchecks = [{ metric = "requests", min = 5 }, '
        '{ metric = "failure_ratio", max = 0.02 }, { metric = "queue_ratio", max = 3 }]\n',
    )
    assert environment(listed, "p").policy.checks == (  # type: ignore[union-attr]
        Check("requests", min=5),
        Check("failure_ratio", max=0.02),
        Check("queue_ratio", max=3),
    )
    (tmp_path / "flat").mkdir()
    flat = _settings(
        tmp_path / "flat",
        '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001", "b:8001"]\nmin_requests = 5\n'
        "max_latency_ratio = 1.5\n",
    )
    checks = environment(flat, "p").policy.checks  # type: ignore[union-attr]
    assert [(c.metric, c.min, c.max) for c in checks] == [
        ("requests", 5, None),
        ("failure_ratio", None, 0.01),
        ("latency_ratio", None, 1.5),
        ("probe_failure_ratio", None, 0.01),  # on by default (issue 35): mlreg's own bake requests
    ]
    old, new = metrics.Counters(100, 0, 100 * 500), metrics.Counters(100, 0, 100 * 900)
    verdict = judge(old, new, Policy(checks=checks))
    assert (verdict.ok, verdict.metric) == (False, "latency_ratio")
    assert verdict.detail.endswith("(x1.80); max_latency_ratio = 1.5")  # the user's own key


@pytest.mark.parametrize(
    ("bake", "message"),
    [
        (
            'checks = [{ metric = "latency", max = 2 }]',
            "unknown metric 'latency' in a bake check; the metrics "
            "are: failure_ratio, latency_ratio, probe_failure_ratio, queue_ratio, requests",
        ),
        ('checks = [{ metric = "requests" }]', "the requests check needs min or max"),
        ('checks = [{ metric = "requests", min = 5, above = 1 }]', "a check is"),
        ("seconds = 60", "bake: unknown key(s) 'seconds'"),
    ],
)
def test_a_bad_bake_check_is_refused_naming_the_valid_metrics(
    tmp_path: Path, bake: str, message: str
) -> None:
    settings = _settings(
        tmp_path,
        '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001", "b:8001"]\n'
        f"[environments.p.bake]\n{bake}\n",
    )
    with pytest.raises(UsageError) as info:
        environment(settings, "p")
    assert message in info.value.message


def test_flat_keys_and_a_checks_list_together_are_refused(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001", "b:8001"]\nmax_failure_ratio = 0.1\n'
        '[environments.p.bake]\nchecks = [{ metric = "requests", min = 5 }]\n',
    )
    with pytest.raises(UsageError, match="max_failure_ratio and \\[bake\\] checks both set"):
        environment(settings, "p")


def test_every_check_of_the_list_is_judged_in_order_and_queue_time_has_a_floor() -> None:
    checks = (Check("requests", min=10), Check("queue_ratio", max=3.0), Check("failure_ratio", max=0.01))
    policy = Policy(checks=checks)
    old = metrics.Counters(100, 0, 100 * 500, queue_us=100 * 20)
    assert judge(old, metrics.Counters(100, 0, 100 * 500, queue_us=100 * 900), policy).ok  # < 3 ms: noise
    queued = judge(old, metrics.Counters(100, 0, 100 * 50_000, queue_us=100 * 40_000), policy)
    assert (queued.ok, queued.metric) == (False, "queue_ratio")
    assert "mean queue time 40000 us against 20 us" in queued.detail
    assert queued.detail.endswith("; queue_ratio <= 3")
    idle = judge(old, metrics.Counters(3, 1, 400), policy)
    assert (idle.ok, idle.metric) == (False, "requests")  # the first failing check in the list's order


def test_queue_and_compute_counters_are_read_from_triton_metrics() -> None:
    text = "\n".join(
        [
            'nv_inference_request_success{model="m",version="2"} 10',
            'nv_inference_request_duration_us{model="m",version="2"} 5000',
            'nv_inference_queue_duration_us{model="m",version="2"} 1200',
            'nv_inference_compute_infer_duration_us{model="m",version="2"} 3000',
        ]
    )
    counters = metrics.parse(text)[("m", "2")]
    assert (counters.mean_latency_us, counters.mean_queue_us, counters.mean_compute_us) == (500, 120, 300)
    later = metrics.parse(text.replace("1200", "900"))
    assert metrics.faults("m", {"2"}, metrics.parse(text), later) == [
        'nv_inference_queue_duration_us{model="m",version="2"} went down from 1200 to 900 '
        "(a counter reset: the replica restarted)"
    ]


# -- the bake's own requests (issue 35: pipelines/rollout/probes.py) --------------------------------


class Failing(FakeTarget):
    """Fails every 10th request to version 2 (as a python model's error responses would)."""

    calls = 0

    def infer(self, model: str, inputs: Any, outputs: list[str], version: str = "") -> dict[str, np.ndarray]:
        if version == "2":
            Failing.calls += 1
            if Failing.calls % 10 == 0:
                raise TritonError(f"{self.url}: {model} failed")
        return super().infer(model, inputs, outputs, version)


def test_the_bake_trips_on_its_own_requests_when_triton_counts_no_failure(tmp_path: Path) -> None:
    baked = {"done": False}

    def scrape(url: str) -> metrics.Snapshot:  # Triton's counters: not one failure, either side
        return _snapshot(200, 0, 200) if baked["done"] else _snapshot(0, 0, 0)  # probes included

    policy = Policy(waves=(100.0,), bake_seconds=5, probe_rate=20)
    rig = Rig(tmp_path, policy, scrape=scrape, sleep=lambda s: baked.update(done=True))
    targets = {u: Failing(u, ready=lambda *_: True) for u in URLS}
    rig.staged.probes = Probes(
        targets.__getitem__, 20, [Target("m", [{"X": np.ones((1, 4))}], ["Y"], "2", "1")]
    )
    error = rig.run_and_undo([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert "tripped on m v2 (probe_failure_ratio)" in error.message
    assert "mlreg's own requests failed 10 of 100 times on the new version (0.100)" in error.message
    assert "against 0 of 100 on the old" in error.message
    assert rig.report.ok
