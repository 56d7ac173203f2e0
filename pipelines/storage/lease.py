"""A model's lock and its lease: who holds it, until when, judged by the store's clock.

The lock object (``.mlreg-lock.<model>.json`` at the root) names its holder, a token that is this
holder's alone, and the lease in seconds.  The lease runs from the object's LastModified (S3) or
mtime (a local folder) -- set by the store, not by a host whose clock may be behind -- and is
compared with the store's clock now (S3: the ``Date`` of the response).  Lock objects written
before leases (``expires_at`` only) are judged by that time on the host's clock.

While held, a :class:`Lease` renews itself every third of the lease on a small thread, and
``StoreSession.write_config`` renews it before each config write of the model.  A renewal is a
compare-and-swap on the object read at the last renewal (S3: a put with ``If-Match`` on its ETag,
which moto 5.2 honours too: 412 PreconditionFailed): when another process took the lock over
meanwhile (the lease ran out while this holder was frozen or cut off), the swap fails, the lease is
lost for good, and every later renewal -- so every config write -- raises :class:`StorageError`.

The fence (``StoreSession.note_change``, before every write or delete under the model, its
archive included): a lost lease refuses the write, naming who holds the lock now; a held one is
proven again (a renewal) when its last proof is older than ``RECHECK_S`` (or a third of the lease).

A lease that ran out is never renewed, so a renewal delivered late cannot bring it back:

- this process keeps, on its own monotonic clock, a time by which the lease surely still lasts
  (the send of the write the store holds, plus the lease; or the store's own remaining time, read
  after it); past it, nothing is sent: the lease is lost, the store only read to say who holds it;
- each renewal carries ``renew_by``, the end of the lease it renews by the store's clock; a
  renewal that landed after it (its LastModified later: a request queued in a frozen store and
  delivered after the thaw) renews nothing -- every reader, this holder included, judges the lock
  run out at ``renew_by``;
- once lost or released, a lease writes nothing more; its release only deletes a lock object that
  still carries its own token (one its late renewal left), never another holder's.

A lock whose time lies ahead of the clock judging it (a local folder's mtime written by a host
whose clock runs ahead, or a file touched or copied from one) looks alive until that clock's time
is reached -- days, maybe.  It is never taken for stale (its holder may run), but it is named as
clock skew, and ``remove_lock`` with ``force`` naming its holder removes it (`mlreg store unlock
MODEL --force HOLDER`).
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

from registry.errors import MlregError, StorageError

log = logging.getLogger(__name__)

RECHECK_S = 5.0  # before a write under a locked model, its lease is proven again when older than this
SKEW_S = 5.0  # a lock written further ahead of the clock judging it was written by a clock ahead

LockState = tuple[bytes, str, float | None, float | None]  # bytes, token, written at, store's now


class LockStore(Protocol):
    """What a lease needs of its store (an ``ObjectStore`` has it)."""

    uri: str

    def lock_state(self, key: str) -> LockState | None: ...

    def replace(self, key: str, data: bytes, token: str) -> bool: ...

    def delete_if_unchanged(self, key: str, token: str) -> None: ...


def when(epoch: float) -> str:
    """A date people read in lock messages (UTC)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def span(seconds: float) -> str:
    """A duration people read: "42 s", "17 min", "30 h", "2 days"."""
    if seconds >= 36 * 3600:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


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
        return bool(self.holder_gone)

    @property
    def holder_gone(self) -> str:
        """Why the holder cannot hold it any more though its lease has not ended ("" when it may):
        a process of this machine that no longer runs."""
        host, _, pid = self.owner.rpartition("@")[2].partition(":")
        if host == socket.gethostname() and pid.isdigit():
            if not Path(f"/proc/{pid}").exists() or _zombie(int(pid)):
                return f"its holder, process {pid} of this machine, no longer runs"
        return ""

    @property
    def skew(self) -> float:
        """How far the lock's time (when the store last wrote it) lies ahead of the clock judging
        it now: written by a clock ahead (a host's on a shared folder, or a file copied or touched
        from one), its lease looks alive until that clock's time is reached -- days, maybe.  0: not
        ahead (by more than ``SKEW_S``)."""
        if self.since is None:
            return 0.0
        ahead = self.since - (self.now if self.now is not None else time.time())
        return ahead if ahead > SKEW_S else 0.0

    def describe(self) -> str:
        renewed = f" since {when(self.since)}," if self.since is not None else ""
        clock = "the store's clock" if self.clock == "store" else "the holder's clock"
        now = self.now if self.now is not None else time.time()
        ends = "lease ran out at" if now >= self.expires_at else "lease until"
        skew = f"; {self.skew_line()}" if self.skew else ""
        gone = f"; {self.holder_gone}" if now < self.expires_at and self.holder_gone else ""
        return f"{self.owner}{renewed} {ends} {when(self.expires_at)} ({clock}){skew}{gone}"

    def skew_line(self) -> str:
        """ "the lock's time lies 2 days in the future (clock skew: a clock ahead wrote it)"."""
        return f"the lock's time lies {span(self.skew)} in the future (clock skew: a clock ahead wrote it)"

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "owner": self.owner,
            "renewed_at": when(self.since) if self.since is not None else None,
            "lease_until": when(self.expires_at),
            "clock": self.clock,
            "stale": self.stale,
            "skew_seconds": round(self.skew),  # its time ahead of the clock judging it (0: none)
        }


