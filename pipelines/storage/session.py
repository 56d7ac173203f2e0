"""A store session: what one operation (a promotion, a push, a gc) holds on a store.

The locks it took and their leases (:mod:`pipelines.storage.lease`), the leases it lost, the
configs it wrote, the change journal (every key it wrote or deleted, or may have: the request
reached the store) and the locks it could not release.  Every write or delete through the store
is fenced first (:meth:`StoreSession.fence`): refused once the model's lock was lost.  An
archive's session is fenced by its store's leases (``holder``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pipelines.storage.lease import Lease, LockInfo, parse_lock, remove_lock
from pipelines.storage.objects import CONFIG, LOCK_PREFIX, ObjectStore, check_part, lock_key
from registry.errors import StorageError

LEASE_S = 900.0  # a lock's lease; renewed every third of it while held


def default_owner() -> str:
    return f"{os.environ.get('USER', 'user')}@{socket.gethostname()}:{os.getpid()}"


class StoreSession:
    """One operation's locks, leases and change journal on ``store``."""

    def __init__(self, store: ObjectStore, holder: StoreSession | None = None) -> None:
        self.store = store
        self.holder: StoreSession = holder or self  # whose leases fence this session's writes
        self.written_configs: dict[str, str] = {}  # the last config written for each model
        self.leases: dict[str, Lease] = {}  # the locks held now
        self.lost_leases: dict[str, Lease] = {}  # lost and released: writes stay refused
        self.changed_keys: set[str] = set()  # written or deleted (or may have been)
        self.lock_notes: list[str] = []  # locks that could not be released: where each was left

    # -- the change journal ----------------------------------------------------------------------

    def note_change(self, key: str) -> bool:
        """Before a write or delete of ``key``: fenced under a locked model, then journaled; True
        when ``key`` was not in the journal yet."""
        if key.startswith(LOCK_PREFIX):
            return False
        self.fence(key.split("/", 1)[0], key)
        new = key not in self.changed_keys
        self.changed_keys.add(key)
        return new

    def unsent_change(self, key: str) -> None:
        self.changed_keys.discard(key)

    def changed_under(self, prefix: str) -> bool:
        """Whether this session changed anything under ``prefix`` (nothing: no rollback)."""
        return any(key.startswith(prefix) for key in self.changed_keys)

    # -- fencing -----------------------------------------------------------------------------------

    def fence(self, model: str, key: str = "") -> None:
        """Before a write or delete of ``key`` under ``model`` (its archive's copy included): a
        StorageError naming who holds the lock now when this session's holder held ``model``'s lock
        and lost it, or its lease is past its end (another holder's, or soon: nothing of it is
        changed from here, a rollback included).  A held lease is proven again first (a
        compare-and-swap renewal) when its last proof is older than a few seconds (lease.RECHECK_S)."""
        lease = self.holder.leases.get(model) or self.holder.lost_leases.get(model)
        if lease is not None:
            lease.check(key)

    def fenced(self, proven_only: bool = False) -> list[str]:
        """One line per model whose lock this session held and lost ("lock of scorer lost: now held
        by <holder>", "lock of scorer lost: lease ran out at <when>"); empty while every lease is
        held.  Asks the store (a renewal) only for leases not known lost; never raises: a store
        that cannot be reached proves nothing, and its lease counts as lost from then on ("lock of
        scorer lost: not proven, the store could not be reached (<why>)").  ``proven_only``: only
        the leases known lost to time or to another holder, not those the store could not be asked
        about (no one else can hold those before their end)."""
        leases = {**self.lost_leases, **self.leases}
        lines = [(lease, line) for _, lease in sorted(leases.items()) if (line := lease.prove())]
        return [line for lease, line in lines if not (proven_only and lease.unproven)]

    def renew_leases(self) -> None:
        """Renew every lease held now; StorageError when one was lost."""
        for lease in list(self.leases.values()):
            lease.renew()

    def write_config(self, model: str, text: str) -> None:
        """Written only while this session still holds ``model``'s lock, when it took it: the lease
        is renewed first (compare-and-swap on the lock object), and a lost lock aborts the write.

        Where the store's times are coarse (``ObjectStore.write_stamp``: S3), written so that its
        LastModified is later than the config it replaces: Triton (2.51) takes a model folder whose
        newest LastModified (whole seconds) did not grow since its last load as unchanged, and a
        load of it is a no-op -- so a promotion within the same second as the previous one's last
        config write would not load (seen here: back-to-back promotions of a small model).  Costs
        two HEADs, and a wait of under a second only in that case."""
        key = f"{check_part(model, 'model name')}/{CONFIG}"
        before = self.store.write_stamp(key)
        while True:
            lease = self.leases.get(model)
            if lease is not None:
                lease.renew(key)
            self.store.write(key, text.encode("utf-8"))
            self.written_configs[model] = text
            after = self.store.write_stamp(key)
            if before is None or after is None or after > before:
                return
            time.sleep(max(0.05, 1.0 - (time.time() % 1.0)))  # to the next whole second

    # -- locks -------------------------------------------------------------------------------------

    @contextmanager
    def lock(
        self, model: str, owner: str | None = None, ttl: float = LEASE_S, wait: float = 0.0
    ) -> Iterator[Lease]:
        """Hold ``model``'s lock; wait up to ``wait`` seconds for another holder, take stale ones.

        The lease (``ttl`` seconds, judged by the store's clock: the lock object's LastModified) is
        renewed by a thread every third of it while held, and by every config write of the model.
        A stale lock (lease run out, or its holder on this machine is gone) is taken over with a
        compare-and-swap on the lock object itself, so of two processes taking over the same
        stale lock exactly one wins.  A release that fails (the store unreachable) is noted in
        ``lock_notes``, never raised: it must not hide what the holder was doing.  While held, and
        after it was lost, every write under the model is fenced (:meth:`fence`)."""
        check_part(model, "model name")
        lease = Lease(self.store, lock_key(model), model, owner or default_owner(), ttl)
        self._take(lease, time.monotonic() + wait)
        try:  # from here the lock object is ours: released whatever happens (held()'s read included)
            lease.held()
            self.leases[model] = lease
            self.lost_leases.pop(model, None)
            yield lease
        finally:
            self.leases.pop(model, None)
            note = lease.release()
            if note:
                self.lock_notes.append(note)
            if lease.lost:
                self.lost_leases[model] = lease  # still fenced: another holder's, or nobody's

    def _take(self, lease: Lease, deadline: float) -> None:
        """Create the lock object, or take a stale one over (compare-and-swap); wait for a live one
        until ``deadline`` (monotonic), then StorageError naming its holder."""
        store, key, model = self.store, lease.key, lease.model
        while not store.create(key, lease.payload()):
            found = store.lock_state(key)
            if found is None:
                continue  # released meanwhile: race for it again
            held = parse_lock(model, *found)
            if held.stale:
                if store.replace(key, lease.payload(), found[1]):
                    return  # taken over
                continue
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"{store.uri}: model '{model}' is locked by {held.describe()}",
                    fix="wait for that promotion to finish; a crashed holder's lock expires by itself "
                    "(or 'mlreg store unlock MODEL' once its lease ran out)",
                    model=model,
                    holder=held.owner,
                )
            time.sleep(0.2)

    def read_lock(self, model: str) -> LockInfo | None:
        found = self.store.lock_state(lock_key(model))
        return None if found is None else parse_lock(model, *found)

    def locks(self) -> list[LockInfo]:
        """Every lock at the root, with its holder and its lease (the store's clock)."""
        return [info for model in self.store.lock_models() if (info := self.read_lock(model)) is not None]

    def unlock(self, model: str, force: str = "") -> LockInfo:
        return remove_lock(self.store, lock_key(check_part(model, "model name")), model, force)
