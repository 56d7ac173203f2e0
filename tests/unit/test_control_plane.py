"""The control plane (issue 44 item 6): a replica whose model-control API takes anyone's calls
refuses a promotion before any change unless the environment says ``open_control = "allow"``
(then a note in every output and the run), and a control key is one word in a file only its owner
reads, wherever it comes from.

The replicas here are real gRPC servers (tests/standin_triton.py): an open one takes the probe's
keyless unload of an unknown name as an open Triton 2.51 does (success, nothing loaded), a locked
one refuses it ("This protocol is restricted").  The store is a real local folder; MLflow the
in-memory registry of tests/fakes.py (its alias moves and registrations are events)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.core.context import Options
from pipelines.fleet.replicas import open_control_notes
from pipelines.promote.environments import load_environments
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton import control_key
from pipelines.triton.control import TritonControl, control_api_open, probe_name
from pipelines.triton.control_key import ControlKey, local_key
from registry.errors import PromotionError, UsageError
from registry.settings import Settings
from tests.standin_triton import StandinFleet
from tests.unit.worlds import World

KEY = "the-tests-control-key"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def replicas(world: World) -> Iterator[tuple[str, str]]:
    """(open, locked): two stand-in tritonservers on the world's store, the first started without
    the restriction flags, the second locked to ``KEY``."""
    with (
        StandinFleet(world.store_root, 1, load_delay=0.05, key=None) as opened,
        StandinFleet(world.store_root, 1, load_delay=0.05, key=KEY) as locked,
    ):
        yield opened.replicas[0].grpc_url, locked.replicas[0].grpc_url


def promotion(world: World, targets: tuple[str, ...], allow: bool = False, **options: object) -> Promotion:
    env = dataclasses.replace(world.env, targets=targets, open_control="allow" if allow else "refuse")
    key = ControlKey(KEY, "the tests")

    def connect(url: str) -> TritonControl:
        return TritonControl(url, timeout=5.0, load_timeout=30.0, key=key)

    return Promotion(world.settings, env, world.registry, Options(skip_quality=True, **options), connect)  # type: ignore[arg-type]


def test_an_open_replica_refuses_the_promotion_before_any_change(
    world: World, replicas: tuple[str, str]
) -> None:
    opened, locked = replicas
    for dry_run in (True, False):  # the dry run says what the real run will do
        with pytest.raises(
            PromotionError, match=re.escape(f"{opened} take(s) model-control calls from anyone")
        ) as error:
            promotion(world, (locked, opened), dry_run=dry_run).run("pre", "1")
        assert locked not in error.value.message  # the locked one is not named
        assert error.value.context["replicas"] == [opened]
        assert 'open_control = "allow"' in str(error.value.fix)
    assert world.config("pre") is None  # nothing written to the store
    assert open_store(world.store_root).list_models() == []
    assert world.events == []  # no registration, no alias moved
    assert world.registry.alias_map == {}
    assert world.registry.recorded == []
    with TritonControl(locked, key=ControlKey(KEY, "the tests")) as triton:
        assert "pre" not in triton.model_states()  # nothing loaded on either replica
    with TritonControl(opened, key=None) as triton:
        assert "pre" not in triton.model_states()


def test_open_control_allow_promotes_with_a_note_in_the_result_and_the_run(
    world: World, replicas: tuple[str, str]
) -> None:
    opened, locked = replicas
    result = promotion(world, (locked, opened), allow=True).run("pre", "1")
    assert result.ok
    note = (
        f"{opened} takes model-control calls from anyone (whoever reaches it can load, unload or "
        "re-point a model); promoted to it because environment 'test' says open_control = \"allow\""
    )
    assert note in result.notes
    assert note in result.to_dict()["notes"]  # --json, and the run's report.json (record.py)
    assert [n for n in result.notes if "model-control" in n] == [note]  # the locked one not named
    assert world.registry.alias_map["pre"]["test"] == "1"
    assert world.registry.recorded
    assert world.registry.recorded[-1]["ok"] is True  # the run recorded
    for url, key in ((opened, None), (locked, ControlKey(KEY, "the tests"))):
        with TritonControl(url, key=key) as triton:
            assert triton.is_ready("pre", "1")


def test_a_locked_fleet_is_probed_and_not_noted(world: World, replicas: tuple[str, str]) -> None:
    _, locked = replicas
    target = TritonControl(locked, key=ControlKey(KEY, "the tests"))
    try:
        assert open_control_notes("test", False, [locked], lambda url: target, 5.0) == []
    finally:
        target.close()


def test_the_probe_is_a_keyless_unload_of_a_fresh_name_and_loads_nothing(world: World) -> None:
    """Review F5: a probe that loads could run a model the store holds under the probe's name; the
    probe unloads a name nobody can know ahead (128 random bits, fresh per probe) and never loads:
    the stand-ins count the calls each one took."""
    with (
        StandinFleet(world.store_root, 1, key=None) as opened,
        StandinFleet(world.store_root, 1, key=KEY) as locked,
    ):
        answers = [control_api_open(fleet.replicas[0].grpc_url) for fleet in (opened, locked)]
        calls = [
            {m: fleet.replicas[0].calls[m] for m in ("RepositoryModelLoad", "RepositoryModelUnload")}
            for fleet in (opened, locked)
        ]
    assert answers == [True, False]  # open; locked
    assert calls == [{"RepositoryModelLoad": 0, "RepositoryModelUnload": 1}] * 2
    names = {probe_name() for _ in range(100)}
    assert len(names) == 100
    assert all(re.fullmatch(r"__mlreg_probe_[0-9a-f]{32}__", name) for name in names)


def test_open_control_takes_only_refuse_or_allow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    toml = tmp_path / "mlreg.toml"
    toml.write_text('[environments.prod]\nstore = "/s"\ntargets = ["t:8001"]\nopen_control = "allow"\n')
    assert load_environments(settings)["prod"].open_control == "allow"
    assert load_environments(settings)["local"].open_control == "refuse"  # the default
    toml.write_text('[environments.prod]\nstore = "/s"\ntargets = ["t:8001"]\nopen_control = true\n')
    with pytest.raises(UsageError, match='open_control must be "refuse" or "allow", not True'):
        load_environments(settings)


# -- the key -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620])
def test_a_key_file_others_may_read_or_write_is_refused_with_the_chmod_fix(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "prod.key"
    path.write_text("s3cr3t-key\n")
    path.chmod(mode)
    for found in (
        lambda: control_key.control_key(tmp_path, "prod.key", base=tmp_path, environ={}),
        lambda: control_key.control_key(tmp_path, environ={control_key.KEY_FILE_ENV: str(path)}),
    ):
        with pytest.raises(UsageError, match=re.escape(f"is open to others (mode {mode:04o})")) as error:
            found()
        assert error.value.fix == (
            f"chmod 600 {path} (as ssh asks of a private key; a Kubernetes Secret mounted as a file: "
            "defaultMode: 0400)"
        )
        assert "s3cr3t-key" not in error.value.message + str(error.value.fix)
    path.chmod(0o600)
    assert control_key.control_key(tmp_path, "prod.key", base=tmp_path, environ={}).value == "s3cr3t-key"  # type: ignore[union-attr]
    path.chmod(0o400)
    assert control_key.control_key(tmp_path, "prod.key", base=tmp_path, environ={}).value == "s3cr3t-key"  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["ab cd", "ab\tcd", "ab\ncd", " ", "ab\x07cd"])
def test_a_key_with_whitespace_inside_is_refused_wherever_it_comes_from(tmp_path: Path, value: str) -> None:
    home = tmp_path / ".mlreg"
    path = tmp_path / "k.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value)
    ways = {
        "$MLREG_CONTROL_KEY": lambda: control_key.control_key(home, environ={control_key.KEY_ENV: value}),
        "$STAGE_KEY": lambda: control_key.control_key(home, "env:STAGE_KEY", environ={"STAGE_KEY": value}),
        str(path): lambda: control_key.control_key(home, environ={control_key.KEY_FILE_ENV: str(path)}),
        "$MLREG_CONTROL_KEY ": lambda: local_key(home, environ={control_key.KEY_ENV: value}),
    }
    for origin, found in ways.items():
        with pytest.raises(
            UsageError, match=re.escape(f"{origin.strip()} does not hold a control key")
        ) as error:
            found()
        assert value.strip() == "" or value not in error.value.message  # never echoed
    assert not (home / control_key.LOCAL_KEY_FILE).exists()  # the stack generated none either


def test_a_key_is_stripped_of_the_newline_around_it() -> None:
    found = control_key.control_key(None, environ={control_key.KEY_ENV: "  abc-123\n"})
    assert found is not None
    assert found.value == "abc-123"
    assert found.http_headers() == {control_key.HEADER: "abc-123"}