def parse_lock(
    model: str, data: bytes, token: str = "", since: float | None = None, now: float | None = None
) -> LockInfo:
    """The lock object's holder and lease; an unreadable object is stale (taken over by CAS)."""
    try:
        raw = json.loads(data)
        owner = str(raw["owner"])
        ttl, renew_by = raw.get("ttl"), raw.get("renew_by")
        if ttl is not None and since is not None:
            end = since + float(ttl)
            if renew_by is not None and since > float(renew_by):
                end = float(renew_by)  # a renewal that landed after the lease it renews had run out
            return LockInfo(owner, end, model, str(raw.get("token", "")), since, now, "store")
        return LockInfo(owner, float(raw["expires_at"]), model, str(raw.get("token", "")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return LockInfo("(unreadable lock)", 0.0, model)


def remove_lock(store: LockStore, key: str, model: str, force: str = "") -> LockInfo:
    """Remove ``model``'s lock (the object ``key``) once its holder's lease ran out (or the
    holder, on this machine, is gone); with ``force`` naming the holder the lock names, whatever
    its lease says (a lock written by a clock ahead looks alive until that clock's time).  Only the
    lock as read is deleted (compare-and-delete): one taken over meanwhile stays.  StorageError
    when there is none, while its lease is alive, or when ``force`` names another holder."""
    found = store.lock_state(key)
    if found is None:
        raise StorageError(f"{store.uri}: model '{model}' is not locked", fix="nothing to do", model=model)
    held = parse_lock(model, *found)
    if force and force != held.owner:
        raise StorageError(
            f"{store.uri}: the lock of '{model}' is held by {held.describe()}, not by '{force}': "
            "nothing was removed",
            fix=f"--force takes the holder the lock names ('mlreg store ls' lists it); pass '{held.owner}' "
            "only once you know no promotion of it runs",
            model=model,
            holder=held.owner,
        )
    if not held.stale and not force:
        raise StorageError(
            f"{store.uri}: model '{model}' is locked by {held.describe()}; its lease is alive",
            fix=_alive_fix(model, held),
            model=model,
            holder=held.owner,
        )
    store.delete_if_unchanged(key, found[1])
    return held


def _alive_fix(model: str, held: LockInfo) -> str:
    force = f"'mlreg store unlock {model} --force {held.owner}' (same --store or --env)"
    if held.skew:
        return (
            f"a clock ahead wrote this lock, so its lease would look alive for {span(held.skew)} more: "
            f"once you know no promotion of '{model}' runs at {held.owner}, remove it with {force}"
        )
    return (
        "wait for that promotion to finish, or for its lease to run out (a holder that stopped "
        f"renewing it), then run 'mlreg store unlock' again; a holder you know is gone: {force}"
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in {"Z", "X"}
    except OSError:
        return True


def _renewal_of(data: bytes) -> int | None:
    """The renewal number a lock object was written with (None: unreadable, or none)."""
    try:
        number = json.loads(data).get("renewal")
    except (ValueError, AttributeError):
        return None
    return number if isinstance(number, int) else None


class Lease:
    """This process's hold on one model's lock, renewed while held (see the module's docstring)."""

    def __init__(self, store: LockStore, key: str, model: str, owner: str, ttl: float) -> None:
        self.store, self.model, self.owner, self.ttl = store, model, owner, ttl
        self.key = key
        self.token = secrets.token_hex(12)
        self.expires_at = time.time() + ttl  # the store's clock once read back (at each renewal)
        self.lost: str = ""  # why the lock is no longer this holder's, in full
        self.line: str = ""  # the same in one line ("lock of M lost: ..."): StoreSession.fenced()
        self.taken_by: str = ""  # the holder that took it over (LockInfo.describe()), when one did
        self.unproven = False  # lost only because the store could not be asked (prove)
        self._ends = time.monotonic() + ttl  # this process's clock: the lease surely lasts until then
        self._proven = time.monotonic()  # when the last proof of the lease began
        self._renew_by: float | None = None  # the store's time by which a renewal must land
        self._sent: dict[int, float] = {}  # renewal number -> when it was first sent (monotonic)
        self._seen = ""  # the lock object's token at the last write: what a renewal swaps
        self._renewals = 0
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def payload(self) -> bytes:
        """The lock object to write now (called right before each write of it)."""
        self._sent.setdefault(self._renewals, time.monotonic())
        body: dict[str, object] = {
            "owner": self.owner,
            "token": self.token,
            "ttl": self.ttl,
            "expires_at": time.time() + self.ttl,  # the holder's clock: for older readers
            "renewal": self._renewals,
        }
        if self._renew_by is not None:
            body["renew_by"] = self._renew_by  # landing later renews nothing (parse_lock)
        return json.dumps(body).encode()

    def held(self) -> None:
        """Just taken: remember the object written, start renewing it."""
        self._remember(time.monotonic())
        if self.ttl > 0 and not self.lost:
            self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.model}", daemon=True)
            self._thread.start()

    # -- proving the lease (a compare-and-swap renewal), under the mutex --------------------------

    def renew(self, key: str = "") -> None:
        """Renew the lease now (before writing ``key``, when given); StorageError when the lock is
        no longer this holder's, or its lease ran out before it could be renewed (nothing sent)."""
        self._prove(force=True)
        if self.lost:
            raise self.error(key)

    def check(self, key: str = "") -> None:
        """Before a write or delete of ``key`` under the model: StorageError once the lease is lost
        or past its end; proven again (a renewal) when its last proof is older than RECHECK_S or a
        third of the lease."""
        self._prove(force=False)
        if self.lost:
            raise self.error(key)

    def prove(self) -> str:
        """Ask the store now (a renewal) unless the lease is known lost; never raises.  Returns the
        one line saying how it was lost, "" while held.  A store that cannot be reached proves
        nothing: the lease counts as lost (this holder must not write on a lock it cannot show)."""
        try:
            self._prove(force=True)
        except Exception as exc:  # any failure to prove it is reported, never raised
            why = exc.message if isinstance(exc, MlregError) else f"{type(exc).__name__}: {exc}"
            self.unproven = not self.lost
            self._lose(
                None,
                f"the store could not be reached to prove it is still held ({why})",
                f"not proven, the store could not be reached ({why})",
            )
        return self.line

    def _prove(self, force: bool) -> None:
        now = time.monotonic()
        if self.lost or (not force and now < self._ends and now - self._proven < self._recheck()):
            return  # proven a moment ago, and no other holder can take a lease before its end
        if not self._mutex.acquire(timeout=max(0.0, self._ends - time.monotonic())):
            self._run_out()  # a renewal still waits on the store past the lease's end: read only
            return
        try:
            if self.lost or self._stop.is_set():
                return  # lost or released: never written again
            if time.monotonic() >= self._ends:
                self._run_out()
            elif force or time.monotonic() - self._proven >= self._recheck():
                self._swap()
        finally:
            self._mutex.release()

    def _recheck(self) -> float:
        return min(RECHECK_S, self.ttl / 3)

    def _swap(self) -> None:
        self._renewals += 1
        started = time.monotonic()
        if self.store.replace(self.key, self.payload(), self._seen):
            self._remember(started)
            return
        found = self.store.lock_state(self.key)
        if found is not None and parse_lock(self.model, found[0]).token == self.token:
            self._remember(started, found)  # a write of ours landed after all: a retried request
        else:
            self._lose(found)

    def _run_out(self) -> None:
        """Past its end by this process's clock (or a renewal still waits on the store then): lost
        with nothing sent; the store is only read, to say who holds the lock now."""
        try:
            found = self.store.lock_state(self.key)
        except MlregError as exc:
            why, line = self._ended(self.expires_at, time.time())
            self._lose(None, f"{why} and the store cannot be read now ({exc.message})", line)
            return
        self._lose(found)

    def _ended(self, end: float, now: float) -> tuple[str, str]:
        """(why, line) of a lease of this holder's that is over for it: ran out when ``end`` is past
        (``now``: the store's clock where it tells), else not renewed within this process's own
        deadline for it though the lease itself ends later."""
        if now >= end:
            return f"its lease ran out at {when(end)}", f"lease ran out at {when(end)}"
        ahead = f"{when(end)} (in {span(end - now)})"
        return (
            f"it was not renewed within this process's own deadline for it (its lease ends at {ahead})",
            f"not renewed in time (its lease ends at {ahead})",
        )

    def _remember(self, started: float, found: LockState | None = None) -> None:
        """Read back what a write left (``started``: this process's clock before it): still this
        holder's object, and its lease not over by the store's clock -- else the lease is lost."""
        if found is None:
            found = self.store.lock_state(self.key)
        if self.lost:
            return  # given up meanwhile: it stays so
        if found is None or parse_lock(self.model, found[0]).token != self.token:
            self._lose(found)
            return
        info = parse_lock(self.model, *found)
        now = info.now if info.now is not None else time.time()
        if now >= info.expires_at:
            self._lose(found)  # ours, but over: a renewal that landed too late renews nothing
            return
        grain = float(getattr(self.store, "clock_grain", 0.0))  # S3's times are whole seconds
        self._seen, self.expires_at = found[1], info.expires_at
        self._renew_by = info.expires_at + grain if info.clock == "store" else None
        ends = started + (info.expires_at - now) - grain
        number = _renewal_of(found[0])
        sent = self._sent.get(number) if number is not None else None  # the store wrote it after
        self._ends = max(ends, sent + self.ttl) if sent is not None else ends
        self._proven = started
        for old in [n for n in self._sent if n < self._renewals - 8]:
            del self._sent[old]

    def _lose(self, found: LockState | None, why: str = "", line: str = "") -> None:
        """Lost for good (the first reason stays): nothing is written from here."""
        if self.lost:
            return
        if not why:
            if found is None:
                why = "nobody holds it now (its lock object was removed)"
                line = "its lock object was removed (nobody holds it now)"
            elif (info := parse_lock(self.model, *found)).token == self.token:
                end = info.expires_at if info.clock == "store" else self.expires_at  # the store's view
                now = info.now if info.now is not None else time.time()
                why, line = self._ended(end, now)
                if now >= end:
                    why += " before it was renewed"
            else:
                self.taken_by = info.describe()
                why, line = f"it is held by {self.taken_by}", f"now held by {self.taken_by}"
        ran = "ran until" if time.time() >= self.expires_at else "was to run until"
        self.lost = (
            f"{self.store.uri}: the lock of model '{self.model}' was lost: {why}; this process's "
            f"lease {ran} {when(self.expires_at)}"
        )
        self.line = f"lock of {self.model} lost: {line}"

    def error(self, key: str = "") -> StorageError:
        """The refusal of a lost lease: what it left, who holds the lock now, what to do."""
        left = f"; '{key}' left as it is" if key else "; stopped before writing anything more"
        if self.taken_by:
            fix = (
                f"the other promotion owns '{self.model}' now: run 'mlreg status' to see what it "
                "serves, and let it finish (this process changes nothing more of it)"
            )
        else:
            fix = "run 'mlreg status' to see what serves, then rerun the promotion (it takes the lock)"
        return StorageError(self.lost + left, fix=fix, model=self.model, key=key, holder=self.taken_by)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except MlregError as exc:
                if self.lost:
                    log.warning("%s", exc.message)
                    return
                log.warning(
                    "renewing the lock of %s failed (retried in %.0f s): %s; its lease ends at %s "
                    "(the store's clock) unless a renewal reaches the store",
                    self.model,
                    self.ttl / 3,
                    exc.message,
                    when(self.expires_at),
                )

    def release(self) -> str:
        """Stop renewing and delete the lock object if it still carries this holder's token (a lease
        that ran out, or a renewal of it that landed late, included; another holder's never); what
        could not be released is returned as a note (never raised), else ""."""
        self._stop.set()  # a renewal under way finishes first (the mutex); none is sent after
        with self._mutex:
            if self.taken_by:
                return ""  # another holder's now: not ours to delete
            try:
                found = self.store.lock_state(self.key)
                if found is not None and parse_lock(self.model, found[0]).token == self.token:
                    self.store.delete_if_unchanged(self.key, found[1])
            except StorageError as exc:
                where = f"{self.store.uri.rstrip('/')}/{self.key}"
                if time.time() >= self.expires_at:
                    then = f"its lease ran out at {when(self.expires_at)}: a rerun takes it over"
                else:
                    then = f"it expires by itself at {when(self.expires_at)} (the store's clock)"
                return (
                    f"the lock of '{self.model}' was left at {where} ({exc.message}); {then}, or run "
                    f"'mlreg store unlock {self.model}' then"
                )
        return ""
