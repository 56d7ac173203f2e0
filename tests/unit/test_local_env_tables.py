"""The built-in ``local`` environment takes extra tables without being redefined (issue 48), and a
``metrics`` table never implies a canary: each test writes a real ``mlreg.toml`` and loads it
through ``pipelines.promote.environments`` as every verb does."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.promote.environments import environment, local_environment
from registry.errors import UsageError
from registry.settings import Settings


def _settings(tmp_path: Path, toml: str) -> Settings:
    (tmp_path / "mlreg.toml").write_text(toml)
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})


def test_a_shadow_table_extends_local_and_keeps_its_store_and_stack(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[environments.local.shadow]\nrate = 10\ncount = 20\n")
    local = environment(settings, "local")
    built_in = local_environment(settings)
    assert local.store == built_in.store == str(settings.local_repository)
    assert local.local_stack
    assert local.targets == ()  # the running stack's, filled in by the application
    assert local.shadow is not None
    assert (local.shadow.rate, local.shadow.count) == (10, 20)
    assert local.shadow.stack == str(settings.stack_dir)  # captures default to the replicas' traces
    assert local.policy is None


def test_warmup_and_metrics_extend_local_without_a_canary(tmp_path: Path) -> None:
    toml = (
        "[environments.local]\nwarmup = false\nkeep = 3\n\n"
        '[environments.local.metrics]\n"127.0.0.1:8001" = "http://127.0.0.1:8002/metrics"\n'
    )
    local = environment(_settings(tmp_path, toml), "local")
    assert local.local_stack
    assert local.store == str(tmp_path / ".mlreg" / "model_repository")
    assert local.warmup is False
    assert local.keep == 3
    assert local.policy is None  # no canary, no waves: a one-replica stack is promoted at once
    assert local.metrics_url("127.0.0.1:8001") == "http://127.0.0.1:8002/metrics"


def test_a_metrics_table_never_turns_on_a_canary_in_any_environment(tmp_path: Path) -> None:
    toml = (
        '[environments.one]\nstore = "s3://bucket/one"\ntargets = ["triton-0:8001"]\n\n'
        '[environments.one.metrics]\n"triton-0:8001" = "http://triton-0:9102/metrics"\n\n'
        '[environments.ported]\nstore = "s3://bucket/ported"\ntargets = ["triton-1:8001"]\n'
        "metrics_port = 9000\n"
    )
    settings = _settings(tmp_path, toml)
    one, ported = environment(settings, "one"), environment(settings, "ported")
    assert one.policy is None
    assert one.metrics_url("triton-0:8001") == "http://triton-0:9102/metrics"
    assert ported.policy is None
    assert ported.metrics_url("triton-1:8001") == "http://triton-1:9000/metrics"


def test_a_roll_out_key_still_makes_a_policy_that_keeps_its_metrics(tmp_path: Path) -> None:
    toml = (
        '[environments.fleet]\nstore = "s3://bucket/fleet"\ntargets = ["a:8001", "b:8001"]\n'
        'canary = 1\n\n[environments.fleet.metrics]\n"a:8001" = "http://a:9102/metrics"\n'
    )
    fleet = environment(_settings(tmp_path, toml), "fleet")
    assert fleet.policy is not None
    assert fleet.policy.canary == 1
    assert fleet.metrics_url("a:8001") == "http://a:9102/metrics"
    assert fleet.metrics_url("b:8001") == "http://b:8002/metrics"


def test_the_local_stack_s_targets_and_key_cannot_be_set_on_local(tmp_path: Path) -> None:
    settings = _settings(tmp_path, '[environments.local]\ntargets = ["127.0.0.1:8001"]\n')
    with pytest.raises(
        UsageError, match="targets cannot be set for the built-in local environment"
    ) as caught:
        environment(settings, "local")
    assert "[environments.fleet]" in caught.value.fix


def test_a_local_section_with_a_store_still_defines_local_from_scratch(tmp_path: Path) -> None:
    store = tmp_path / "elsewhere"
    toml = f'[environments.local]\nstore = "{store}"\ntargets = ["127.0.0.1:8001"]\n'
    local = environment(_settings(tmp_path, toml), "local")
    assert local.store == str(store)
    assert local.targets == ("127.0.0.1:8001",)
    assert not local.local_stack


def test_a_typo_in_a_local_table_is_still_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[environments.local]\nwarmpu = false\n")
    with pytest.raises(UsageError, match="warmpu"):
        environment(settings, "local")
