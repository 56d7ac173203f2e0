"""Issue 38, round two of the parts' faults, on real files and fakes of the servers and MLflow:
an ensemble rerun that must repair its members' aliases (item 6), a lock from a clock ahead
(item 8), status over an ensemble the store lost (item 9), `store ls` on a store that never
answers (item 11).

The promotion runs in tests/unit/worlds.py's world (a real local store, tests/fakes.py's registry
and Tritons); the locks are real lock files of a local store; the frozen store is a real socket
that accepts connections and never answers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.storage import open_store
from tests.unit.worlds import MEMBER, World

# -- item 6: a rerun through the ensemble repairs its members' aliases ----------------------------


def _state(world: World) -> dict[str, Any]:
    """What serves on each target, the store's files and locks, every alias."""
    store = open_store(world.store_root)
    return {
        "serving": {url: target.model_states() for url, target in sorted(world.fleet.targets.items())},
        "pins": {url: dict(target.ensembles) for url, target in sorted(world.fleet.targets.items())},
        "files": sorted(str(p.relative_to(world.store_root)) for p in world.store_root.rglob("*")),
        "configs": {m: world.config(m) for m in ("pre", "net", "ens")},
        "locks": store.session.locks(),
        "aliases": {m: dict(a) for m, a in world.registry.alias_map.items()},
    }


def _mlflow_down_after_the_alias_of(world: World, model: str) -> None:
    """MLflow goes down right after the record stage moved ``model``'s alias (``alias-moved``)."""
    set_alias = world.registry.set_alias

    def then_down(name: str, alias: str, version: str) -> None:
        set_alias(name, alias, version)
        if name == model:
            world.registry.down = True

    world.registry.set_alias = then_down  # type: ignore[method-assign]


@pytest.fixture
def repointed(tmp_path: Path) -> World:
    """ens v1 (pre v1, net v1) promoted, then net v2: ens re-pointed, registered as ens v2 and
    served from its Triton folder 2 (one number); net v3 registered."""
    world = World(tmp_path)
    world.promote("ens", "1")
    for version in ("2", "3"):
        world.registry.add("net", version, MEMBER.format(name="net", src="MID", dst="OUT"))
    world.promote("net", "2")
    assert world.registry.alias_map == {"pre": {"test": "1"}, "net": {"test": "2"}, "ens": {"test": "2"}}
    assert sorted(p.name for p in (world.store_root / "ens").iterdir()) == ["1", "2", "config.pbtxt"]
    assert serving_versions(world.config("ens")) == ["2"]
    return world


def test_a_rerun_of_the_serving_ensemble_after_mlflow_went_down_at_alias_moved_repairs_the_members_alias(
    repointed: World,
) -> None:
    """Item 6: MLflow down right after net's alias moved to v3: the promotion fails, serving goes
    back to net v2 but the alias cannot; the fix says to promote the version that serves.
    Promoting the ensemble that serves (registered v2, Triton folder 1) is the no-op, and its repair
    moves net's alias back to v2 -- it does not upload ens again as folder 2 and say "promoted"."""
    world = repointed
    before = _state(world)
    _mlflow_down_after_the_alias_of(world, "net")
    with pytest.raises(PromotionFailed, match="recording in MLflow failed") as info:
        world.promote("net", "3")
    assert "alias 'test' of net (moved to v3) could not be put back to 2" in info.value.message
    assert "run 'mlreg status' to see what serves, then promote the version you want" in (
        info.value.fix or ""
    )
    world.registry.set_alias = type(world.registry).set_alias.__get__(world.registry)  # type: ignore[method-assign]
    world.registry.down = False  # MLflow is back
    after_fault = _state(world)
    assert after_fault["aliases"]["net"] == {"test": "3"}  # left on the failed version
    assert {k: v for k, v in after_fault.items() if k != "aliases"} == {
        k: v for k, v in before.items() if k != "aliases"
    }  # what serves, the store's files, configs and locks: as before the attempt

    rerun = world.promote("ens", "2")  # the ensemble that serves, as status names it
    assert rerun.stage_names() == ["noop", "repair"]
    assert "ens version 2 already serves in 'test'" in rerun.stages[0].detail
    assert rerun.notes == [  # the alias, and the tags the failed attempt left on the versions it made
        "tag promoted_test of ens v3 (a failed attempt's) removed",
        "alias 'test' of net moved back to v2 (was 3)",
        "tag promoted_test of net v3 (a failed attempt's) removed",
    ]
    assert not {v for (m, v), tags in world.registry.tags.items() if "promoted_test" in tags} & {"3"}
    assert _state(world) == before  # nothing uploaded nor loaded; every alias as before the attempt
    assert world.registry.models.aliases("net") == {"test": "2"}
    assert world.promote("ens", "2").notes == []  # repaired: nothing more to do


