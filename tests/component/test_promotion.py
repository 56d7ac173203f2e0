"""The promotion runner on small in-memory fakes: the plan, the deploy order, the rollback order.

The registry and the serving targets are the fakes of the Protocols in pipelines/core/ports.py
(tests/fakes.py; the real ones are exercised by tests/integration/test_promote.py on a real Triton
and MLflow); the store is a real local folder.  A fake target "loads" a model by reading the
store's config, as Triton does, and every call is written to one shared event list (``Servers``,
the targets' handler, in tests/unit/worlds.py) so the order can be asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines.core.plan import Role, serving_versions
from pipelines.core.policy import Policy
from pipelines.core.reports import PromotionFailed
from pipelines.fleet.sender import Sender
from pipelines.promote.environments import Environment
from pipelines.storage import open_store
from registry.errors import StorageError, Terminated
from tests.unit.worlds import MEMBER, World


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def deployed(world: World) -> World:
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    world.fleet.locks_seen.clear()
    world.fleet.loads = 0
    return world


def test_the_plan_of_a_first_deployment_brings_the_members_first_and_changes_nothing(world: World) -> None:
    result = world.promote("ens", "1", dry_run=True)
    assert [(s.model, s.version, s.role) for s in result.plan.steps] == [
        ("pre", "1", Role.MEMBER),
        ("net", "1", Role.MEMBER),
        ("ens", "1", Role.MODEL),
    ]
    assert all(s.upload for s in result.plan.steps)
    assert result.plan.step("ens").is_ensemble
    assert not result.plan.step("pre").is_ensemble
    assert result.stage_names() == ["resolve", "validate", "preflight"]  # stops before the first live stage
    assert world.events == []
    assert sorted(p.name for p in world.store_root.iterdir()) == []  # no upload, no config, no lock


def test_the_first_deployment_loads_members_then_the_ensemble_canary_first_and_moves_aliases_last(
    world: World,
) -> None:
    result = world.promote("ens", "1")
    assert result.ok
    assert result.stage_names() == [
        "resolve",
        "validate",
        "preflight",
        "assemble",
        "deploy",
        "verify",
        "finalize",
        "record",
    ]
    assert world.loads() == [
        ("load", "t0:8001", "pre", ("1",)),
        ("load", "t1:8001", "pre", ("1",)),
        ("load", "t0:8001", "net", ("1",)),
        ("load", "t1:8001", "net", ("1",)),
        ("load", "t0:8001", "ens", ("1",)),
        ("load", "t1:8001", "ens", ("1",)),
    ]
    first_alias = next(i for i, e in enumerate(world.events) if e[0] == "alias")
    assert all(e[0] == "alias" for e in world.events[first_alias:])
    assert world.registry.alias_map == {"pre": {"test": "1"}, "net": {"test": "1"}, "ens": {"test": "1"}}
    assert world.registry.recorded[-1]["tags"]["result"] == "promoted"
    deploy = next(s for s in result.stages if s.stage == "deploy")
    assert [(r.model, [t.url for t in r.targets]) for r in deploy.report.rollouts] == [  # type: ignore[union-attr]
        ("pre", ["t0:8001", "t1:8001"]),
        ("net", ["t0:8001", "t1:8001"]),
        ("ens", ["t0:8001", "t1:8001"]),
    ]


def test_a_swap_keeps_the_old_version_until_the_new_one_serves_then_repoints_and_retires(
    deployed: World,
) -> None:
    world = deployed
    result = world.promote("net", "2")
    assert [(s.model, s.role) for s in result.plan.steps] == [("net", Role.MODEL), ("ens", Role.ENSEMBLE)]
    assert world.loads() == [
        ("load", "t0:8001", "net", ("1", "2")),  # both: v1 keeps serving while v2 loads
        ("load", "t1:8001", "net", ("1", "2")),
        ("load", "t0:8001", "ens", ("2",)),  # re-pointed to net v2: registered ens v2, in folder 2
        ("load", "t1:8001", "ens", ("2",)),
        ("load", "t0:8001", "net", ("2",)),  # finalize: v1 retired
        ("load", "t1:8001", "net", ("2",)),
    ]
    assert "model_version: 2" in (world.config("ens") or "")
    assert serving_versions(world.config("net")) == ["2"]
    finalize = next(s for s in result.stages if s.stage == "finalize")
    assert finalize.detail == "retired net v1"
    assert ("register", "ens", "2", (("net", "2"), ("pre", "1"))) in world.events
    assert world.registry.alias_map["ens"]["test"] == "2"
    assert world.registry.alias_map["net"]["test"] == "2"
    # the promotion held the locks of every model whose config it wrote, during every load
    assert all({"net", "ens"} <= held for held in world.fleet.locks_seen)
    assert world.fleet.store.session.read_lock("net") is None
    assert world.fleet.store.session.read_lock("ens") is None


def test_a_failure_after_the_repoint_restores_ensembles_first_then_members(deployed: World) -> None:
    world = deployed
    world.fleet.nan_answers.add(("net", "2"))  # verify fails after both configs changed
    ens_before, net_before = world.config("ens"), world.config("net")
    with pytest.raises(PromotionFailed, match="net/OUT answered non-finite values; every touched") as info:
        world.promote("net", "2")
    result = info.value.result
    assert result.stage_names() == [
        "resolve",
        "validate",
        "preflight",
        "assemble",
        "deploy",
        "verify",
        "rollback",
    ]
    assert result.rolled_back
    assert "non-finite" in result.error
    assert "rolled back, the previous versions serve" in info.value.message
    rollback_loads = world.loads()[4:]  # after deploy's four
    assert rollback_loads == [
        ("load", "t0:8001", "ens", ("1",)),  # follows the latest loaded net (-1) ...
        ("load", "t1:8001", "ens", ("1",)),
        ("load", "t0:8001", "net", ("1",)),  # ... while net goes back to v1
        ("load", "t1:8001", "net", ("1",)),
        ("load", "t0:8001", "ens", ("1",)),  # then pinned to net v1 again
        ("load", "t1:8001", "ens", ("1",)),
    ]
    assert [(url, pins["net"]) for url, _, pins in world.fleet.pins[-4:]] == [
        ("t0:8001", "-1"),
        ("t1:8001", "-1"),
        ("t0:8001", "1"),
        ("t1:8001", "1"),
    ]
    assert world.fleet.broken == []  # no ensemble ever pinned a member version that was gone
    assert world.config("ens") == ens_before
    assert world.config("net") == net_before
    assert world.fleet.store.versions.read_manifest("net", "2") is None  # the upload removed too
    assert world.registry.alias_map["net"]["test"] == "1"  # the alias did not move
    assert world.registry.recorded[-1]["tags"]["result"] == "rolled back"


def test_a_rerun_repairs_an_ensemble_left_on_other_pins_or_missing_on_a_target(deployed: World) -> None:
    world = deployed
    world.promote("net", "2")
    t0, t1 = world.fleet.targets["t0:8001"], world.fleet.targets["t1:8001"]
    t0.ensembles["ens"]["net"] = "-1"  # an interrupted staged roll-out left it following the latest
    t1.states.pop("ens")  # a replica restarted without it
    t1.ensembles.pop("ens")
    result = world.promote("net", "2")  # the version serves: only the ensemble is wrong
    assert result.stage_names()[0] != "noop"
    assert [(s.model, s.noop, s.reload) for s in result.plan.steps] == [
        ("net", True, False),
        ("ens", False, True),
    ]
    assert t0.ensembles["ens"]["net"] == "2"
    assert t1.is_ready("ens", "2")  # the re-pointed ensemble's own folder (one number)
    assert t1.ensembles["ens"]["net"] == "2"
    assert world.promote("net", "2").stage_names() == ["noop", "repair"]  # and now it is a no-op


def test_an_ensemble_version_whose_pins_differ_from_what_serves_is_no_noop(deployed: World) -> None:
    """A re-pointed ensemble keeps its store folder (1): promoting registered v1 again, whose pins
    are the old ones, must bring its members back -- not say "already serves"."""
    world = deployed
    world.promote("net", "2")  # ens re-pointed to net v2, registered as ens v2, stored as folder 1
    assert ("register", "ens", "2", (("net", "2"), ("pre", "1"))) in world.events
    result = world.promote("ens", "1")
    assert result.stage_names()[0] != "noop"
    assert serving_versions(world.config("net")) == ["1"]
    assert "model_version: 1" in (world.config("ens") or "").split('model_name: "net"')[1][:40]
    for target in world.fleet.targets.values():
        assert target.ensembles["ens"]["net"] == "1"
        assert target.is_ready("net", "1")
    assert world.promote("ens", "1").stage_names() == ["noop", "repair"]


def _tamper(world: World, model: str, version: str) -> Path:
    """Same size, other bytes: what a bad disk or a hand edit leaves in the store."""
    path = world.store_root / model / version / "model.py"
    text = path.read_text()
    path.write_text(text.replace("# version", "#-version"))
    assert path.stat().st_size == len(text.encode())
    return path


def test_a_corrupt_previous_version_is_restored_from_the_registry_before_the_rollback_loads_it(
    deployed: World,
) -> None:
    world = deployed
    path = _tamper(world, "net", "1")
    world.fleet.nan_answers.add(("net", "2"))  # verify fails: the rollback loads net v1 again
    with pytest.raises(PromotionFailed, match="rolled back, the previous versions serve") as info:
        world.promote("net", "2")
    validate = next(s for s in info.value.result.stages if s.stage == "validate")
    assert "net/1 (corrupt: restored by assemble)" in validate.detail
    assemble = next(s for s in info.value.result.stages if s.stage == "assemble")
    assert "net/1 restored from the registry" in str(assemble.report)
    assert "#-version" not in path.read_text()  # the registered bytes are back
    world.fleet.store.versions.verify_version(
        "net", "1", world.registry.tags[("net", "1")]["artifact_digest"]
    )
    assert serving_versions(world.config("net")) == ["1"]


def test_a_version_corrupt_in_the_store_and_the_registry_is_refused_before_any_change(
    deployed: World,
) -> None:
    world = deployed
    world.promote("net", "2")
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "3")
    world.promote("net", "2")  # net/2 is in the store, not serving: promoting it loads the stored bytes
    _tamper(world, "net", "2")
    registered = world.registry.root / "net" / "2" / "model" / "model.py"
    registered.write_text(registered.read_text() + "# lost\n")
    world.promote("net", "3", no_way_back=True)  # net/2 is its way back: told to go on without one
    world.events.clear()
    with pytest.raises(
        PromotionFailed, match="(?s)net v2 in .* does not verify .*registry's copy does not match"
    ):
        world.promote("net", "2")
    assert world.loads() == []


def test_a_way_back_that_cannot_be_verified_refuses_the_promotion_unless_told_no_way_back(
    deployed: World,
) -> None:
    """The serving version's bytes are bad in the store and in the registry: promoting a new version
    is refused before any change (an abort could not load it again), naming the fix; with
    ``no_way_back`` it goes ahead (validate says so)."""
    world = deployed
    _tamper(world, "net", "1")
    registered = world.registry.root / "net" / "1" / "model" / "model.py"
    registered.write_text(registered.read_text() + "# lost\n")
    with pytest.raises(PromotionFailed, match="net v1, the version an abort would load again") as info:
        world.promote("net", "2")
    assert "--no-way-back" in (info.value.fix or "")
    assert "nothing was changed" in info.value.message
    assert world.loads() == []
    assert serving_versions(world.config("net")) == ["1"]
    result = world.promote("net", "2", no_way_back=True)
    validate = next(s for s in result.stages if s.stage == "validate")
    assert "net/1 (unverified: an abort would leave it as it serves)" in validate.detail
    assert serving_versions(world.config("net")) == ["2"]


def test_the_rollback_never_loads_a_version_that_stopped_verifying(deployed: World) -> None:
    """Corrupted after validate (during the deploy): the undo log leaves net on what it serves and
    says so -- it never loads the bad bytes."""
    world = deployed
    world.fleet.nan_answers.add(("net", "2"))
    target = world.fleet.connect("t1:8001")
    load = target.load

    def corrupting(model: str, config: str | None = None, files: Any = None) -> None:
        load(model, config, files)
        if model == "ens":
            _tamper(world, "net", "1")

    target.load = corrupting  # type: ignore[method-assign]
    with pytest.raises(PromotionFailed, match=r"the rollback failed too: net v1 does not verify") as info:
        world.promote("net", "2")
    target.load = load  # type: ignore[method-assign]
    assert "net left as it serves now (t0:8001, t1:8001)" in info.value.message
    assert [e for e in world.loads() if e[2] == "net" and e[3] == ("1",)] == []  # v1 never loaded
    for t in world.fleet.targets.values():
        assert t.is_ready("net", "2")  # left on what serves
    assert world.fleet.broken == []  # the ensemble follows what is loaded


def _state(world: World) -> dict[str, Any]:
    return {
        "configs": {m: world.config(m) for m in ("pre", "net", "ens")},
        "serving": {url: t.model_states() for url, t in world.fleet.targets.items()},
        "pins": {url: dict(t.ensembles) for url, t in world.fleet.targets.items()},
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens")},
        "net v2 stored": world.fleet.store.versions.read_manifest("net", "2") is not None,
    }


# the member swap on two targets makes 6 loads: net v1+v2, ens re-pointed, net v2 alone (each x2)
@pytest.mark.parametrize("failing_load", [1, 2, 3, 4, 5, 6])
def test_a_failed_load_at_any_point_puts_everything_back(deployed: World, failing_load: int) -> None:
    world = deployed
    before = _state(world)
    world.fleet.fail_at_load = failing_load
    with pytest.raises(PromotionFailed, match=f"failed to load \\(load {failing_load}\\)"):
        world.promote("net", "2")
    assert _state(world) == before
    assert world.fleet.broken == []


@pytest.mark.parametrize(("stage", "after"), [("assemble", True), ("verify", True), ("record", False)])
def test_a_failure_of_any_live_stage_puts_everything_back(
    deployed: World, stage: str, after: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage itself fails, after its work or (record: MLflow gone) before it -- a fault the
    fakes cannot provoke otherwise, so the stage is wrapped on purpose."""
    from pipelines.promote import runner

    world = deployed
    before = _state(world)
    work = getattr(runner, stage)

    def failing(ctx: Any) -> Any:
        if after:
            work(ctx)
        raise StorageError(f"{stage} broke")

    monkeypatch.setattr(runner, stage, failing)
    with pytest.raises(PromotionFailed, match=f"{stage} broke"):
        world.promote("net", "2")
    assert _state(world) == before
    assert world.fleet.broken == []


