"""Issue 45 item 6 (second half): a ``promoted_<env>`` stamp the undo could not put back is removed
by the next run's no-op repair, which compares the stamps with what serves
(pipelines/promote/stamps.py).

In tests/unit/worlds.py's world (a real local store, tests/fakes.py's registry and Tritons): ens v1
(pre v1, net v1) promoted, then net v2 (ens re-pointed, registered as ens v2).  A promotion of net
v3 re-points ens again (registered as ens v3) and stamps it; MLflow goes down during the undo's
replay, so ens v3 keeps the failed attempt's stamp.  Before: the rerun of the member that serves
(``promote net 2``) said "the registry already says what serves" and kept it -- retention and
``rollback`` then rank ens v3, which never served, as the newest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.core.plan import ensemble_pins
from pipelines.core.reports import PromotionFailed
from pipelines.promote.stamps import repair_ensemble_stamps
from pipelines.storage import open_store
from registry.errors import StorageError
from tests.unit.worlds import MEMBER, World

TAG = "promoted_test"


def _stamps(world: World, model: str) -> dict[str, str]:
    return {v: tags[TAG] for (m, v), tags in world.registry.tags.items() if m == model and TAG in tags}


@pytest.fixture
def stamped(tmp_path: Path) -> World:
    """The failed attempt of net v3, its undo cut short by MLflow going down: ens v3 keeps its stamp."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")
    put_back = world.registry.delete_version_tag
    alias = world.registry.set_alias

    def down_at_the_first_put_back(name: str, version: str, key: str) -> None:
        world.registry.down = True  # MLflow dies during the undo's replay of the tags
        put_back(name, version, key)

    def then_fail(name: str, al: str, version: str) -> None:
        alias(name, al, version)
        if name == "ens" and version == "3":  # the record stage got as far as ens: the attempt fails
            world.registry.delete_version_tag = down_at_the_first_put_back  # type: ignore[method-assign]
            raise_in_record()

    def raise_in_record() -> None:
        from registry.errors import RegistryError

        raise RegistryError("MLflow went away")

    world.registry.set_alias = then_fail  # type: ignore[method-assign]
    with pytest.raises(PromotionFailed):
        world.promote("net", "3")
    world.registry.set_alias = alias  # type: ignore[method-assign]
    world.registry.delete_version_tag = put_back  # type: ignore[method-assign]
    world.registry.down = False  # MLflow is back
    return world


def test_the_no_op_rerun_of_the_serving_member_removes_the_failed_attempts_stamp_on_the_ensemble(
    stamped: World,
) -> None:
    world = stamped
    assert ensemble_pins(world.config("ens") or "") == {"pre": "1", "net": "2"}  # what serves
    left = _stamps(world, "ens")
    assert "3" in left, left  # the repro: the failed attempt's stamp outlived its undo
    assert left["3"] > left["2"]  # and ranks ens v3 (never served) as the newest
    rerun = world.promote("net", "2")
    assert rerun.stage_names() == ["noop", "repair"]
    assert f"tag {TAG} of ens v3 (a failed attempt's, {left['3']}: it never served) removed" in rerun.notes
    assert set(_stamps(world, "ens")) == {"1", "2"}  # the serving version's stamp kept, and the older
    assert _stamps(world, "ens")["2"] == left["2"]
    assert world.promote("net", "2").notes == []  # repaired: nothing more to do


def test_no_stamp_is_removed_where_no_stamped_version_pins_what_serves(
    stamped: World, tmp_path: Path
) -> None:
    """Without proof of which stamp is the serving one's (no stamped version pins what the store
    serves), none is touched."""
    world = stamped
    before = {m: _stamps(world, m) for m in ("ens", "net", "pre")}
    store = open_store(world.store_root)
    text = re.sub(r'(model_name: "pre"\s+model_version: )1\b', r"\g<1>7", world.config("ens") or "")
    store.session.write_config("ens", text)
    assert ensemble_pins(store.read_config("ens") or "") == {"pre": "7", "net": "2"}
    assert repair_ensemble_stamps(world.registry, store, "test", ["net"], tmp_path / "work") == []  # type: ignore[arg-type]
    assert {m: _stamps(world, m) for m in ("ens", "net", "pre")} == before


# -- issue 45 review, F1: the repair is written under the locks, what serves asked again there --


