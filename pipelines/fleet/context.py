"""A promotion's context over the environment's ``Fleet``: what the engine and the roll-outs
annotate.  ``pipelines.core`` keeps ``PromotionContext`` generic in its servers (core names no
feature); the packages that drive a Fleet say so here, so mypy checks every ``ctx.fleet`` use."""

from __future__ import annotations

from pipelines.core.context import PromotionContext
from pipelines.fleet.fleet import Fleet

FleetContext = PromotionContext[Fleet]

__all__ = ["FleetContext"]
