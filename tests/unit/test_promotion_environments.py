"""Environments read from mlreg.toml: the targets' shape is checked, not guessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.promote.environments import environment
from registry.errors import UsageError
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