def test_an_ensemble_version_with_another_graph_is_promoted_into_its_folder_with_its_members_aliases(
    repointed: World,
) -> None:
    """The other side: a registered ensemble version pinning what serves but with another graph
    is no "already serves" in the re-pointed folder -- a promotion into its own folder, which
    leaves each member's alias on the version it pins (a failed attempt's alias put right)."""
    world = repointed
    world.registry.alias_map["net"]["test"] = "3"  # what a failed record stage left
    text = (world.store_root / "ens" / "config.pbtxt").read_text()
    world.registry.add("ens", "3", text + 'parameters { key: "graph" value { string_value: "v3" } }\n')
    result = world.promote("ens", "3")
    assert result.stage_names()[0] == "resolve"
    assert result.stage_names()[-1] == "record"
    assert serving_versions(world.config("ens")) == ["3"]
    assert world.registry.models.aliases("ens") == {"test": "3"}
    assert world.registry.models.aliases("net") == {"test": "2"}
    assert world.registry.models.aliases("pre") == {"test": "1"}
    assert "alias 'test' of net moved to v2 (was 3): the version ens v3 pins" in result.notes


# -- item 8: a lock from a clock ahead -------------------------------------------------------------

AHEAD = "builder@ci-7:4242"
TWO_DAYS = 2 * 86400


def _lock_from_a_clock_ahead(root: Path, model: str = "m") -> Path:
    """The lock file a holder whose clock runs two days ahead left on a shared folder: its mtime
    (the lease's start, by the store's clock) and its ``expires_at`` two days in the future."""
    import json
    import os
    import time

    from pipelines.storage.base import lock_key

    ahead = time.time() + TWO_DAYS
    body = {"owner": AHEAD, "token": "f00d", "ttl": 900, "expires_at": ahead + 900, "renewal": 0}
    path = root / lock_key(model)
    path.write_text(json.dumps(body))
    os.utime(path, (ahead, ahead))
    return path


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from mlreg.cli.main import app
    from tests.cli import CliRunner

    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    return lambda *args: CliRunner().invoke(app, list(args))


