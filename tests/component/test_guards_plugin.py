"""Issue 47's claim, proven: a new load guard or a check's step after ``record`` plugs into the
promotion engine by one registration (``pipelines/promote/registered.py``'s ``GUARDS`` / ``CHECKS``)
with no engine edit.

The guard and the check below are this file's own (nothing in the product names them); each is
registered the way a new module's one line would register it (``GUARDS``/``CHECKS`` extended, here
by monkeypatch), and the unit world of tests/unit/worlds.py runs a real promotion (the real runner,
fleet and undo log, a real local store, fake Tritons that write every load to one event list).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.changes import Change
from pipelines.core.check import AfterStep, LoadRefused, Phase, Place, Trial, Verdict
from pipelines.core.plan import serving_versions
from pipelines.core.policy import Policy
from pipelines.core.reports import PromotionFailed
from pipelines.promote import registered
from registry.errors import MlregError
from tests.unit.worlds import MEMBER, World

T0, T1 = "t0:8001", "t1:8001"
ROOT = Path(__file__).resolve().parents[2]
ENGINE = ("pipelines/promote", "pipelines/rollout", "pipelines/fleet", "pipelines/core")
# the feature modules the engine reaches only through registered.py (the guards, and the checks whose
# runtime part the runner used to wire by hand)
PLUGGED = ("pipelines.guards", "pipelines.checks.shadow")


@dataclass
class SpyLoadGuard:
    """The runtime part: every question and every answer written down; refuses the loads
    ``refuse`` names ((url, model)) before anything is sent."""

    refuse: set[tuple[str, str]] = field(default_factory=set)
    asked: list[tuple[str, str]] = field(default_factory=list)
    told: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=lambda: ["spy: one note of where it could not check"])

    def before_load(self, url: str, change: Change) -> None:
        self.asked.append((url, change.model))
        if (url, change.model) in self.refuse:
            raise LoadRefused(
                f"{url}: the spy guard refuses {change.model}", fix="nothing to fix", model=change.model
            )

    def after_load(self, url: str, change: Change, error: MlregError | None) -> str:
        self.told.append((url, change.model, "" if error is None else error.message))
        return ""


@dataclass
class SpyGuard:
    """A new load guard as its own module would define it (``Guard``: pipelines/core/check.py)."""

    part: SpyLoadGuard
    built_for: list[str] = field(default_factory=list)
    name: str = "spy"
    field: str = ""
    owns: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> None:
        return None

    def load_guard(self, ctx: Any) -> SpyLoadGuard:
        self.built_for.append(f"{ctx.plan.model} v{ctx.plan.version}")
        return self.part


@dataclass
class SpyCheck:
    """A new check that offers a step after ``record`` (judging nothing: no gate runs it)."""

    run: Callable[[Callable[[str], None]], list[str]]
    name: str = "spycheck"
    phase: Phase = "gate"
    where: frozenset[str] = frozenset()
    owns: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> None:
        return None

    def judge(self, trial: Trial) -> list[Verdict]:
        return []

    def after_record(self, ctx: Any) -> AfterStep:
        return AfterStep("spy arming", self.run)


@pytest.fixture
def deployed(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def with_guard(monkeypatch: pytest.MonkeyPatch, part: SpyLoadGuard) -> SpyGuard:
    guard = SpyGuard(part)
    monkeypatch.setattr(registered, "GUARDS", (*registered.GUARDS, guard))  # its one registration line
    return guard


def test_a_new_load_guard_is_asked_before_and_told_after_every_load_with_no_engine_edit(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, part = deployed, SpyLoadGuard()
    guard = with_guard(monkeypatch, part)
    result = world.promote("net", "2")
    assert result.ok
    assert guard.built_for == ["net v2"]  # its part built once, for this promotion
    loads = [(url, model) for _, url, model, _ in world.loads()]
    assert len(loads) == 6  # net on both, the re-pointed ens on both, net's v1 retired on both
    assert part.asked == loads  # before each load, in the order they were sent
    assert part.told == [(*load, "") for load in loads]  # and told each went well
    assert result.headroom is not None  # the registered guards before it still run: headroom first
    assert "spy: one note of where it could not check" in result.notes  # its notes reach the result
    assert serving_versions(world.config("net")) == ["2"]


def test_a_new_load_guard_refuses_a_load_before_anything_is_sent_and_everything_is_put_back(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, part = deployed, SpyLoadGuard(refuse={(T1, "net")})
    with_guard(monkeypatch, part)
    net_before, ens_before = world.config("net"), world.config("ens")
    with pytest.raises(PromotionFailed, match=f"{T1}: the spy guard refuses net") as info:
        world.promote("net", "2")
    result = info.value.result
    assert result.failed_stage == "deploy"
    sent = [(url, model, versions) for _, url, model, versions in world.loads()]
    assert (T1, "net", ("1", "2")) not in sent  # refused: nothing was sent to T1
    assert sent[0] == (T0, "net", ("1", "2"))  # the canary got it, and was put back
    assert (T1, "net") in part.asked  # asked, and it refused
    assert world.config("net") == net_before
    assert world.config("ens") == ens_before
    assert world.registry.alias_map["net"]["test"] == "1"
    assert world.fleet.connect(T0).model_states()["net"] == {"1": "READY"}


def test_under_a_fleet_policy_a_replica_a_new_guard_refuses_is_left_out_within_max_unavailable(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its refusal is a ``LoadRefused``: a staged roll-out leaves that replica out as it serves
    (as it does for the headroom guard's), with no roll-out edit."""
    world, part = deployed, SpyLoadGuard(refuse={(T1, "net")})
    with_guard(monkeypatch, part)
    world.env = replace(world.env, policy=Policy(canary=1, max_unavailable=1))
    t1 = world.fleet.connect(T1).model_states()
    result = world.promote("net", "2")
    assert result.ok
    assert {e[2] for e in world.loads() if e[1] == T1} <= {"ens"}  # net never loaded there
    assert world.fleet.connect(T1).model_states() == t1
    assert world.fleet.connect(T0).model_states()["net"] == {"2": "READY"}
    assert list(result.to_dict()["plan"]["skipped"]) == [T1]
    assert world.registry.alias_map["net"]["test"] == "2"


