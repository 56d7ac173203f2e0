"""A roll-out policy on the built-in ``local`` environment bakes on each local replica's own metrics
port (issue 48: the docs' canary on ``stack up --replicas 2`` failed 'cannot read Triton's metrics
at http://127.0.0.1:8002/metrics', the policy's default port, while the stack's replicas listen on
ports of their own).  Real ``mlreg.toml`` files, loaded as every verb loads them, put on the stack's
recorded servers by ``mlreg.ops.context.on_the_stack``."""

from __future__ import annotations

from pathlib import Path

from mlreg.ops.context import on_the_stack
from pipelines.devstack.local_triton import ServerInfo
from pipelines.promote.environments import environment
from registry.settings import Settings


def _local(tmp_path: Path, toml: str) -> tuple[Settings, list[ServerInfo]]:
    (tmp_path / "mlreg.toml").write_text(toml)
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    servers = [
        ServerInfo(
            100 + n, 41000 + n, 42000 + n, 43000 + n, str(settings.local_repository), "log", "shm", 0.0
        )
        for n in range(2)
    ]
    return settings, servers


def test_a_canary_on_the_local_stack_reads_each_replicas_own_metrics_port(tmp_path: Path) -> None:
    settings, servers = _local(tmp_path, "[environments.local]\ncanary = 1\nbake_seconds = 5\n")
    env = on_the_stack(environment(settings, "local"), servers, None)
    assert env.policy is not None
    for server in servers:  # the staged deployer asks the policy, the gate the environment
        assert env.policy.metrics_url(server.grpc_url) == server.metrics_url
        assert env.metrics_url(server.grpc_url) == server.metrics_url
    assert env.targets == tuple(server.grpc_url for server in servers)


def test_a_metrics_table_the_policy_names_is_kept_on_the_local_stack(tmp_path: Path) -> None:
    toml = (
        '[environments.local]\ncanary = 1\n\n[environments.local.metrics]\n"127.0.0.1:41000" = '
        '"http://metrics.example:9000/metrics"\n'
    )
    settings, servers = _local(tmp_path, toml)
    env = on_the_stack(environment(settings, "local"), servers, None)
    assert env.policy is not None
    assert env.policy.metrics_url("127.0.0.1:41000") == "http://metrics.example:9000/metrics"