def test_an_interrupt_during_the_deploy_puts_everything_back(deployed: World) -> None:
    world = deployed
    before = _state(world)
    target = world.fleet.connect("t1:8001")
    load = target.load

    interrupts = [KeyboardInterrupt()]

    def interrupted(model: str, config: str | None = None, files: Any = None) -> None:
        load(model, config, files)
        if model == "ens" and interrupts:
            raise interrupts.pop()  # Ctrl-C right after the re-point on the last target

    target.load = interrupted  # type: ignore[method-assign]
    with pytest.raises(PromotionFailed, match=r"interrupted \(SIGINT\); .*rolled back") as info:
        world.promote("net", "2")
    assert info.value.exit_code == 130
    target.load = load  # type: ignore[method-assign]
    assert _state(world) == before
    assert world.fleet.broken == []


def test_a_failing_canary_stops_the_rollout_before_the_other_targets(deployed: World) -> None:
    world = deployed
    world.fleet.fail_load.add(("net", "2", "t0:8001"))
    with pytest.raises(PromotionFailed, match="t0:8001: model 'net' version 2 failed to load"):
        world.promote("net", "2")
    assert ("load", "t0:8001", "net", ("1", "2")) in world.events  # the canary was asked to load ...
    assert [e for e in world.events if "t1:8001" in e] == []  # ... the other target nothing at all
    assert serving_versions(world.config("net")) == ["1"]


