"""The peak-batch warmup as a load guard: Triton runs a stored config's ``model_warmup`` before READY
and refuses a load that fails at its peak batch (the config shaping is ``pipelines/core/warmup.py``).
Its setting: ``warmup`` (default true: a peak-batch ``model_warmup`` in every config written)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.core.check import Place
from registry.errors import UsageError


@dataclass(frozen=True)
class WarmupGuard:
    name: str = "warmup"
    field: str = "warmup"
    owns: frozenset[str] = frozenset({"warmup"})
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> bool:
        value = raw.get("warmup", True)
        if not isinstance(value, bool):
            raise UsageError(
                f"{place.where}: warmup must be true or false (a TOML boolean), not {value!r}",
                fix="write warmup = true (without quotes) in that section",
            )
        return value

    def load_guard(self, ctx: Any) -> None:
        """Nothing to ask around a load: Triton itself runs the warmup before READY."""
        return None


GUARD = WarmupGuard()
