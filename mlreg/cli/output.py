"""A promotion's roll-out drawn on one line (the plan's and the report's renderers share it).

Commands never format text themselves: they hand results to an ``Output`` (:mod:`mlreg.cli.sink`),
which prints either one JSON document (``--json``) or what people read; every failure is reported
in one place (:mod:`mlreg.cli.failures`).

Importing this module stays cheap (``mlreg --help`` loads it): ``rich`` is imported only when a
table is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rollout_line(rollout: Mapping[str, Any]) -> str:
    """``canary [a] ▸ bake 60 s ▸ wave 2 [b, c]`` for a plan's roll-out."""
    from pipelines.core.policy import Check  # lazy: the promotion package, only for a plan

    parts = []
    waves = rollout["waves"]
    for index, wave in enumerate(waves):
        parts.append(f"{'canary' if index == 0 else f'wave {index + 1}'} [{', '.join(wave)}]")
        if index + 1 < len(waves) and rollout["bake_seconds"]:
            parts.append(f"bake {rollout['bake_seconds']:g} s")
    checks = ", ".join(Check(c["metric"], c["min"], c["max"]).describe() for c in rollout["checks"])
    return " ▸ ".join(parts) + f" (max_parallel {rollout['max_parallel']}; bake checks: {checks or 'none'})"


__all__ = ["rollout_line"]