def test_the_broken_pins_detector_fires_on_an_ensemble_pinned_to_a_member_not_ready(deployed: World) -> None:
    """The other side of every ``broken == []`` here: a member unloaded from under its ensemble."""
    world = deployed
    assert world.fleet.broken == []
    world.fleet.connect("t0:8001").unload("net")
    assert world.fleet.broken == ["t0:8001: ens pins net v1, READY []"]


def test_a_failure_inside_the_rollback_is_recorded_and_reported(deployed: World) -> None:
    world = deployed
    world.fleet.nan_answers.add(("net", "2"))
    world.fleet.fail_load.add(("net", "1", "t1:8001"))  # the restore of net v1 fails on t1
    with pytest.raises(
        PromotionFailed, match="the rollback failed too: t1:8001: model 'net' version 1"
    ) as info:
        world.promote("net", "2")
    assert info.value.result.rollback_error
    assert not info.value.result.rolled_back
    assert world.registry.recorded[-1]["tags"]["result"] == "rollback failed"
    assert "run 'mlreg status'" in (info.value.fix or "")


def test_the_noop_asks_every_target_about_every_member(deployed: World) -> None:
    world = deployed
    assert world.promote("ens", "1").stage_names() == ["noop", "repair"]
    assert world.loads() == []
    world.fleet.targets["t1:8001"].states.pop("net")  # t1 restarted and lost a member
    result = world.promote("ens", "1")
    assert "noop" not in result.stage_names()
    assert [(s.model, s.reload) for s in result.plan.steps] == [("net", True), ("ens", False)]
    assert ("load", "t1:8001", "net", ("1",)) in world.loads()
    assert world.fleet.targets["t1:8001"].is_ready("net", "1")