def test_a_new_checks_step_after_record_runs_once_the_promotion_happened(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, ran = deployed, list[str]()

    def run(progress: Callable[[str], None]) -> list[str]:
        progress(T0)
        ran.append(world.registry.alias_map["net"]["test"])  # the alias had moved: after record
        return ["spy armed"]

    monkeypatch.setattr(registered, "CHECKS", (*registered.CHECKS, SpyCheck(run)))  # one line
    result = world.promote("net", "2")
    assert ran == ["2"]
    assert "spy armed" in result.notes
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "3", dry_run=True)
    assert ran == ["2"]  # a dry run promotes nothing: nothing after record


def test_a_checks_step_after_record_that_fails_is_a_note_never_a_failed_promotion(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(progress: Callable[[str], None]) -> list[str]:
        progress(T1)
        raise RuntimeError("boom")

    monkeypatch.setattr(registered, "CHECKS", (*registered.CHECKS, SpyCheck(run)))
    result = deployed.promote("net", "2")
    assert result.ok
    assert f"promoted; spy arming failed on {T1}: RuntimeError: boom" in result.notes
    assert deployed.registry.alias_map["net"]["test"] == "2"


def feature_imports(sources: Mapping[str, str]) -> list[str]:
    """``path: module`` for each import of a ``PLUGGED`` feature in ``sources`` (path -> text)."""
    found = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path}: {n}" for n in names if any(n == p or n.startswith(p + ".") for p in PLUGGED)]
    return found


def test_the_engine_names_no_guard_and_no_after_record_check_outside_the_registration() -> None:
    sources = {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for folder in ENGINE
        for p in sorted((ROOT / folder).rglob("*.py"))
    }
    assert "pipelines/promote/runner.py" in sources
    found = feature_imports(sources)
    assert {line.split(":")[0] for line in found} == {"pipelines/promote/registered.py"}, found
    # positive control: the scan sees each way of naming one
    planted = {
        "a.py": "from pipelines.guards.headroom import REFUSED\n",
        "b.py": "from pipelines.guards import headroom\n",
        "c.py": "def f():\n    import pipelines.checks.shadow\n",
        "d.py": "from pipelines.checks import golden, shadow\n",
    }
    assert feature_imports(planted) == [
        "a.py: pipelines.guards.headroom",
        "a.py: pipelines.guards.headroom.REFUSED",
        "b.py: pipelines.guards",
        "b.py: pipelines.guards.headroom",
        "c.py: pipelines.checks.shadow",
        "d.py: pipelines.checks.shadow",
    ]


@dataclass
class NoncedCheck(SpyCheck):
    """A check that tells this promotion's own requests apart (``OwnRequests``)."""

    told: list[str] = field(default_factory=list)
    seen: list[Any] = field(default_factory=list)

    def own_requests(self, setting: Any, prefix: str) -> Any:
        self.told.append(prefix)
        return (setting, prefix)

    def after_record(self, ctx: Any) -> AfterStep:
        self.seen.append(ctx.env.setting(self.name))  # what the promotion ran with
        return AfterStep("nonced", self.run)


def test_a_new_check_that_leaves_its_own_requests_out_is_told_each_promotions_secret_prefix(
    deployed: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = NoncedCheck(lambda progress: [], name="nonced")
    monkeypatch.setattr(registered, "CHECKS", (*registered.CHECKS, check))
    world = deployed
    world.env = replace(world.env, checks=(("nonced", "its settings"),))
    world.promote("net", "2")
    [prefix] = check.told
    assert prefix.startswith("mlreg-")
    assert len(prefix) > len("mlreg-") + 16  # the secret
    assert check.seen == [("its settings", prefix)]  # the promotion ran with the told settings
    assert world.env.setting("nonced") == "its settings"  # the environment itself is left as it is
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "3")
    assert len(check.told) == 2
    assert check.told[1] != prefix  # a new secret for each promotion


def test_the_shadow_checks_settings_are_told_the_prefix_its_replay_leaves_out(tmp_path: Path) -> None:
    from pipelines.checks.capture import Shadow

    env = World(tmp_path).env
    assert registered.own_requests(env, "mlreg-secret-") == env  # no [shadow] table: nothing to tell
    told = registered.own_requests(replace(env, shadow=Shadow(captures=str(tmp_path))), "mlreg-secret-")
    assert told.shadow.own == "mlreg-secret-"