def test_a_lock_from_a_clock_ahead_is_called_skew_and_unlock_force_naming_its_holder_takes_it(
    tmp_path: Path, cli: Any
) -> None:
    """Item 8: refused without --force (its lease looks alive for two days), named as clock skew
    with the command that removes it; --force naming another holder removes nothing; --force
    naming the lock's holder removes it, and the model can be locked again."""
    root = tmp_path / "store"
    root.mkdir()
    path = _lock_from_a_clock_ahead(root)
    store = open_store(root)
    [held] = store.session.locks()
    assert (held.stale, round(held.skew / 3600)) == (False, 48)
    assert "the lock's time lies 2 days in the future (clock skew: a clock ahead wrote it)" in held.describe()

    refused = cli("store", "unlock", "m", "--store", str(root))
    assert refused.exit_code == 5, refused.output
    assert f"error: {root}: model 'm' is locked by {AHEAD} since " in refused.output
    assert "(clock skew: a clock ahead wrote it); its lease is alive" in refused.output
    assert (
        "fix: a clock ahead wrote this lock, so its lease would look alive for 2 days more" in refused.output
    )
    assert f"'mlreg store unlock m --force {AHEAD}'" in refused.output
    assert "Traceback" not in refused.output
    listed = cli("store", "ls", "--store", str(root))
    assert listed.exit_code == 0, listed.output
    assert f"locked: m by {AHEAD} since " in listed.output
    assert "clock skew" in listed.output

    other = cli("store", "unlock", "m", "--store", str(root), "--force", "someone@else:1")
    assert other.exit_code == 5, other.output
    assert f"the lock of 'm' is held by {AHEAD} since " in other.output
    assert "not by 'someone@else:1': nothing was removed" in other.output
    assert path.is_file()

    forced = cli("store", "unlock", "m", "--store", str(root), "--force", AHEAD)
    assert forced.exit_code == 0, forced.output
    assert f"{root}: removed the lock of 'm' held by {AHEAD} since " in forced.output
    assert not path.exists()
    assert store.session.locks() == []
    with store.session.lock("m", owner="next@here:1", ttl=60) as lease:  # the model can be locked again
        assert store.session.read_lock("m") is not None
        assert lease.owner == "next@here:1"
    assert store.session.locks() == []


def test_a_live_lock_of_the_right_clock_is_no_skew_and_force_names_its_holder(
    tmp_path: Path, cli: Any
) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    with store.session.lock("m", owner="alive@elsewhere:1", ttl=60):
        [held] = store.session.locks()
        assert held.skew == 0.0
        assert "clock skew" not in held.describe()
        refused = cli("store", "unlock", "m", "--store", str(root), "--json")
        assert refused.exit_code == 5
        assert "its lease is alive" in refused.output
        assert "wait for that promotion to finish" in refused.output
        assert "'mlreg store unlock m --force alive@elsewhere:1'" in refused.output
        assert [lock.owner for lock in store.session.locks()] == ["alive@elsewhere:1"]


# -- item 11: `store ls` on a store that never answers ----------------------------------------------


class FrozenEndpoint:
    """A real socket that accepts every connection and never answers: a frozen S3 endpoint."""

    def __init__(self) -> None:
        import socket
        import threading

        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            self.held.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


def test_store_ls_on_a_store_that_never_answers_says_it_waits_and_ends_in_one_error(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 11: `store ls` (after a `status` on the same frozen S3) gives up on a request as status
    does -- seconds, not 4 x 60 s -- says on stderr meanwhile what it waits for, and ends in one
    error naming the store and the fix (exit 5, no traceback).  The bounds are shortened here."""

    from mlreg.cli import progress
    from mlreg.ops import status_views

    monkeypatch.setattr(status_views, "STORE_READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(progress, "WAIT_FIRST_S", 0.2)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    frozen = FrozenEndpoint()
    uri = f"s3://127.0.0.1:{frozen.port}/models/prod"
    try:
        result = cli("store", "ls", "--store", uri)  # it returns: the deadline ended the wait
    finally:
        frozen.close()
    assert result.exit_code == 5, result.output
    assert frozen.held  # it was asked, and never answered
    waits = [line for line in result.stderr.splitlines() if "still waiting" in line]
    assert waits, result.stderr
    waited = r"still waiting after \d+ s \(gives up on a request after 2 tries of 0\.3 s\)"
    assert re.fullmatch(f"mlreg store ls: reading {re.escape(uri)}: {waited}", waits[0]), waits[0]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"error: {uri} (http://127.0.0.1:{frozen.port}): cannot list ")
    assert "Read timeout" in errors[0]
    assert errors[0].endswith("('mlreg store ls' gives up on a request after 2 tries of 0.3 s)")
    assert f"fix: check that {uri} answers (endpoint up, credentials valid), then rerun 'mlreg store ls'" in (
        result.stderr
    )
    assert "files already stored" not in result.stderr  # the upload's fix is not ls's
    assert "Traceback" not in result.output
