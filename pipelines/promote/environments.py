"""Environments from the project's ``mlreg.toml``; the embedded default ``local`` needs none.

[environments.staging]
store = "s3://models-bucket/staging"        # Triton's repository syntax
targets = ["triton-0.staging:8001", "triton-1.staging:8001"]   # gRPC; the first is the canary
alias = "staging"                            # the MLflow alias this environment owns
gpu = true                                   # keep KIND_GPU instance groups (default true)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from pipelines.promote.rollout import Policy, parse_policy
from registry.errors import UsageError
from registry.settings import Settings

LOCAL = "local"


@dataclass(frozen=True)
class Environment:
    name: str
    store: str
    targets: tuple[str, ...]
    alias: str
    gpu: bool
    local_stack: bool = False  # targets resolved from the running local stack
    policy: Policy | None = None  # fleet roll-out policy (pipelines/promote/rollout.py)
    discover: str = ""  # "dns:NAME:PORT": targets are NAME's addresses (pipelines/promote/discovery.py)


def settings_file(settings: Settings) -> Path:
    return settings.home.parent / "mlreg.toml"


def local_environment(settings: Settings) -> Environment:
    from registry.template import gpu_available

    return Environment(LOCAL, str(settings.local_repository), (), "local", gpu_available(), local_stack=True)


def load_environments(settings: Settings) -> dict[str, Environment]:
    envs = {LOCAL: local_environment(settings)}
    path = settings_file(settings)
    if not path.is_file():
        return envs
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the environments: {exc}", fix="fix the TOML syntax") from exc
    for name, raw in (data.get("environments") or {}).items():
        try:
            envs[name] = Environment(
                name,
                str(raw["store"]),
                _targets(path, name, raw.get("targets", [])),
                str(raw.get("alias", name)),
                bool(raw.get("gpu", True)),
                policy=parse_policy(f"{path} [environments.{name}]", raw),
                discover=_discover(path, name, raw),
            )
        except (KeyError, TypeError) as exc:
            raise UsageError(
                f"{path}: environment '{name}' needs at least 'store' ({exc})",
                fix='add store = "s3://bucket/prefix" and targets = ["host:8001"]',
            ) from exc
    return envs


def _targets(path: Path, name: str, raw: object) -> tuple[str, ...]:
    """``targets`` must be a list of "host:port" strings (a bare string is not iterated per character)."""
    if not isinstance(raw, list) or not all(isinstance(t, str) and t.strip() for t in raw):
        raise UsageError(
            f"{path}: environment '{name}': targets must be a list of \"host:port\" strings, not {raw!r}",
            fix=f'write targets = ["host:8001"] (a list, even for one server) in [environments.{name}]',
        )
    return tuple(t.strip() for t in raw)


def _discover(path: Path, name: str, raw: dict[str, object]) -> str:
    spec = raw.get("discover", "")
    if not spec:
        return ""
    from pipelines.promote.discovery import parse

    if not isinstance(spec, str) or raw.get("targets"):
        raise UsageError(
            f"{path}: environment '{name}': discover must be one \"dns:NAME:PORT\" string, without targets",
            fix='keep either targets = ["host:8001"] or discover = "dns:NAME:8001"',
        )
    parse(spec)
    return spec


def environment(settings: Settings, name: str) -> Environment:
    envs = load_environments(settings)
    if name not in envs:
        raise UsageError(
            f"unknown environment '{name}'",
            fix=f"use one of: {', '.join(sorted(envs))} (defined in {settings_file(settings)})",
        )
    return envs[name]


def resolve_targets(settings: Settings, env: Environment) -> tuple[str, ...]:
    """The gRPC URLs to drive; for ``local``, the running local stack's."""
    if env.discover:
        from pipelines.promote.discovery import resolve

        return resolve(env.discover)
    if not env.local_stack:
        if not env.targets:
            raise UsageError(
                f"environment '{env.name}' has no targets",
                fix='add targets = ["host:8001"] to its section in mlreg.toml',
            )
        return env.targets
    from pipelines.stack import running_servers

    servers = running_servers(settings)  # `stack up --replicas N`: every replica
    if not servers:
        from registry.errors import PromotionError

        raise PromotionError(
            "the local stack is not running, so environment 'local' has no Triton",
            fix="start it with 'mlreg stack up'",
        )
    return tuple(info.grpc_url for info in servers)
