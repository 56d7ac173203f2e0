"""An ensemble re-pointed by its members' promotions: one number (issue 48, item 5).

Staging re-points the ensemble and registers its config as a new version (ens v2), served from
Triton folder "2"; production promotes that version; a member's promotion in production then
re-points it again: registered as ens v3 and served from folder "3" -- the version a client asks
Triton for is the version MLflow shows.  The registered artifact is a plain model version
(``config.pbtxt`` + ``1/``).  A store made before (an ensemble served from a folder numbered
otherwise) is migrated by the ensemble's next promotion, and only once.

The fakes of tests/fakes.py, as tests/component/test_promotion.py uses them (the store is a real folder).
"""

from __future__ import annotations

from pathlib import Path

from pipelines.core.context import Options
from pipelines.core.plan import Role, ensemble_pins, ensembles_pinning, follow_latest, serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.promote.environments import Environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from tests.unit.worlds import ENSEMBLE, MEMBER, Servers, World


def _promote_in(world: World, env: Environment, fleet: Servers, model: str, version: str) -> PromotionResult:
    promotion = Promotion(
        world.settings,
        env,
        world.registry,
        Options(skip_quality=True),
        connect=fleet.connect,
    )
    return promotion.run(model, version)


def test_a_member_promotion_repoints_an_ensemble_served_from_folder_2(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")  # staging: ens re-pointed, registered as ens v2, served from folder 2
    assert world.registry.alias_map["ens"]["test"] == "2"
    assert serving_versions(world.config("ens")) == ["2"]
    assert {url: t.states["ens"] for url, t in world.fleet.targets.items()} == {
        "t0:8001": {"2": "READY"},
        "t1:8001": {"2": "READY"},
    }

    production_root = tmp_path / "production"
    production_root.mkdir()
    production = Environment("production", str(production_root), ("p0:8001",), "production", gpu=False)
    fleet = Servers(production_root)
    _promote_in(world, production, fleet, "ens", "2")  # members first, then ens v2 in folder "2"
    assert serving_versions(fleet.store.read_config("ens")) == ["2"]
    assert fleet.targets["p0:8001"].states["ens"] == {"2": "READY"}

    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    result = _promote_in(world, production, fleet, "net", "3")

    assert [(s.model, s.version, s.role) for s in result.plan.steps] == [
        ("net", "3", Role.MODEL),
        ("ens", "3", Role.ENSEMBLE),  # the registered version, served from its own folder
    ]
    served = fleet.store.read_config("ens") or ""
    registered = world.registry.alias_map["ens"]["production"]
    assert registered == "3"
    assert serving_versions(served) == [registered]  # the folder Triton serves is MLflow's number
    assert 'model_name: "net"\n    model_version: 3' in served
    assert fleet.targets["p0:8001"].states["ens"] == {registered: "READY"}
    assert fleet.store.versions.read_manifest("ens", registered) is not None  # uploaded and verified
    assert fleet.store.versions.read_manifest("ens", "2") is not None  # the folder served before is kept
    text = (world.registry.root / "ens" / registered / "config.pbtxt").read_text()
    assert serving_versions(text) == ["1"]
    assert world.registry.tags[("ens", registered)]["validation"] == "passed"


def test_the_stores_ensembles_pinning_a_model_and_following_the_latest(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.session.write_config("ens", ENSEMBLE)
    store.session.write_config("net", MEMBER.format(name="net", src="MID", dst="OUT"))
    store.session.write_config(
        "fake", '# platform: "ensemble"\n' + MEMBER.format(name="fake", src="A", dst="B")
    )

    assert ensembles_pinning(store) == {"ens": ENSEMBLE}  # parsed, not matched as text
    assert list(ensembles_pinning(store, ["net", "other"])) == ["ens"]
    assert ensembles_pinning(store, ["fake"]) == {}

    followed = follow_latest(ENSEMBLE, ["1"], False, ["net", "absent"])
    assert ensemble_pins(followed) == {"pre": "1", "net": "-1"}
    assert serving_versions(followed) == ["1"]


def test_an_ensemble_served_from_a_folder_numbered_otherwise_moves_to_its_own_on_its_next_promotion(
    tmp_path: Path,
) -> None:
    """A store made before one number: folder 1 serves the config MLflow registered as ens v2.  The
    ensemble's next promotion moves it to folder 2 (nothing else reloads, folder 1 kept); a second
    is a no-op."""
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("ens", "2", ENSEMBLE)  # the re-pointed version an older mlreg registered
    world.registry.alias_map["ens"]["test"] = "2"  # ... and named, while folder 1 serves it
    before = len(world.events)

    migrated = world.promote("ens", "2")

    assert [(s.model, s.version) for s in migrated.plan.steps] == [("ens", "2")]
    assert serving_versions(world.config("ens")) == ["2"]
    assert {url: t.states["ens"] for url, t in world.fleet.targets.items()} == {
        "t0:8001": {"2": "READY"},
        "t1:8001": {"2": "READY"},
    }
    assert {e[2] for e in world.loads(before)} == {"ens"}  # the members were not touched
    assert world.fleet.store.versions.read_manifest("ens", "1") is not None  # what served is not lost
    assert world.registry.alias_map["ens"]["test"] == "2"
    again = len(world.events)
    assert world.promote("ens", "2").noop  # migrated once: idempotent
    assert world.loads(again) == []
