"""A change of what one server holds (``Change``), and how one model's change over the servers went
(``Rollout``, one ``TargetResult`` per server).

The vocabulary the fleet (pipelines/fleet: the one owner of moves) and the undo log (undo.py: what a
promotion puts back) share: the undo log builds the ``Change`` that puts a replica back and hands it
to the fleet through a port (ports.py ``Replicas``); the reports (reports.py) carry the roll-outs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

States = dict[str, dict[str, str]]  # model -> version -> state, as Triton's repository index says


@dataclass(frozen=True)
class Change:
    """What one model becomes on a server: ``config`` (None: unloaded) with ``versions`` READY."""

    model: str
    config: str | None
    versions: tuple[str, ...] = ()
    override: bool = True  # sent with the load; False: the server reads the store's config
    files: Mapping[str, bytes] | None = None  # the model's own files, sent with the load
    retired: tuple[str, ...] = ()  # versions that must be unloaded after it (waited for)

    def describe(self) -> str:
        return f"{self.model} -> v{','.join(self.versions) or 'none'}"


@dataclass
class TargetResult:
    url: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Rollout:
    """One model's change over the fleet: the config written once, then each target."""

    model: str
    versions: list[str]  # READY on every target afterwards ([] : unloaded)
    targets: list[TargetResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "versions": self.versions,
            "targets": [t.__dict__ for t in self.targets],
        }


def ready_versions(states: States, model: str) -> list[str]:
    return sorted((v for v, s in states.get(model, {}).items() if s == "READY"), key=int)


def loading_versions(states: States, model: str) -> list[str]:
    """The versions of ``model`` Triton is still loading (a load that has not finished)."""
    return sorted((v for v, s in states.get(model, {}).items() if s == "LOADING" and v), key=int)
