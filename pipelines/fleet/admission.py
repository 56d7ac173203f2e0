"""Which loads the fleet sends (``Admission``): a replica fenced off is never loaded again in this
promotion, the stored files a load names are verified first, and each load guard (the registered
guards' parts in this promotion: memory headroom and leaks, pipelines/guards/headroom.py) is asked
before and told after each load, in the registry's order.
"""

from __future__ import annotations

from pipelines.core.changes import Change
from pipelines.core.check import LoadGuard
from pipelines.storage.base import Repository
from registry.errors import MlregError, PromotionError


class Admission:
    """``guards``: asked around each load, in order (``LoadGuard``: pipelines/core/check.py; the
    runner sets them from the registered guards); ``fenced``: url -> why nothing loads there again
    in this promotion."""

    def __init__(self, store: Repository) -> None:
        self.store = store
        self.guards: list[LoadGuard] = []
        self.fenced: dict[str, str] = {}

    def admit(self, url: str, change: Change) -> None:
        """Raise before anything is sent when ``url`` is fenced off, a stored version the load names
        does not verify, or a guard refuses it (the guards after it are not asked)."""
        if url in self.fenced:
            raise PromotionError(
                f"{url} is fenced off for this promotion: {self.fenced[url]}",
                fix="restart that replica (its memory comes back), then promote again",
            )
        if change.config is not None and change.versions and change.files is None:
            self.store.versions.verify_load(change.model, change.versions, change.config)  # all it names
        if change.config is not None:
            for guard in self.guards:
                guard.before_load(url, change)

    def loaded(self, url: str, change: Change, error: MlregError | None) -> None:
        """Every guard told how a load of ``change`` at ``url`` went (``error`` None: it went well);
        the replica fenced off when one says why it must not be loaded again (the first one's why)."""
        if change.config is None:
            return
        for guard in self.guards:
            why = guard.after_load(url, change, error)
            if why:
                self.fenced.setdefault(url, why)
