"""``mlreg store init``: make a store a repository Triton can start on (its root marker file).

Triton refuses to start on an S3 prefix that holds no object; a file at the root is never taken
for a model.  Writing it again is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlreg.ops.context import open_store
from pipelines.storage.base import ROOT_MARKER


@dataclass
class InitReport:
    store: str
    created: bool  # False: the marker was there already
    marker: str = ROOT_MARKER

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "marker": self.marker, "created": self.created}


def store_init(uri: str | None) -> InitReport:
    """Write the root marker into the store at ``uri`` (default: the local repository)."""
    target = open_store(uri)
    return InitReport(target.uri, target.init_root())


__all__ = ["InitReport", "store_init"]