def test_a_held_lock_of_a_repointed_ensemble_refuses_the_promotion_before_any_change(deployed: World) -> None:
    world = deployed
    with world.fleet.store.session.lock("ens", owner="other-job@elsewhere:1"):
        with pytest.raises(StorageError, match="model 'ens' is locked by other-job@elsewhere:1"):
            world.promote("net", "2")
    assert world.events == []
    assert serving_versions(world.config("net")) == ["1"]


def test_a_version_that_failed_validation_is_refused_at_resolve(deployed: World) -> None:
    world = deployed
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"), validation="failed")
    with pytest.raises(Exception, match="net version 3 failed validation when it was registered"):
        world.promote("net", "3")
    assert world.events == []


def test_a_repointed_ensemble_that_does_not_validate_stops_the_promotion_before_any_change(
    deployed: World,
) -> None:
    world = deployed
    store = world.fleet.store
    broken = (world.config("ens") or "") + "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    store.session.write_config("ens", broken)  # edited by hand in the store: the re-pointed copy keeps it
    with pytest.raises(PromotionFailed, match="(?s)re-pointed ens: .*instance group.*nothing was changed"):
        world.promote("net", "2")
    assert world.events == []  # no load, no registration, no alias
    assert world.config("ens") == broken
    assert serving_versions(world.config("net")) == ["1"]
    assert store.versions.read_manifest("net", "2") is None


