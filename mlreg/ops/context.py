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
    from pipelines.devstack.local_triton import ServerInfo
    from pipelines.fleet.fleet import Fleet, UndoNotes
    from pipelines.promote.environments import Environment
    from pipelines.storage.base import Repository
    from registry.mlflow import MlflowRegistry


@dataclass
class Context:
    settings: Settings
    env: Environment
    registry: MlflowRegistry


def environment(settings: Settings, name: str) -> Environment:
    """The environment ``name`` of the project; ``local`` targets every replica of the running
    local stack (none while it is down: the promotion then says to start it), and writes the
    store the stack serves (``stack up --s3``: its S3 copy, not the project's folder)."""
    from pipelines.promote.environments import environment as configured  # lazy: tomllib + plan

    env = configured(settings, name)
    if not env.local_stack:
        return env
    from pipelines.devstack.stack import running_servers, served_store  # lazy: only the local stack asks

    return on_the_stack(env, running_servers(settings), served_store(settings))


def on_the_stack(env: Environment, servers: list[ServerInfo], store: str | None) -> Environment:
    """The built-in ``local`` environment on the running stack: its replicas (``stack up
    --replicas N``) as targets, the store it serves (``store``: its record; None while it is down,
    the configured one kept) and each replica's recorded repository, which the promotion checks
    against that store before any change (``Environment.served_from``)."""
    urls = tuple(info.grpc_url for info in servers)
    metrics = tuple((info.grpc_url, info.metrics_url) for info in servers)
    recorded = tuple((info.grpc_url, info.repository) for info in servers)
    policy = env.policy  # a roll-out's bake reads each replica's own metrics port, not the default 8002
    if policy is not None and not policy.metrics:
        policy = dataclasses.replace(policy, metrics=metrics)
    return dataclasses.replace(
        env, store=store or env.store, targets=urls, metrics_urls=metrics, served_from=recorded, policy=policy
    )


def open_registry(settings: Settings) -> MlflowRegistry:
    """The project's MLflow registry."""
    from registry.mlflow import MlflowRegistry  # lazy: ~1 s of MLflow a store verb never pays

    return MlflowRegistry(settings)


def context(settings: Settings, env_name: str) -> Context:
    """The environment ``env_name`` and the registry (MLflow) of ``settings``."""
    return Context(settings, environment(settings, env_name), open_registry(settings))


def open_store(uri: str | None, settings: Settings | None = None) -> Repository:
    """The store at ``uri`` (default: the settings' local repository)."""
    return store_of(settings or Settings.from_env(), uri, None)


def store_of(settings: Settings, store: str | None, env_name: str | None) -> Repository:
    """``--store URI``, else the store of ``--env`` (``local``: the one its running stack serves),
    else the local repository."""
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    if store and env_name:
        raise UsageError("--store and --env name the store twice", fix="pass one of them")
    uri = environment(settings, env_name).store if env_name else (store or settings.local_repository)
    return open_store(uri, digest_cache=settings.digest_cache)


def fleet(
    settings: Settings, env: Environment, store: Repository | None = None, undo: UndoNotes | None = None
) -> Fleet:
    """The environment's targets (the local stack's must be running) and its store; ``undo``: the
    log its changes are noted in (None: a read-only fleet, which refuses every change)."""
    from pipelines.fleet.fleet import Fleet  # lazy: tritonclient (~0.5 s)
    from pipelines.fleet.replicas import triton_connector  # lazy: tritonclient (~0.5 s)
    from pipelines.ledger.recorder import for_fleet  # lazy: the ledger, where a fleet is made
    from pipelines.promote.environments import resolve_targets  # lazy: the promotion package
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store

    targets = resolve_targets(settings, env)
    connect = triton_connector(settings, env.key(settings), env.load_deadline(settings))
    store = store or open_store(env.store)
    ledger = for_fleet(store, env.name, receipt_key=env.receipt_key)  # every call it sends
    return Fleet(store, targets, connect, env.load_deadline(settings), undo=undo, ledger=ledger)


__all__ = ["Context", "context", "environment", "fleet", "on_the_stack", "store_of"]
