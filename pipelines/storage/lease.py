"""A model's lock and its lease: who holds it, until when, judged by the store's clock.

The lock object (``.mlreg-lock.<model>.json`` at the root) names its holder, a token that is this
holder's alone, and the lease in seconds.  The lease runs from the object's LastModified (S3) or
mtime (a local folder) -- set by the store, not by a host whose clock may be behind -- and is
compared with the store's clock now (S3: the ``Date`` of the response).  Lock objects written
before leases (``expires_at`` only) are judged by that time on the host's clock.

While held, a :class:`Lease` renews itself every third of the lease on a small thread, and
``RepositoryStore.write_config`` renews it before each config write of the model.  A renewal is a
compare-and-swap on the object read at the last renewal: when another process took the lock over
meanwhile (the lease ran out while this holder was frozen or cut off), the swap fails, the lease is
lost for good, and every later renewal -- so every config write -- raises :class:`StorageError`.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from registry.errors import StorageError

log = logging.getLogger(__name__)

LockState = tuple[bytes, str, float | None, float | None]  # bytes, token, written at, store's now


class LockStore(Protocol):
    """What a lease needs of its store (``RepositoryStore`` has it)."""

    uri: str

    def lock_state(self, key: str) -> LockState | None: ...

    def replace(self, key: str, data: bytes, token: str) -> bool: ...

    def delete_if_unchanged(self, key: str, token: str) -> None: ...


def when(epoch: float) -> str:
    """A date people read in lock messages (UTC)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@dataclass
class LockInfo:
    """A lock as read from the store; times are the store's clock where it tells (``clock``)."""

    owner: str
    expires_at: float
    model: str = ""
    token: str = ""
    since: float | None = None  # when the store last wrote the lock object (taken or renewed)
    now: float | None = None  # the store's clock when it was read
    clock: str = "host"  # "store": judged by the store's clock

    @property
    def stale(self) -> bool:
        """The lease ran out, or the holder is a process of this machine that no longer runs."""
        if (self.now if self.now is not None else time.time()) > self.expires_at:
            return True
        host, _, pid = self.owner.rpartition("@")[2].partition(":")
        if host == socket.gethostname() and pid.isdigit():
            return not Path(f"/proc/{pid}").exists() or _zombie(int(pid))
        return False

    def describe(self) -> str:
        renewed = f" since {when(self.since)}," if self.since is not None else ""
        clock = "the store's clock" if self.clock == "store" else "the holder's clock"
        return f"{self.owner}{renewed} lease until {when(self.expires_at)} ({clock})"

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "owner": self.owner,
            "renewed_at": when(self.since) if self.since is not None else None,
            "lease_until": when(self.expires_at),
            "clock": self.clock,
            "stale": self.stale,
        }


def parse_lock(
    model: str, data: bytes, token: str = "", since: float | None = None, now: float | None = None
) -> LockInfo:
    """The lock object's holder and lease; an unreadable object is stale (taken over by CAS)."""
    try:
        raw = json.loads(data)
        owner = str(raw["owner"])
        ttl = raw.get("ttl")
        if ttl is not None and since is not None:
            return LockInfo(owner, since + float(ttl), model, str(raw.get("token", "")), since, now, "store")
        return LockInfo(owner, float(raw["expires_at"]), model, str(raw.get("token", "")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return LockInfo("(unreadable lock)", 0.0, model)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in {"Z", "X"}
    except OSError:
        return True


class Lease:
    """This process's hold on one model's lock, renewed while held (see the module's docstring)."""

    def __init__(self, store: LockStore, key: str, model: str, owner: str, ttl: float) -> None:
        self.store, self.model, self.owner, self.ttl = store, model, owner, ttl
        self.key = key
        self.token = secrets.token_hex(12)
        self.expires_at = time.time() + ttl  # refined from the store's clock at each renewal
        self.lost: str = ""
        self._seen = ""  # the lock object's token at the last write: what a renewal swaps
        self._renewals = 0
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def payload(self) -> bytes:
        return json.dumps(
            {
                "owner": self.owner,
                "token": self.token,
                "ttl": self.ttl,
                "expires_at": time.time() + self.ttl,  # the holder's clock: for older readers
                "renewal": self._renewals,
            }
        ).encode()

    def held(self) -> None:
        """Just taken: remember the object written, start renewing it."""
        self._remember()
        if self.ttl > 0:
            self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.model}", daemon=True)
            self._thread.start()

    def _remember(self) -> None:
        found = self.store.lock_state(self.key)
        if found is None or parse_lock(self.model, found[0]).token != self.token:
            self._lose(found)
            return
        self._seen = found[1]
        info = parse_lock(self.model, *found)
        self.expires_at = info.expires_at

    def _lose(self, found: LockState | None) -> None:
        if found is None:
            holder = "nobody holds it now (its lock object was removed)"
        else:
            info = parse_lock(self.model, *found)
            holder = f"it is held by {info.describe()}"
        self.lost = (
            f"{self.store.uri}: the lock of model '{self.model}' was lost: {holder}; this process's "
            f"lease ran until {when(self.expires_at)}"
        )

    def renew(self) -> None:
        """Renew the lease now; StorageError when the lock is no longer this holder's."""
        with self._mutex:
            if not self.lost:
                self._renewals += 1
                if self.store.replace(self.key, self.payload(), self._seen):
                    self._remember()
                else:
                    self._lose(self.store.lock_state(self.key))
            if self.lost:
                raise StorageError(
                    self.lost + "; stopped before writing anything more",
                    fix="see what the other holder did ('mlreg status'), then rerun the promotion",
                    model=self.model,
                )

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except StorageError as exc:
                if self.lost:
                    log.warning("%s", exc.message)
                    return
                log.info("renewing the lock of %s failed (retried): %s", self.model, exc.message)

    def release(self) -> str:
        """Stop renewing and delete the lock object if it is still this holder's; what could not
        be released is returned as a note (never raised), else ""."""
        self._stop.set()  # a renewal under way finishes first (the mutex)
        with self._mutex:
            if self.lost:
                return ""  # another holder's now: not ours to delete
            try:
                found = self.store.lock_state(self.key)
                if found is not None and parse_lock(self.model, found[0]).token == self.token:
                    self.store.delete_if_unchanged(self.key, found[1])
            except StorageError as exc:
                return (
                    f"the lock of '{self.model}' was left at {self.store.uri.rstrip('/')}/{self.key} "
                    f"({exc.message}); it expires by itself at {when(self.expires_at)} (the store's "
                    f"clock), or run 'mlreg store unlock {self.model}' then"
                )
        return ""
