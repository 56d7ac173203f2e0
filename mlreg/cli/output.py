"""The one output sink of the ``mlreg`` command, and where its failures are reported.

Commands never format text themselves: they hand results to an ``Output``
(:mod:`mlreg.cli.sink`), which prints either one JSON document (``--json``) or what people read.
Every failure, from a bad option to a closed pipe, is reported in one place
(:mod:`mlreg.cli.failures`: ``report``, called by ``MlregGroup.main``).  This module gathers both
under the one name commands import, and draws a promotion's roll-out on one line.

Importing this module stays cheap (``mlreg --help`` loads it): ``rich`` is imported only when a
table is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlreg.cli.sink import Output


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


__all__ = ["Output", "rollout_line"]
