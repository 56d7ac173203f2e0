"""The one lock policy: how anything that changes a store holds a model's lock.

A promotion's stages, the retention sweep and every verb that writes under a model (``retire``,
``store repair``, ``store push``...) hold that model's lock for the whole change, and:

- never waits for another holder (``wait=0``): a lock held by a running promotion is a
  ``StorageError`` naming its holder at once, not a hang;
- takes the lease the settings give (``MLREG_LOCK_LEASE``), renewed while held;
- never hides a failed release: the store notes where a lock was left (``session.lock_notes``), and
  an ``MlregError`` leaving the block says so in its message (:func:`noting_unreleased`).

Use :func:`model_lock` for one model and :func:`models_locked` for several (taken in the order
given, released in reverse).  A promotion (``pipelines/promote/stages.py``) and the retention sweep
take theirs with :func:`held` into their own ``ExitStack``: a failed promotion reports the lock
notes itself (``pipelines/promote/failure.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from registry.errors import MlregError
from registry.settings import DEFAULT_LOCK_LEASE, Settings

if TYPE_CHECKING:
    from pipelines.storage.lease import Lease
    from pipelines.storage.session import StoreSession

WAIT_S = 0.0  # a verb never queues behind another holder: it says who holds the lock


def lease_of(settings: Settings | None) -> float:
    """The lease a verb's lock takes: the settings' (``MLREG_LOCK_LEASE``), else the default."""
    return DEFAULT_LOCK_LEASE if settings is None else settings.lock_lease


def held(
    session: StoreSession, model: str, settings: Settings | None = None
) -> AbstractContextManager[Lease]:
    """``model``'s lock in ``session`` under the policy: no wait, the settings' lease."""
    return session.lock(model, ttl=lease_of(settings), wait=WAIT_S)


@contextlib.contextmanager
def noting_unreleased(session: StoreSession) -> Iterator[None]:
    """An ``MlregError`` leaving the block names each lock the session could not release."""
    try:
        yield
    except MlregError as exc:
        exc.message += "".join(f"; {note}" for note in session.lock_notes)
        raise


@contextlib.contextmanager
def model_lock(session: StoreSession, model: str, settings: Settings | None = None) -> Iterator[Lease]:
    """Hold ``model``'s lock in ``session`` under the policy above."""
    with noting_unreleased(session), held(session, model, settings) as lease:
        yield lease


@contextlib.contextmanager
def models_locked(
    session: StoreSession, models: Iterable[str], settings: Settings | None = None
) -> Iterator[list[Lease]]:
    """Hold the lock of every model of ``models`` (in that order) under the policy above."""
    with noting_unreleased(session), contextlib.ExitStack() as stack:
        yield [stack.enter_context(held(session, model, settings)) for model in models]


__all__ = ["WAIT_S", "held", "lease_of", "model_lock", "models_locked", "noting_unreleased"]
