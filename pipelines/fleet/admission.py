"""Which loads the fleet sends (``Admission``): a replica fenced off is never loaded again in this
promotion, the stored files a load names are verified first, and the load guard (memory headroom
and leaks: pipelines/guards/headroom.py) is asked before and told after each load.
"""

from __future__ import annotations

from typing import Protocol

from pipelines.core.changes import Change
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError, PromotionError


class LoadGuard(Protocol):
    """What checks a replica around each load (pipelines/guards/headroom.py): ``before_load``
    raises (an ``MlregError`` naming the replica and the fix) to refuse a load before anything is
    sent; ``after_load`` hears how it went (``error`` None: every wanted version READY) and returns
    why the replica must not be loaded again in this promotion ("" when it may)."""

    def before_load(self, url: str, change: Change) -> None: ...

    def after_load(self, url: str, change: Change, error: MlregError | None) -> str: ...


class Admission:
    """``guard``: asked around each load (None: none); ``fenced``: url -> why nothing loads there
    again in this promotion."""

    def __init__(self, store: RepositoryStore) -> None:
        self.store = store
        self.guard: LoadGuard | None = None
        self.fenced: dict[str, str] = {}

    def admit(self, url: str, change: Change) -> None:
        """Raise before anything is sent when ``url`` is fenced off, a stored version the load names
        does not verify, or the guard refuses it."""
        if url in self.fenced:
            raise PromotionError(
                f"{url} is fenced off for this promotion: {self.fenced[url]}",
                fix="restart that replica (its memory comes back), then promote again",
            )
        if change.config is not None and change.versions and change.files is None:
            self.store.verify_load(change.model, change.versions, change.config)  # every one it names
        if self.guard is not None and change.config is not None:
            self.guard.before_load(url, change)

    def loaded(self, url: str, change: Change, error: MlregError | None) -> None:
        """The guard told how a load of ``change`` at ``url`` went (``error`` None: it went well);
        the replica fenced off when the guard says why it must not be loaded again."""
        if self.guard is None or change.config is None:
            return
        why = self.guard.after_load(url, change, error)
        if why:
            self.fenced.setdefault(url, why)
