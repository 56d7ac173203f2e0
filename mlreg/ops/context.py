"""What every verb starts from: the environment (the local stack's replicas filled in), its
registry, its fleet of servers and its store.

``open_registry`` is the one place a verb builds an ``MlflowRegistry`` and ``store_of`` the one
place it opens a store; tests replace ``context`` (or the name a verb module imported) with a fake.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.fleet.fleet import Fleet
    from pipelines.promote.environments import Environment
    from pipelines.storage.base import RepositoryStore
    from registry.mlflow import MlflowRegistry


@dataclass
class Context:
    settings: Settings
    env: Environment
    registry: MlflowRegistry


def environment(settings: Settings, name: str) -> Environment:
    """The environment ``name`` of the project; ``local`` targets every replica of the running
    local stack (none while it is down: the promotion then says to start it)."""
    from pipelines.promote.environments import environment as configured  # lazy: tomllib + plan

    env = configured(settings, name)
    if not env.local_stack:
        return env
    from pipelines.devstack.stack import running_servers  # lazy: only the local stack asks

    servers = running_servers(settings)  # `stack up --replicas N`
    urls = tuple(info.grpc_url for info in servers)
    metrics = tuple((info.grpc_url, info.metrics_url) for info in servers)
    return dataclasses.replace(env, targets=urls, metrics_urls=metrics)


def open_registry(settings: Settings) -> MlflowRegistry:
    """The project's MLflow registry."""
    from registry.mlflow import MlflowRegistry  # lazy: ~1 s of MLflow a store verb never pays

    return MlflowRegistry(settings)


def context(settings: Settings, env_name: str) -> Context:
    """The environment ``env_name`` and the registry (MLflow) of ``settings``."""
    return Context(settings, environment(settings, env_name), open_registry(settings))


def open_store(uri: str | None, settings: Settings | None = None) -> RepositoryStore:
    """The store at ``uri`` (default: the settings' local repository)."""
    return store_of(settings or Settings.from_env(), uri, None)


def store_of(settings: Settings, store: str | None, env_name: str | None) -> RepositoryStore:
    """``--store URI``, else the store of ``--env``, else the local repository."""
    from pipelines.promote.environments import environment as configured  # lazy: tomllib + plan
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    if store and env_name:
        raise UsageError("--store and --env name the store twice", fix="pass one of them")
    uri = configured(settings, env_name).store if env_name else (store or settings.local_repository)
    return open_store(uri, digest_cache=settings.digest_cache)


def fleet(settings: Settings, env: Environment, store: RepositoryStore | None = None) -> Fleet:
    """The environment's targets (the local stack's must be running) and its store."""
    from pipelines.fleet.fleet import Fleet  # lazy: tritonclient (~0.5 s)
    from pipelines.fleet.replicas import triton_connector  # lazy: tritonclient (~0.5 s)
    from pipelines.promote.environments import resolve_targets  # lazy: the promotion package
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    targets = resolve_targets(settings, env)
    connect = triton_connector(settings, env.key(settings), env.load_deadline(settings))
    return Fleet(store or open_store(env.store), targets, connect, env.load_deadline(settings))


__all__ = ["Context", "context", "environment", "fleet", "store_of"]
