"""The versions a load re-created while they served (``Recreations``).

Triton re-creates a loaded version whose config changed beyond version_policy/instance_group, or
whose files changed: it keeps its number and serves again, but from a new instance.  Its
statistics say so: the requests it answered start again from zero.  A load that keeps serving
versions is told here before (``before``: their counts) and after (``after``: a count that went
down is a version re-created); ``notes`` says each one.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines.core.ports import ServingTarget
from registry.errors import MlregError


class Recreations:
    """``found``: (url, model, version) of each version a load of this promotion re-created."""

    def __init__(self, target: Callable[[str], ServingTarget]) -> None:
        self.target = target
        self.found: dict[tuple[str, str, str], None] = {}

    def before(self, url: str, model: str, kept: list[str]) -> dict[str, int]:
        """The requests each version of ``model`` at ``url`` has answered, when a load keeps
        serving ``kept`` ({}: none kept, nothing asked)."""
        return self.served(url, model) if kept else {}

    def after(self, url: str, model: str, kept: list[str], served: dict[str, int]) -> None:
        """The versions a load kept serving whose counters restarted: Triton made them anew."""
        if not served:
            return
        now = self.served(url, model)
        for version in kept:
            if served.get(version, 0) > now.get(version, 0):
                self.found[(url, model, version)] = None

    def served(self, url: str, model: str) -> dict[str, int]:
        """version -> requests it answered (Triton's statistics, which a version re-created by a
        load starts again from zero; {} when the server does not say)."""
        try:
            stats = self.target(url).statistics(model)
        except MlregError:
            return {}
        counts = {}
        for entry in stats:
            if entry.get("name") == model:
                answered = entry.get("inference_stats") or {}
                counts[str(entry.get("version", ""))] = sum(
                    int((answered.get(kind) or {}).get("count", 0) or 0) for kind in ("success", "fail")
                )
        return counts

    def notes(self) -> list[str]:
        """One line per version a load of this promotion re-created while it served."""
        return [
            f"{url}: the load re-created {model} v{version}, which was serving (its statistics "
            "restarted): Triton re-creates a loaded version whose config changed beyond "
            "version_policy/instance_group, or whose files changed"
            for url, model, version in self.found
        ]
