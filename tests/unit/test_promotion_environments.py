"""Environments read from mlreg.toml: the targets' shape is checked, not guessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlreg.ops import context as ops_context
from pipelines.devstack import stack
from pipelines.devstack.local_triton import ServerInfo
from pipelines.promote.environments import environment, resolve_targets
from registry.errors import PromotionError, UsageError
from registry.settings import Settings


def _settings(tmp_path: Path, toml: str) -> Settings:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    (tmp_path / "mlreg.toml").write_text(toml)
    return settings


def test_a_list_of_targets_is_read_in_order(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, '[environments.staging]\nstore = "s3://b/p"\ntargets = ["t0:8001", " t1:8001 "]\n'
    )
    env = environment(settings, "staging")
    assert env.targets == ("t0:8001", "t1:8001")
    assert env.alias == "staging"


@pytest.mark.parametrize("value", ['"host:8001"', "8001", '["host:8001", 3]', '[""]'])
def test_targets_that_are_not_a_list_of_strings_are_refused(tmp_path: Path, value: str) -> None:
    settings = _settings(tmp_path, f'[environments.staging]\nstore = "s3://b/p"\ntargets = {value}\n')
    with pytest.raises(UsageError, match="environment 'staging': targets must be a list of") as info:
        environment(settings, "staging")
    assert (
        info.value.fix
        == 'write targets = ["host:8001"] (a list, even for one server) in [environments.staging]'
    )


def test_local_has_no_targets_of_its_own_and_says_to_start_the_stack(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "")
    env = environment(settings, "local")
    assert env.local_stack
    assert env.targets == ()
    with pytest.raises(
        PromotionError, match="the local stack is not running, so environment 'local'"
    ) as info:
        resolve_targets(settings, env)
    assert info.value.fix == "start it with 'mlreg stack up'"
    assert ops_context.environment(settings, "local").targets == ()  # nothing runs in tmp_path


def test_the_application_targets_every_replica_of_the_running_local_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, '[environments.staging]\nstore = "s3://b/p"\ntargets = ["t0:8001"]\n')
    servers = [ServerInfo(1, port, 2, 3, "/repo", "log", "p_", 0.0) for port in (8101, 8201)]
    monkeypatch.setattr(stack, "running_servers", lambda _: servers)
    env = ops_context.environment(settings, "local")
    assert resolve_targets(settings, env) == ("127.0.0.1:8101", "127.0.0.1:8201")
    assert ops_context.environment(settings, "staging") == environment(settings, "staging")
