"""What a promotion needs from the outside world, as Protocols.

The registry's ports (one per part: its ``models`` read and written, its ``runs`` recorded and
read, where versions are ``deployed``) are :mod:`registry.ports`' (the registry's own code
registers through them too); ``Registry`` is those parts and what composes them.  ``MlflowRegistry``
(registry/) and ``TritonControl`` (pipelines/triton/control.py) are the real implementations; the unit
tests drive the runner with small in-memory fakes of both.  ``Servers`` and ``Replicas`` are what the
shared vocabulary asks of an environment's servers (pipelines/fleet ``Fleet`` is both), so that the
context and the undo log name no feature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.core.changes import Change
from registry.ports import (
    DeploymentRecorder,
    DerivedVersions,
    RegistryReader,
    RegistryView,
    RegistryWriter,
    RunReader,
    RunRecorder,
)

if TYPE_CHECKING:
    import numpy as np  # annotations only: numpy (~0.15 s) is not imported by the read-only verbs

__all__ = [
    "DeploymentRecorder",
    "DerivedVersions",
    "PromotionRuns",
    "Registry",
    "RegistryEditor",
    "RegistryReader",
    "RegistryView",
    "RegistryWriter",
    "Replicas",
    "RunReader",
    "RunRecorder",
    "ScratchServers",
    "Servers",
    "ServingTarget",
]


class RegistryEditor(RegistryReader, RegistryWriter, Protocol):
    """A registry's ``models`` part as a whole: reads what it is about to change, then writes (the
    record stage's writes and what puts them back, ``pipelines.promote.record``; the no-op's
    repairs, ``pipelines.promote.stamps``)."""


class PromotionRuns(RunRecorder, RunReader, Protocol):
    """A registry's ``runs`` part as a promotion uses it: the promotion's record (the ledger's
    copy) written, what earlier runs logged read."""


class Registry(DerivedVersions, Protocol):
    """The model registry as a promotion uses it (MLflow in production): its parts -- ``models``
    (versions, aliases, tags: read and written), ``runs`` (recorded and read), ``deployed``
    (where versions serve) -- and what composes them (a derived version registered, one it made
    deleted).  Code that needs less takes the part it uses (``pipelines.promote.integrity`` takes
    the ``RegistryView``: it only reads)."""

    @property
    def uri(self) -> str: ...

    @property
    def models(self) -> RegistryEditor: ...

    @property
    def runs(self) -> PromotionRuns: ...

    @property
    def deployed(self) -> DeploymentRecorder: ...


class ServingTarget(Protocol):
    """One inference server of an environment (a Triton, addressed by its gRPC URL)."""

    url: str

    def is_live(self) -> bool: ...

    def server_metadata(self) -> dict[str, Any]: ...

    def model_states(self) -> dict[str, dict[str, str]]: ...

    def model_config(self, model: str) -> dict[str, Any]: ...

    def load(
        self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None
    ) -> None: ...

    def unload(self, model: str, unload_dependents: bool = False) -> None: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...

    def is_ready(self, model: str, version: str = "") -> bool: ...

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]: ...

    def statistics(self, model: str = "") -> list[dict[str, Any]]:
        """Triton's per-version statistics of ``model`` (its JSON ``model_stats``)."""
        ...

    def trace_settings(self, model: str, settings: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
        """``model``'s trace settings after applying ``settings`` (capture: pipelines/checks/capture.py)."""
        ...

    def close(self) -> None: ...


# A tritonserver started for one quality gate (dry runs, plan jobs): given a model repository
# folder, a context manager whose value is the gRPC URL of a server that serves it in explicit
# model-control mode; leaving it stops the server.  The application provides it
# (pipelines/devstack); the promotion never starts a server itself.
ScratchServers = Callable[[Path], AbstractContextManager[str]]


class Replicas(Protocol):
    """What the undo log (undo.py) asks of the servers it puts back (pipelines/fleet ``Fleet``):
    each replica put back to an earlier ``Change`` ("" or why not), as many at once as the
    roll-out moved (``parallel``), and a replica asked what it holds now."""

    @property
    def parallel(self) -> int: ...

    def restore(self, url: str, change: Change) -> str: ...

    def target(self, url: str) -> ServingTarget: ...


class Servers(Protocol):
    """What a promotion's context (context.py) asks of its servers (pipelines/fleet ``Fleet``): the
    undo log every change is noted in first (None: a read-only fleet), and to close them."""

    @property
    def undo(self) -> object: ...

    def close(self) -> None: ...
