"""Rollback surprises (issue 48 item 4): a rollback's bake when clients are quiet bakes on mlreg's
own probe requests, and its messages speak of the version it returns to; a version that arrived
as an ensemble's member is a way back.

The staged roll-out of pipelines/rollout/staged.py on tests/unit/staged_rig.py's rig: fake
replicas behind a real Fleet and undo log on a local store; the probes are the real ``Probes``
sending to those replicas, and the scrape counts what Triton would: the probes' requests (the
clients send none)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlreg.ops.rollback import rollback_target
from pipelines.core.policy import Policy
from pipelines.rollout.probes import Probes, Target
from pipelines.triton import metrics
from registry.errors import PromotionError
from tests.unit.staged_rig import CONFIG, OLD_CONFIG, URLS, Rig, _move
from tests.unit.worlds import MEMBER, World

RATE = 40.0  # probe requests a second to each side; the bake lasts 1 s: at most 40


def _quiet_rig(tmp_path: Path, *, returning: bool, probe_fails: bool = False) -> Rig:
    """A one-wave bake over the canary (r0) whose clients send nothing: Triton's counters after the
    bake are the probes' requests alone."""
    baked = {"done": False}
    rig: Rig

    def scrape(url: str) -> metrics.Snapshot:
        if not baked["done"] or rig.staged.probes is None:
            return {("m", "2"): metrics.Counters(), ("m", "1"): metrics.Counters()}
        new, old = rig.staged.probes.counted("m", "new"), rig.staged.probes.counted("m", "old")
        moved = url == URLS[0]
        sent = (new.ok + new.failed) if moved else 0
        kept = 0 if moved else (old.ok + old.failed) / (len(URLS) - 1)
        return {
            ("m", "2"): metrics.Counters(sent, 0, sent * 100),  # Triton counts a python error as success
            ("m", "1"): metrics.Counters(kept, 0, kept * 100),
        }

    policy = Policy(waves=(25.0, 100.0), bake_seconds=1, probe_rate=RATE)
    rig = Rig(tmp_path, policy, scrape=scrape, sleep=lambda s: baked.update(done=True))
    inputs = [{"IN": np.zeros((2,), np.float32)}]
    rig.staged.probes = Probes(rig.replicas.__getitem__, RATE, [Target("m", inputs, ["OUT"], "2", "1")])
    rig.staged.returning = returning
    if probe_fails:
        for replica in rig.replicas.values():
            replica.answer = _failing
    return rig


def _failing(model: str, version: str) -> float:
    """The version returned to (v2) answers errors; the one it leaves (v1) answers."""
    if version == "2":
        raise PromotionError(f"{model} v{version} answered an error")
    return 0.0


