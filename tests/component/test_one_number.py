"""One number (issue 48, item 5): a refused or aborted promotion leaves MLflow as it was.

A member's promotion registers each re-pointed ensemble in ``deploy`` (pipelines/promote/stages.py
``number_repointed``): after the preflight and the quality gate, so a refusal never writes MLflow,
and before anything loads the ensemble.  An exit after that deletes the versions this promotion
registered through the undo log (pipelines/core/undo.py, step 7), each once proven its own: its
``OWNER_TAG`` names this promotion's id (set in the call that created it), no alias names it and
nothing serves it.  A version registered by anyone else -- the same config included -- is never
deleted.

The world of tests/unit/worlds.py: a real local store, two fake Tritons recording every load, the
registry port's fake (tests/fakes.py: versions as folders, tags and aliases in memory).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.context import Options
from pipelines.core.plan import desired_config, ensemble_pins, serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.core.undo import OWNER_TAG, UndoLog
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from registry.errors import TritonError
from tests.fakes import FakeRegistry
from tests.unit.worlds import ENSEMBLE, MEMBER, World


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _mlflow(registry: FakeRegistry) -> dict[str, Any]:
    """Every registered version with its tags and its files, every alias."""
    return {
        "versions": {k: dict(v) for k, v in sorted(registry.tags.items())},
        "files": _files(registry.root),
        "aliases": {m: dict(a) for m, a in sorted(registry.alias_map.items())},
    }


def _state(world: World) -> dict[str, Any]:
    """MLflow's versions, tags and aliases, the store byte for byte, what each replica holds."""
    return {
        "mlflow": _mlflow(world.registry),
        "store": _files(world.store_root),
        "serving": {url: t.model_states() for url, t in sorted(world.fleet.targets.items())},
        "pins": {url: dict(t.ensembles) for url, t in sorted(world.fleet.targets.items())},
    }


