"""``mlreg stack up|status|down``: the local development stack (tritonserver replicas on the
project's repository, a local S3 server with ``--s3``, the MLflow UI).

A stack that starts serves what the store's configs say should serve, each version verified
against the digest MLflow registered (``registered_digest``); ``down`` of an ``--s3`` stack copies
what its in-memory S3 server held back to the project's folder first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.devstack.stack import StackStatus, StoppedReplica


def stack_up(
    settings: Settings,
    *,
    repository: str | None = None,
    load: Sequence[str] = (),
    s3: bool = False,
    ui: bool = True,
    replicas: int = 1,
    step: Callable[[str], None] | None = None,
) -> StackStatus:
    """The stack started (or found running): its servers, URLs and what they load."""
    from mlreg.ops.store_push import registered_digest  # lazy: the registry, asked only to restore
    from pipelines.devstack import stack  # lazy: ~90 ms (grpc, psutil), this verb only

    return stack.stack_up(
        settings,
        repository=repository,
        load=tuple(load),
        s3=s3,
        ui=ui,
        replicas=replicas,
        step=step,
        registered=registered_digest(settings),  # what the store says should serve, verified
    )


def stack_status(settings: Settings) -> StackStatus:
    from pipelines.devstack import stack  # lazy: ~90 ms (grpc, psutil), this verb only

    return stack.stack_status(settings)


@dataclass
class Stopped:
    """What ``stack down`` stopped, and what it copied back from an ``--s3`` stack's server."""

    replicas: list[StoppedReplica]
    copied_back: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        pids = [replica.info.pid for replica in self.replicas]
        document: dict[str, object] = {
            "stopped": bool(self.replicas),
            "pid": pids[0] if pids else None,
            "pids": pids,
        }
        document |= {"copied_back": self.copied_back} if self.copied_back else {}
        return document | {"replicas": [replica.to_dict() for replica in self.replicas]}


def stack_down(settings: Settings) -> Stopped:
    """Each replica's tritonserver and python stubs stopped (SIGTERM, then SIGKILL to the process
    group after a bound) and its shared memory freed."""
    from pipelines.devstack import stack  # lazy: ~90 ms (grpc, psutil), this verb only

    kept: list[str] = []  # `stack up --s3`: what its S3 server held, copied back before it stops
    stopped = stack.stop_stack(settings, kept)
    return Stopped(stopped, kept)


__all__ = ["Stopped", "stack_down", "stack_status", "stack_up"]
