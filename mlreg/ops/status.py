"""``mlreg status [MODEL] --env E``: the alias, the store's desired versions and what serves."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import context
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.promote.status import ModelRow


@dataclass
class StatusReport:
    environment: str
    models: list[ModelRow]
    locks: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the store's, with leases
    store_error: str = ""  # why the store could not be read ("": it was); the rows say what serves
    store_fix: str = ""
    open_control: list[str] = dataclasses.field(default_factory=list)  # replicas anyone can drive
    readiness: str = ""  # which replicas were read from their readiness (their index did not answer), why
    unreachable: dict[str, str] = dataclasses.field(default_factory=dict)  # url -> why it cannot say

    @property
    def drift(self) -> bool:
        return bool(self.store_error or self.readiness) or any(row.drift for row in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "drift": self.drift,
            "models": [row.to_dict() for row in self.models],
            "locks": self.locks,
            "store_error": self.store_error,
            "store_fix": self.store_fix,
            "open_control": self.open_control,
            "readiness": self.readiness,
            "unreachable": self.unreachable,
        }


def status(settings: Settings, env_name: str, model: str | None = None) -> StatusReport:
    """The alias, the store's desired versions and what each target serves, per model; drift flagged.
    A store that does not answer within seconds leaves what the targets serve, and says why; a
    replica whose repository index does not answer is read from its readiness, and said so."""
    from pipelines.promote.status import environment_status  # lazy: tritonclient, numpy

    ctx = context(settings, env_name)
    found = environment_status(settings, ctx.env, ctx.registry, [model] if model else None)
    return StatusReport(
        env_name,
        found.rows,
        found.locks,
        found.store_error,
        found.store_fix,
        found.open_control,
        found.readiness,
        found.unreachable,
    )


__all__ = ["StatusReport", "status"]