def test_a_promotion_with_quiet_clients_still_fails_min_requests(tmp_path: Path) -> None:
    rig = _quiet_rig(tmp_path, returning=False)
    error = rig.run_and_undo([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert "tripped on m v2 (requests)" in error.message  # clients only: a new version needs them
    assert "fix the model and register a new version" in (error.fix or "")


def test_a_rollback_with_quiet_clients_bakes_on_mlregs_own_probes(tmp_path: Path) -> None:
    rig = _quiet_rig(tmp_path, returning=True)
    rollouts = rig.staged.run([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert all(t.ok for r in rollouts for t in r.targets)
    assert {u for u, model, _ in rig.log if model == "m"} == set(URLS)  # every wave moved
    (verdict,) = rig.staged.verdicts
    assert verdict.ok
    assert verdict.new.requests >= 10  # min_requests met by the probes Triton counted
    assert verdict.new.probe_ok == verdict.new.requests
    assert verdict.new.probe_failed == 0
    (note,) = rig.staged.notes
    assert note.startswith("m v2: clients sent 0 request(s) during the bake; this rollback's bake judged")


def test_a_rollback_whose_probes_fail_speaks_of_the_version_it_returns_to(tmp_path: Path) -> None:
    rig = _quiet_rig(tmp_path, returning=True, probe_fails=True)
    error = rig.run_and_undo([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert "tripped on m v2, the version this rollback returns to (probe_failure_ratio)" in error.message
    assert "fix the model and register a new version" not in (error.fix or "")
    assert "mlreg rollback m --to-version N" in (error.fix or "")
    assert rig.report.ok  # the canary put back
    assert [c["version_policy"]["specific"]["versions"] for c in rig.replicas["r0:8001"].configs] == [
        ["2"],
        ["1"],
    ]


@pytest.mark.parametrize("returning", [False, True])
def test_clients_that_sent_enough_are_judged_alone(tmp_path: Path, returning: bool) -> None:
    """With client traffic a rollback's bake is a promotion's: the probes taken out of the counts."""
    rig = _quiet_rig(tmp_path, returning=returning)
    scrape = rig.staged.scrape

    def busy(url: str) -> metrics.Snapshot:
        found = scrape(url)
        if url == URLS[0] and found[("m", "2")].requests:
            found[("m", "2")] += metrics.Counters(50, 0, 5000)  # 50 client requests on top
        return found

    rig.staged.scrape = busy
    rig.staged.run([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    (verdict,) = rig.staged.verdicts
    assert verdict.new.requests == pytest.approx(50)
    assert rig.staged.notes == []


def test_a_member_that_arrived_through_its_ensemble_is_a_way_back(tmp_path: Path) -> None:
    """pre v1 arrived with ens v1 (no promotion of its own); pre v2 was then promoted directly:
    'mlreg rollback pre' returns to v1 (before: "no earlier promoted version")."""
    world = World(tmp_path)
    assert world.promote("ens", "1").ok  # brings pre v1 and net v1 along
    world.registry.add("pre", "2", MEMBER.format(name="pre", src="IN", dst="MID"))
    assert world.promote("pre", "2").ok
    assert world.registry.models.aliases("pre") == {"test": "2"}
    found = rollback_target(world.registry, "pre", world.env.name, world.env.alias)
    assert found.version == "1"
    assert found.serving == ("2",)


def test_a_failed_attempts_stamp_is_not_a_way_back(tmp_path: Path) -> None:
    """A stamp newer than the serving version's is a failed attempt's (record.repair_record)."""
    world = World(tmp_path)
    assert world.promote("ens", "1").ok
    world.registry.add("pre", "3", MEMBER.format(name="pre", src="IN", dst="MID"))
    world.registry.models.set_version_tag("pre", "3", "promoted_test", "2999-01-01T00:00:00.000000Z")
    found = rollback_target(world.registry, "pre", "test", "test")
    assert found.version is None
    assert found.serving == ("1",)


def test_a_staged_roll_out_tells_each_wave_and_bake_as_it_starts(tmp_path: Path) -> None:
    """Progress (issue 48 item 3): the roll-out tells the CLI's progress line each wave and bake;
    it tells nothing unless given a listener (--json and off a terminal the CLI gives none)."""
    rig = _quiet_rig(tmp_path, returning=True)
    told: list[str] = []
    rig.staged.tell = told.append
    rig.staged.run([_move("m", CONFIG, ["1", "2"], previous=OLD_CONFIG, baked_old=("1",))])
    assert told == [
        "wave 1 of 2 (1 replica(s))",
        "baking after wave 1 of 2 (1 s)",
        "wave 2 of 2 (3 replica(s))",
    ]


def test_a_promotion_tells_its_upload_as_it_goes(tmp_path: Path) -> None:
    """Progress (issue 48 item 3): the assemble stage tells the CLI's line each upload and the
    bytes sent so far; without a listener (--json, off a terminal) it tells nothing."""
    told: list[str] = []
    world = World(tmp_path)
    assert world.promote("ens", "1", on_start=told.append).ok
    uploads = [t for t in told if t.startswith("assemble: uploading")]
    for model in ("pre", "net"):
        assert f"assemble: uploading {model} v1" in uploads
        assert any(
            t.startswith(f"assemble: uploading {model} v1 (") and t.endswith("MB sent)") for t in uploads
        )
    assert told[0] == "resolve"  # the stages' own names still come first
