"""What every stage of a promotion receives: one ``PromotionContext``.

A stage is a function ``stage(ctx) -> StageReport``; it reads and writes only the context (the
plan, the gate's outputs) and notes every change it makes in ``ctx.undo`` before making it.  The
strategies are chosen once, when the plan is built (``resolve``): the ``Deployer`` (all at once, or
staged under the environment's policy) and the ``Gate`` (on the canary, on a scratch server, or
none).

The context names no feature: its servers are any ``Servers`` (ports.py) -- in a promotion the
environment's ``Fleet`` (pipelines/fleet), built with the context's undo log.  It is generic in
their type: ``PromotionContext[Fleet]`` is a promotion's, and code above core that annotates it so
reads ``ctx.fleet`` as the Fleet (the bare ``PromotionContext`` leaves it untyped).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from pipelines.core.check import Checked
from pipelines.core.environment import Environment
from pipelines.core.options import Options
from pipelines.core.plan import Plan
from pipelines.core.ports import Registry, ScratchServers, Servers
from pipelines.core.reports import (
    Converted,
    FleetReport,
    PromotionResult,
    QualityStageReport,
    Repair,
    StageReport,
)
from pipelines.core.undo import UndoLog
from pipelines.storage.base import Repository
from registry.settings import Settings

FleetT = TypeVar("FleetT", bound=Servers)  # the environment's servers (pipelines/fleet ``Fleet``)


class Deployer(Protocol):
    """How the plan's changes reach the fleet (``deploy``) and the old versions leave (``finalize``)."""

    @property
    def name(self) -> str: ...

    def deploy(self, ctx: PromotionContext) -> FleetReport: ...

    def finalize(self, ctx: PromotionContext) -> FleetReport: ...


class Gate(Protocol):
    """Where the candidates answer the golden inputs before any traffic meets them."""

    @property
    def name(self) -> str: ...

    @property
    def live(self) -> bool:
        """Runs after the upload, on a server of the environment."""
        ...

    def run(self, ctx: PromotionContext) -> QualityStageReport: ...


@dataclass
class PromotionContext(Generic[FleetT]):
    settings: Settings
    env: Environment
    registry: Registry
    options: Options
    store: Repository
    fleet: FleetT
    plan: Plan
    scratch: ScratchServers | None = None
    undo: UndoLog = field(init=False)
    result: PromotionResult = field(init=False)
    locks: ExitStack = field(default_factory=ExitStack)
    deployer: Deployer | None = None  # chosen by resolve
    gate: Gate | None = None  # chosen by resolve (None: --skip-quality)
    checked: Checked | None = None  # the gate's outputs: verify compares the servers with them
    noop: bool = False  # resolve found the version serving exactly as asked
    converted: Converted | None = None  # convert's ONNX version, registered by assemble
    repairs: list[Repair] = field(default_factory=list)  # corrupt stored versions assemble restores

    def __post_init__(self) -> None:
        undo = self.fleet.undo
        if not isinstance(undo, UndoLog):  # the fleet notes every move in its log first
            raise TypeError("a promotion's Fleet is built with its UndoLog: Fleet(..., undo=UndoLog(...))")
        self.undo = undo
        self.undo.plan(self.plan.steps)
        self.result = PromotionResult(self.plan)
        self._tmp = tempfile.TemporaryDirectory(prefix="mlreg-promote-")
        self.locks.callback(self._tmp.cleanup)
        self.plan.workdir = Path(self._tmp.name)

    def set_plan(self, plan: Plan) -> None:
        self.plan = self.result.plan = plan
        self.undo.plan(plan.steps)

    def close(self) -> None:
        self.locks.close()
        self.fleet.close()


@dataclass(frozen=True)
class Stage:
    """One step of a promotion; ``live`` when it writes anything (store, servers, registry);
    ``when``: run only when it says so (else not run, not recorded); ``undone``: a failure of it
    replays the undo log (False: the promotion stands whatever it does, e.g. ``retain``)."""

    name: str
    run: Callable[[PromotionContext], StageReport]
    live: bool = False
    when: Callable[[PromotionContext], bool] | None = None
    undone: bool = True
    by: str = ""  # the strategy that runs it (the deployer's or the gate's name)