def _aliases(world: World, model: str) -> dict[str, str]:
    return dict(world.registry.models.aliases(model))


def test_a_promotion_racing_the_repair_is_refused_by_its_locks_and_nothing_is_undone(tmp_path: Path) -> None:
    """The reviewer's repro: the no-op of net v2 decided 'v2 serves'; while its repair runs, a
    promotion of net v3 starts.  Before: it finished, and the repair moved the alias back to v2 and
    removed v3's stamp while the store served v3.  Now the repair holds net's and ens's locks: the
    other promotion is refused, and alias, stamps and store agree (v2)."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")
    aliases = world.registry.aliases
    other: list[object] = []

    def aliases_then_other(name: str) -> dict[str, str]:
        if name == "net" and not other:  # inside the repair
            world.registry.aliases = aliases  # type: ignore[method-assign]
            with pytest.raises(StorageError, match="'(net|ens)' is locked by") as refused:
                world.promote("net", "3")  # refused at its first lock: the repair holds them
            other.append(refused.value)
        return aliases(name)

    world.registry.aliases = aliases_then_other  # type: ignore[method-assign]
    rerun = world.promote("net", "2")
    assert other, "the racing promotion never ran"
    assert rerun.stage_names() == ["noop", "repair"]
    assert "versions: 2" in (world.config("net") or "")
    assert _aliases(world, "net")["test"] == "2"
    assert "3" not in _stamps(world, "net")
    assert ensemble_pins(world.config("ens") or "")["net"] == "2"


def test_a_promotion_that_ends_before_the_repair_takes_its_locks_is_left_as_it_recorded(
    tmp_path: Path,
) -> None:
    """A promotion of net v3 finishes between the no-op's decision and its repair: asked again under
    the locks, v2 no longer serves, so the repair writes nothing and says so; v3's alias and stamp
    stay (before: moved back to v2 and removed)."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")
    done: list[object] = []

    def on_start(stage: str) -> None:
        if stage == "repair" and not done:
            done.append(world.promote("net", "3"))

    rerun = world.promote("net", "2", on_start=on_start)
    assert done
    # it recorded (then retain: ens's third folder, one number, is beyond the window of 2)
    assert done[0].stage_names()[-2:] == ["record", "retain"]  # type: ignore[attr-defined]
    assert "versions: 3" in (world.config("net") or "")
    assert _aliases(world, "net")["test"] == "3"
    assert "3" in _stamps(world, "net")
    assert any(
        n.startswith("registry repair skipped (nothing changed): net v2 no longer serves")
        for n in rerun.notes
    )


def test_a_lock_another_writer_holds_skips_the_repair_and_says_so(stamped: World) -> None:
    """ens's lock held by another writer: the failed attempt's stamp is not removed now (no write
    without the lock), the rerun says why; with the lock released, the next rerun removes it."""
    world = stamped
    left = _stamps(world, "ens")
    other = open_store(world.store_root)
    with other.session.lock("ens", ttl=60, wait=0):
        rerun = world.promote("net", "2")
    assert rerun.stage_names() == ["noop", "repair"]
    assert [
        n
        for n in rerun.notes
        if n.startswith("registry repair skipped (nothing changed): ens's lock not taken")
    ]
    assert _stamps(world, "ens") == left  # nothing written
    assert any("ens v3" in n for n in world.promote("net", "2").notes)
    assert set(_stamps(world, "ens")) == {"1", "2"}


def test_a_no_op_found_under_resolves_locks_repairs_with_the_locks_it_holds(
    stamped: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-op decided under the locks resolve took (the fast path said no): the repair uses the
    locks this promotion holds -- never refused by its own lock -- and removes the failed
    attempt's stamp."""
    import pipelines.promote.stages as stages

    world, real, calls = stamped, stages.already_serving, []

    def not_at_first(ctx, model, version):  # type: ignore[no-untyped-def]
        calls.append(model)
        return False if len(calls) == 1 else real(ctx, model, version)

    monkeypatch.setattr(stages, "already_serving", not_at_first)
    rerun = world.promote("net", "2")
    assert rerun.stage_names() == ["noop", "repair"]
    assert not [n for n in rerun.notes if n.startswith("registry repair skipped")], rerun.notes
    assert set(_stamps(world, "ens")) == {"1", "2"}