def _moved_once(tmp_path: Path) -> World:
    """ens v1 promoted, then net v2 (a member move: ens re-pointed, registered as ens v2, served
    from folder 2); net v3 registered."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")
    assert (
        serving_versions(world.config("ens") or "") == ["2"] == [world.registry.models.aliases("ens")["test"]]
    )
    return world


def _registrations(world: World) -> list[tuple[Any, ...]]:
    return [e for e in world.events if e[0] in ("register", "delete")]


def test_a_quality_gate_refusal_after_a_member_move_leaves_mlflow_and_the_store_as_they_were(
    tmp_path: Path,
) -> None:
    """net v3 answers NaN on the canary: the gate refuses.  MLflow's versions, tags and aliases,
    the store and the replicas are as before; nothing was registered (the re-pointed ens is
    registered only after the gate), so nothing had to be deleted."""
    world = _moved_once(tmp_path)
    world.fleet.nan_answers.add(("net", "3"))
    before, registrations = _state(world), _registrations(world)

    gated = Promotion(world.settings, world.env, world.registry, Options(), connect=world.fleet.connect)
    with pytest.raises(PromotionFailed) as refused:
        gated.run("net", "3")  # the quality gate on the canary (the world's promote skips it)

    result = refused.value.result
    assert result.failed_stage == "quality"
    assert "deploy" not in result.stage_names()
    after = _state(world)
    assert after["mlflow"] == before["mlflow"]
    assert after["store"] == before["store"]
    assert _registrations(world) == registrations  # nothing registered, nothing deleted
    assert world.registry.deleted == {}  # not even MLflow's counter moved
    # the canary loaded net v3 beside v2 and took it back: v2 serves everywhere, ens as it was
    for url, states in after["serving"].items():
        assert [v for v, s in states["net"].items() if s == "READY"] == ["2"], url
        assert states["ens"] == before["serving"][url]["ens"], url
    assert after["pins"] == before["pins"]


def test_an_abort_after_the_ensemble_was_registered_deletes_exactly_that_version(tmp_path: Path) -> None:
    """net v3 fails verify's smoke test after the roll-out: the promotion goes back.  The ens
    version it registered for the re-pointed config (v3, tagged with its id) is deleted, with its
    files; every other version, tag and alias of MLflow, and the store, are as before; the
    sentence says so."""
    world = _moved_once(tmp_path)
    world.fleet.nan_answers.add(("net", "3"))
    before, registrations = _state(world), _registrations(world)

    with pytest.raises(PromotionFailed) as aborted:
        world.promote("net", "3")

    result = aborted.value.result
    assert result.failed_stage == "verify"
    assert result.rolled_back
    made = [e for e in _registrations(world)[len(registrations) :] if e[0] == "register"]
    assert [(e[1], e[2]) for e in made] == [("ens", "3")]  # registered before its first load...
    assert _registrations(world)[len(registrations) + 1 :] == [("delete", "ens", "3")]  # ...then deleted
    assert _state(world)["mlflow"] == before["mlflow"]
    assert _state(world)["store"] == before["store"]
    assert "ens v3 (registered by this promotion) deleted" in str(aborted.value)
    # MLflow's counter moved (a deleted number is never given again): the next ens version is 4
    world.fleet.nan_answers.clear()
    world.promote("net", "3")
    assert world.registry.models.aliases("ens")["test"] == "4"
    assert serving_versions(world.config("ens") or "") == ["4"]


def test_an_abort_deletes_the_model_its_registration_created_and_nothing_else(tmp_path: Path) -> None:
    """ens serves from the store but MLflow does not know it (a hand-written ensemble): net v2's
    promotion registers the re-pointed ens, creating the model.  Its abort deletes that version,
    then the model, now with no version and no alias; MLflow is as it was, the store too."""
    world = World(tmp_path)
    world.promote("ens", "1")
    del world.registry.tags[("ens", "1")]  # MLflow knows no ens: only the store does
    world.registry.alias_map.pop("ens")
    shutil.rmtree(world.registry.root / "ens")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.fleet.nan_answers.add(("net", "2"))
    before, registrations = _state(world), _registrations(world)

    with pytest.raises(PromotionFailed) as aborted:
        world.promote("net", "2")

    assert [e[:3] for e in _registrations(world)[len(registrations) :]] == [
        ("register", "ens", "1"),
        ("delete", "ens", "1"),
    ]
    assert ("delete_model", "ens") in world.events
    assert _state(world)["mlflow"] == before["mlflow"]
    assert _state(world)["store"] == before["store"]
    assert "model ens (registered by this promotion) deleted" in str(aborted.value)


def test_a_model_that_existed_before_is_never_deleted(tmp_path: Path) -> None:
    """The same abort where MLflow had the model ens already, with no version and no alias (made by
    someone else): the version the promotion made goes, the model stays."""
    world = World(tmp_path)
    world.promote("ens", "1")
    del world.registry.tags[("ens", "1")]
    world.registry.alias_map["ens"] = {}  # a registered model with no version and no alias
    shutil.rmtree(world.registry.root / "ens")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.fleet.nan_answers.add(("net", "2"))

    with pytest.raises(PromotionFailed) as aborted:
        world.promote("net", "2")

    assert ("delete", "ens", "1") in world.events
    assert all(e[0] != "delete_model" for e in world.events)
    assert world.registry.alias_map["ens"] == {}  # the model is there still
    assert "model ens" not in str(aborted.value)


class SameBytesRegistry(FakeRegistry):
    """MLflow's reuse of identical bytes (register.py ``_registered_already``): a config equal to a
    registered version's (as mlreg writes a re-pointed ensemble: through ``desired_config``) returns
    that version, its tags untouched -- the fake otherwise always makes a new one."""

    def register_version(self, name: str, version_dir: Path, config_path: Path, **kwargs: Any) -> str:
        wanted = desired_config(config_path.read_text(), ["1"], gpu=True)
        for model, version in sorted(self.tags, key=lambda k: int(k[1])):
            text = (self.root / model / version / "config.pbtxt").read_text()
            if model == name and desired_config(text, ["1"], gpu=True) == wanted:
                self.events.append(("reuse", name, version))
                return version
        return super().register_version(name, version_dir, config_path, **kwargs)


def test_a_version_registered_by_someone_else_with_the_same_config_is_never_deleted(tmp_path: Path) -> None:
    """Someone registered ens v3 with exactly the config net v3's promotion re-points ens to (no
    promotion's id on it).  The promotion reuses it, fails verify and goes back: ens v3 stays, tags
    and files untouched; only the folder this promotion uploaded for it leaves the store."""
    world = _moved_once(tmp_path)
    registry = SameBytesRegistry(world.registry.root, world.events)
    registry.tags, registry.alias_map, registry.recorded = world.registry.tags, world.registry.alias_map, []
    world.registry = registry
    pinned = ENSEMBLE.replace('model_name: "net" model_version: 1', 'model_name: "net" model_version: 3')
    assert ensemble_pins(pinned) == {"pre": "1", "net": "3"}
    registry.add("ens", "3", pinned)
    registry.tags[("ens", "3")]["registered_by"] = "someone else"
    world.fleet.nan_answers.add(("net", "3"))
    before = _state(world)

    with pytest.raises(PromotionFailed) as aborted:
        world.promote("net", "3")

    assert ("reuse", "ens", "3") in world.events  # the promotion used their version...
    assert all(e[0] != "delete" for e in world.events)  # ...and deleted nothing
    assert registry.tags[("ens", "3")] == before["mlflow"]["versions"][("ens", "3")]
    assert OWNER_TAG not in registry.tags[("ens", "3")]
    assert _state(world)["mlflow"] == before["mlflow"]
    assert _state(world)["store"] == before["store"]  # its upload of folder 3 removed
    assert "deleted" not in str(aborted.value)


class Holders:
    """Replicas asked whether they hold a version (``UndoLog`` step 7's proof)."""

    def __init__(self, states: dict[str, dict[str, dict[str, str]]]) -> None:
        self.states = states

    parallel = 1

    def restore(self, url: str, change: Any) -> str:
        return ""

    def target(self, url: str) -> Any:
        states = self.states[url]
        if not states:
            raise TritonError(f"{url}: connection refused")
        return type("Target", (), {"model_states": lambda self: states})()


def _noted(tmp_path: Path, alias: str = "") -> tuple[UndoLog, FakeRegistry, Any]:
    """An undo log that noted this promotion's registration of ens (id ``p1``): ens v2 carries
    the id; ens v1 was someone's; ``alias`` (when given) names v2."""
    registry = FakeRegistry(tmp_path / "registry")
    registry.add("ens", "1", ENSEMBLE)
    registry.register_version("ens", tmp_path, _config(tmp_path), tags={OWNER_TAG: "p1"})
    if alias:
        registry.alias_map["ens"] = {alias: "2"}
    undo = UndoLog(gpu=False)
    undo.registering("ens", "p1", registry)
    return undo, registry, open_store(tmp_path / "store")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.pbtxt"
    path.write_text(ENSEMBLE)
    return path


def test_a_registered_version_still_in_use_is_kept_and_said_so(tmp_path: Path) -> None:
    """Step 7's proof: a version an alias names, or a replica this promotion touched holds, stays
    in MLflow ("kept ... (why)"); one a replica cannot be asked about stays too, named as a
    failure; one nothing uses is deleted; a version without this promotion's id is never looked at."""
    undo, registry, store = _noted(tmp_path / "alias", alias="production")
    report = undo.replay(Holders({}), store)  # type: ignore[arg-type]
    assert report.restored == [
        "ens v2, registered by this promotion, kept in MLflow (alias 'production' names it)"
    ]
    assert ("ens", "2") in registry.tags
    assert report.ok

    undo, registry, store = _noted(tmp_path / "held")
    undo.touched("t0:8001", "ens", ("2",))  # a replica this promotion sent a change to
    report = undo.replay(Holders({"t0:8001": {"ens": {"2": "READY"}}}), store)  # type: ignore[arg-type]
    assert "ens v2, registered by this promotion, kept in MLflow (t0:8001 holds it)" in report.restored
    assert ("ens", "2") in registry.tags

    undo, registry, store = _noted(tmp_path / "unknown")
    undo.touched("t0:8001", "ens", ())
    report = undo.replay(Holders({"t0:8001": {}}), store)  # type: ignore[arg-type]
    assert (
        "ens v2, registered by this promotion, kept in MLflow (t0:8001 cannot be asked whether it "
        "holds it: t0:8001: connection refused)"
    ) in report.failed
    assert ("ens", "2") in registry.tags

    undo, registry, store = _noted(tmp_path / "free")
    report = undo.replay(Holders({}), store)  # type: ignore[arg-type]
    assert report.restored == ["ens v2 (registered by this promotion) deleted"]
    assert sorted(registry.tags) == [("ens", "1")]  # v1 (no id of this promotion) untouched