def test_status_counts_a_stopped_local_stack_and_a_missing_folder_as_drift(world: World) -> None:
    from mlreg.ops.status import model_status
    from pipelines.core.plan import desired_config
    from pipelines.promote.environments import local_environment

    env = local_environment(world.settings)
    store = open_store(env.store)
    store.session.write_config(
        "net", desired_config(MEMBER.format(name="net", src="MID", dst="OUT"), ["1"], gpu=False)
    )
    [row] = model_status(world.settings, env, world.registry, ["net"])
    assert row["desired"] == ["1"]
    assert row["serving"] == {"local stack": row["serving"]["local stack"]}
    assert row["drift"] == [
        "the store has no folder net/1/ for the version its config serves",
        "local stack unreachable: the local stack is not running, so environment 'local' has no Triton",
    ]


# -- the undo log owns every change: signals in record, the before-state, the fleet asked once ----


def _tags(world: World) -> dict[tuple[str, str], dict[str, str]]:
    return {key: dict(value) for key, value in world.registry.tags.items()}


@pytest.mark.parametrize(
    ("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129), ("SIGQUIT", 131)]
)
@pytest.mark.parametrize("moved", ["net", "ens"])
def test_a_signal_right_after_an_alias_moved_puts_back_aliases_tags_and_servers(
    deployed: World, signal_name: str, code: int, moved: str
) -> None:
    """The signal arrives the moment the record stage moved an alias (the member's, or the
    ensemble's after it): every alias and tag is as before, and so is everything else."""
    world = deployed
    before, tags = _state(world), _tags(world)
    set_alias = world.registry.set_alias
    signals = [signal_name]  # one signal; the put-back's own alias writes go through
    at_signal: dict[str, str] = {}

    def then_signalled(name: str, alias: str, version: str) -> None:
        set_alias(name, alias, version)
        if name == moved and signals:
            signals.pop()
            at_signal.update(world.registry.models.aliases(name))  # what the registry held at the signal
            raise KeyboardInterrupt() if signal_name == "SIGINT" else Terminated(signal_name)

    world.registry.set_alias = then_signalled  # type: ignore[method-assign]
    with pytest.raises(PromotionFailed, match=rf"interrupted \({signal_name}\); .*rolled back") as info:
        world.promote("net", "2")
    world.registry.set_alias = set_alias  # type: ignore[method-assign]
    assert info.value.exit_code == code
    assert signals == []  # the signal came, right after the alias moved
    assert at_signal["test"] != before["aliases"][moved]["test"], at_signal  # it had moved
    assert f"alias 'test' of {moved} (moved to v{at_signal['test']}" in info.value.message  # put back
    assert _state(world) == before  # servers, the store's configs, every alias
    after = _tags(world)
    assert {k: after[k] for k in tags} == tags  # every tag of every version as before
    registered = {k: v for k, v in after.items() if k not in tags}  # the re-pointed ensemble's record
    assert [k for k, v in registered.items() if "promoted_test" in v] == []  # carries no promotion
    assert world.fleet.broken == []


def test_a_staged_rollback_never_unloads_what_a_replica_served_before(tmp_path: Path) -> None:
    """Item 5: the before-state is taken at the first touch, whoever moves the replica: a model new
    to the store that a replica already served is left loaded there, and only there."""
    world = World(tmp_path)
    world.env = Environment(
        "test", str(world.store_root), ("t0:8001", "t1:8001"), "test", gpu=False, policy=Policy(canary=1)
    )
    world.fleet.connect("t0:8001").states["net"] = {"1": "READY"}  # served before, not from this store
    world.fleet.fail_load.add(("net", "1", "t1:8001"))  # the second wave fails
    with pytest.raises(PromotionFailed, match="wave 2 of 2 failed") as info:
        world.promote("net", "1")
    assert ("unload", "t0:8001", "net") not in world.events  # served before: never unloaded
    assert world.fleet.targets["t0:8001"].is_ready("net", "1")
    assert ("unload", "t1:8001", "net") in world.events  # new there: unloaded
    assert "net left as it served at t0:8001 (v1, not from this store)" in info.value.message


def test_a_plain_swap_asks_each_target_what_it_holds_twice_resolve_and_verify(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7: one view per promotion, taken under the locks and kept up to date by the moves;
    only verify asks again (and the retire's wait loop, which waits for Triton's async unload)."""
    world = deployed
    asked: dict[str, int] = {}
    for url in ("t0:8001", "t1:8001"):
        target = world.fleet.connect(url)
        states = target.model_states

        def counted(url: str = url, states: Any = states) -> dict[str, dict[str, str]]:
            asked[url] = asked.get(url, 0) + 1
            return states()  # type: ignore[no-any-return]

        target.model_states = counted  # type: ignore[method-assign]
    waits: list[str] = []
    unloaded = Sender._unloaded

    def waited(self: Sender, target: Any, model: str, versions: tuple[str, ...]) -> bool:
        waits.append(target.url)
        return unloaded(self, target, model, versions)

    monkeypatch.setattr(Sender, "_unloaded", waited)
    assert world.promote("net", "2").ok
    assert waits  # the retire waited on each target: one poll each (the fake unloads at once)
    for url in ("t0:8001", "t1:8001"):
        assert asked[url] - waits.count(url) <= 2, (url, asked, waits)


def test_every_model_a_promotion_moves_carries_its_deployment_tags_and_an_exit_puts_them_back(
    world: World,
) -> None:
    """Item 11: the members brought along and the ensemble get ``serving_<env>`` and
    ``promotion_run_<env>`` as the model does; an interrupt while they are written puts every tag
    back (noted before each write)."""
    result = world.promote("ens", "1")
    for model in ("pre", "net", "ens"):
        tags = world.registry.tags[(model, "1")]
        assert tags["serving_test"] == "t0:8001,t1:8001", model
        assert tags["promotion_run_test"] == result.run_id, model
        assert "promoted_test" in tags, model
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    before, tags = _state(world), _tags(world)
    record = world.registry.deployed.record_deployment
    calls: list[str] = []

    def interrupted(model: str, *args: Any) -> None:
        calls.append(model)
        record(model, *args)
        if len(calls) == 2:  # the second model's deployment tags written: Ctrl-C
            raise KeyboardInterrupt()

    world.registry.deployed.record_deployment = interrupted  # type: ignore[method-assign]
    with pytest.raises(PromotionFailed, match=r"interrupted \(SIGINT\)"):
        world.promote("net", "2")
    assert calls == ["net", "ens"]
    assert _state(world) == before
    after = _tags(world)
    assert {k: after[k] for k in tags} == tags
