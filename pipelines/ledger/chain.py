"""The ledger itself: where it lives beside a store, appending (a conditional create naming the
predecessor's hash), reading back, and verifying the chain.

Where: beside the repository, as the archive is (pipelines/storage/archive.py) and for the same
reason -- Triton lists every folder at its repository root as a model, and the closed world refuses
any unexpected entry under a model folder:

    <parent>/.mlreg-ledger/<store name>/events/000000000001.json ... and head.json

A store at the root of a bucket has no place beside it: its ledger is files at that root
(``.mlreg-ledger.events.<seq>.json``, ``.mlreg-ledger.head.json``), which Triton ignores as it
ignores the locks there.  The ledger is written through the bare object primitives
(``LocalObjects``/``S3Objects``), never through the repository's session: its writes are not
fenced by a model's lock, and no undo log can take one back.

Appending event ``n`` is ``create(events/n)`` -- S3 ``If-None-Match: *``, a local ``link`` that fails
when the name exists -- with ``prev`` = event ``n-1``'s hash inside.  Of two writers that read the
same head exactly one creates ``n``; the other reads the winner, checks it follows the head it knew,
and appends ``n+1`` after it.  The chain cannot fork: one object per position, each naming its
predecessor.  ``head.json`` (moved forward after each append, compare-and-swap) remembers the last
event, so removing or editing the last event is seen too.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.ledger.events import (
    GENESIS,
    HEX64,
    MAX_EVENT_BYTES,
    TIME,
    Event,
    Unreadable,
    canonical,
    check_event,
    decode,
    encode,
    now,
    strict_json,
)
from pipelines.storage.objects import ARCHIVE, ObjectStore
from registry.errors import StorageError

log = logging.getLogger(__name__)
LEDGER = ".mlreg-ledger"  # beside the store, as ARCHIVE is
MAX_EVENTS = 1_000_000  # events one verify or query reads
APPEND_WAIT_S = 30.0  # how long an append keeps trying behind other writers
SEQ_DIGITS = 12
POINTER_BYTES = 1024  # head.json, padded with spaces (its replica cut to POINTER_REPLICA characters)
POINTER_REPLICA = 128
MAX_GAP_FINDINGS = 1000  # removed positions named one by one in a gap; past it, one finding for the rest
assert ARCHIVE != LEDGER


@dataclass(frozen=True)
class Finding:
    """Something wrong with the chain: the position and, where known, the event's time and replica."""

    position: int
    time: str
    replica: str
    what: str

    def line(self) -> str:
        when = f" ({self.time}, replica {self.replica})" if self.time else ""
        return f"event {self.position}{when}: {self.what}"

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "time": self.time, "replica": self.replica, "what": self.what}


class Ledger:
    """The events of one store's replicas, in ``objects`` under ``prefix`` (see the module)."""

    def __init__(self, objects: ObjectStore, prefix: str, uri: str) -> None:
        self.objects = objects
        self.uri = uri
        self.events_prefix = f"{prefix}events." if prefix.endswith(".") else f"{prefix}events/"
        self.head_key = f"{prefix}head.json"
        self._head: Event | None = None  # the last event this object appended or read
        self._lock = threading.Lock()  # one append at a time from this process's threads

    def key(self, seq: int) -> str:
        return f"{self.events_prefix}{seq:0{SEQ_DIGITS}d}.json"

    # -- appending ---------------------------------------------------------------------------------

    def append(self, **fields: Any) -> Event:
        """Append one event (``fields``: every field of :class:`Event` but the chain's; ``time``
        optional: default now); returns it sealed.  StorageError when the chain cannot be extended: its last
        event was removed or edited, or other writers kept winning for ``APPEND_WAIT_S``."""
        with self._lock:
            head = self._head if self._head is not None else self._find_head()
            deadline = time.monotonic() + APPEND_WAIT_S
            while True:
                event = _next(head, fields)
                data = _readable(event)
                if self.objects.create(self.key(event.seq), data):
                    self._head = event
                    self._advance_pointer(event)
                    return event
                head = self._winner(event.seq, head)  # lost the race: append after the winner
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{self.uri}: no event appended within {APPEND_WAIT_S:.0f}s: other writers kept "
                        "appending first",
                        fix="rerun; 'mlreg ledger verify' checks the chain",
                    )

    def _winner(self, seq: int, head: Event | None) -> Event:
        """Event ``seq``, which another writer created first: it must follow ``head``."""
        winner = self._read(seq)
        if winner is None or winner.seq != seq or winner.prev != _hash(head):
            raise StorageError(
                f"{self.uri}: event {seq} does not follow event {seq - 1}: the ledger was changed",
                fix="run 'mlreg ledger verify' to see where",
            )
        return winner

    def _find_head(self) -> Event | None:
        """The last event: the one ``head.json`` names, checked, then any appended after it (a
        writer that stopped before moving ``head.json``); None for an empty ledger."""
        pointer = self._pointer()
        if pointer is None:
            seqs = self.seqs()
            if not seqs:
                return None
            head = self._read_checked(seqs[-1])
        else:
            head = self._read_checked(int(pointer["seq"]))
            if head.hash != pointer["hash"]:
                raise _changed(self.uri, head.seq, "it is not the event head.json names")
        while (after := self._read(head.seq + 1)) is not None:
            if after.prev != head.hash:
                raise _changed(self.uri, after.seq, f"it does not follow event {head.seq}")
            head = after
        return head

    def _read_checked(self, seq: int) -> Event:
        event = self._read(seq)
        if event is None:
            raise _changed(self.uri, seq, "it is missing")
        return event

    def _get(self, key: str) -> bytes | None:
        """An event's bytes; a local file bounded and never through a link (a link to /dev/zero
        or a huge file planted in the folder would be read whole): Unreadable for those."""
        from pipelines.storage.local import LocalObjects  # lazy: ~7 ms an S3 store never pays

        if isinstance(self.objects, LocalObjects):
            return _read_file(self.objects.root / key, MAX_EVENT_BYTES + 1)
        return self.objects.read(key)

    def _read(self, seq: int) -> Event | None:
        try:
            data = self._get(self.key(seq))
            if data is None:
                return None
            event = decode(data)
        except Unreadable as exc:
            raise _changed(self.uri, seq, f"it cannot be read ({exc})") from None
        if event.seq != seq:
            raise _changed(self.uri, seq, f"it holds event {event.seq}")
        return event

    def _pointer(self) -> dict[str, Any] | None:
        """head.json, None when absent or unreadable (a write cut short: the events are listed
        instead; ``verify`` names an edited pointer)."""
        found = self.objects.read_versioned(self.head_key)
        if found is None:
            return None
        try:
            return parse_pointer(found[0])
        except Unreadable as exc:
            log.warning("%s: head.json cannot be read (%s): the events are listed instead", self.uri, exc)
            return None

    def _advance_pointer(self, event: Event) -> None:
        """``head.json`` moved to ``event`` unless it already names a later one.  Not a
        compare-and-swap: of two writers racing, the pointer may name the one before the last for a
        moment -- it never names an event that is not there, and the next append moves it on."""
        from pipelines.storage.local import LocalObjects  # lazy: ~7 ms an S3 store never pays

        local = self.objects.root / self.head_key if isinstance(self.objects, LocalObjects) else None
        try:  # a local pointer read without its lock: a torn read is unreadable, then rewritten
            found = _read_file(local) if local is not None else self.objects.read(self.head_key)
            if found is not None and int(parse_pointer(found)["seq"]) >= event.seq:
                return
        except Unreadable:
            pass  # an unreadable pointer is replaced; verify names the events themselves
        if local is not None:
            overwrite(local, pointer_bytes(event))
        else:
            self.objects.write(self.head_key, pointer_bytes(event))

    # -- reading -----------------------------------------------------------------------------------

    def seqs(self) -> list[int]:
        """The positions stored (names that are not events are left out: ``verify`` names them)."""
        return sorted(s for s in (self._seq_of(k) for k in self._keys()) if s is not None)

    def _keys(self) -> list[str]:
        keys = self.objects.list_prefix(self.events_prefix)
        if len(keys) > MAX_EVENTS:
            raise StorageError(
                f"{self.uri}: the ledger holds {len(keys)} objects, more than the {MAX_EVENTS} read at once",
                fix="archive the ledger's oldest events elsewhere (they stay verifiable by their hashes)",
            )
        return keys

    def _seq_of(self, key: str) -> int | None:
        name = key[len(self.events_prefix) :]
        digits = name[: -len(".json")]
        if name.endswith(".json") and len(digits) == SEQ_DIGITS and digits.isdigit() and int(digits) > 0:
            return int(digits)
        return None

    def read_all(self) -> tuple[list[Event], list[Finding]]:
        """Every event that reads, in chain order, and every finding of :func:`verify_chain`."""
        keys = self._keys()
        found: dict[int, Event | str] = {}
        odd: list[str] = []
        for key in keys:
            seq = self._seq_of(key)
            if seq is None:
                odd.append(key)
                continue
            try:
                data = self._get(key)
                if data is None:
                    continue  # removed while listed: named as missing
                found[seq] = decode(data)
            except Unreadable as exc:
                found[seq] = str(exc)
        pointer: dict[str, Any] | str | None
        try:
            raw = self.objects.read_versioned(self.head_key)
            pointer = parse_pointer(raw[0]) if raw is not None else None
        except Unreadable as exc:
            pointer = str(exc)
        findings = verify_chain(found, pointer) + [
            Finding(0, "", "", f"'{k}' is not an event of the ledger (an object added beside them)")
            for k in odd
        ]
        # an event at a position it does not claim answers no question (it is named as reordered)
        return [e for s, e in sorted(found.items()) if isinstance(e, Event) and e.seq == s], findings


def _next(head: Event | None, fields: dict[str, Any]) -> Event:
    return Event(
        seq=(head.seq if head else 0) + 1,
        prev=_hash(head),
        prev_time=head.time if head else "",
        prev_replica=head.replica if head else "",
        **({"time": now()} | fields),
    ).sealed()


def _readable(event: Event) -> bytes:
    """The event's bytes, once they read back as the event (what verify will ask of them): an
    event no reader would take is never written."""
    try:
        check_event(event)
    except Unreadable as exc:
        raise StorageError(
            f"an event of {event.model} on {event.replica} is not one the ledger takes: {exc}",
            fix="report this as a bug",
        ) from None
    return encode(event)


def _hash(event: Event | None) -> str:
    return event.hash if event is not None else GENESIS


def _changed(uri: str, seq: int, why: str) -> StorageError:
    return StorageError(
        f"{uri}: the ledger's event {seq} was changed: {why}; nothing appended after it",
        fix="run 'mlreg ledger verify' to see every change, and find out who made it",
    )


def pointer_bytes(event: Event) -> bytes:
    replica = event.replica[:POINTER_REPLICA]
    data = canonical({"seq": event.seq, "hash": event.hash, "time": event.time, "replica": replica})
    return data + b" " * (POINTER_BYTES - len(data))  # one size: overwritten in place (``overwrite``)


def _read_file(path: Path, limit: int = POINTER_BYTES + 1) -> bytes | None:
    """A local file's first ``limit`` bytes, never through a link nor from anything but a regular
    file (neither is one mlreg wrote: Unreadable; ``overwrite`` refuses a linked pointer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unreadable(f"it cannot be opened as a file ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable("it is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def overwrite(path: Path, data: bytes) -> None:
    """``data`` written over the start of the local file ``path`` (made when missing), under an
    exclusive ``flock`` (readers take a shared one: ``LocalObjects.read_versioned``).  Neither a
    rename nor a truncate: on ext4 both flush the file's data first (auto_da_alloc), ~4 ms each
    here, most of an event's cost; every pointer has the same size, so nothing is left over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a link: a head.json linked elsewhere would have mlreg write over that file
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise StorageError(
            f"{path}: cannot write the ledger's head pointer: {exc.strerror} (a link is never followed)",
            fix=f"look at {path}: mlreg writes a plain file there; a link was put in by someone else",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, data, 0)
        if os.fstat(fd).st_size > len(data):  # a longer pointer of another size: its tail goes
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def parse_pointer(data: bytes) -> dict[str, Any]:
    raw = strict_json(data, POINTER_BYTES)
    if not isinstance(raw, dict) or set(raw) != {"seq", "hash", "time", "replica"}:
        raise Unreadable("not a head pointer")
    if type(raw["seq"]) is not int or raw["seq"] < 1 or not HEX64.match(str(raw["hash"])):
        raise Unreadable("its seq or hash is not one")
    if not isinstance(raw["time"], str) or not TIME.match(raw["time"]) or not isinstance(raw["replica"], str):
        raise Unreadable("its time or replica is not one")
    return raw


# -- verifying ----------------------------------------------------------------------------------


def verify_chain(found: dict[int, Event | str], pointer: dict[str, Any] | str | None) -> list[Finding]:
    """Every edited, removed or reordered event of ``found`` (position -> the event, or why its bytes
    are not one), and a last event removed or edited behind ``pointer`` (head.json)."""
    findings: list[Finding] = []
    last = max(found, default=0)
    position = 1
    while position <= last:  # bounded by len(found): a gap is skipped past, not walked (a planted
        findings.extend(_position(found, position))  # event may claim any 12-digit position)
        if position + 1 not in found and position + 1 <= last:
            position = _gap(found, position + 1, findings)
        else:
            position += 1
    findings.extend(_tail(found, last, pointer))
    return findings


def _gap(found: dict[int, Event | str], start: int, findings: list[Finding]) -> int:
    """The removed positions from ``start`` to the next one found, each named up to
    ``MAX_GAP_FINDINGS``, the rest in one finding; returns that next position."""
    end = min(p for p in found if p > start)
    named = min(end, start + MAX_GAP_FINDINGS)
    for position in range(start, named):
        findings.extend(_position(found, position))
    if named < end:
        findings.append(
            Finding(named, "", "", f"removed: positions {named} to {end - 1} (no event at any of them)")
        )
    return end


def _position(found: dict[int, Event | str], position: int) -> list[Finding]:
    entry = found.get(position)
    after = found.get(position + 1)
    if entry is None:
        when, where = (after.prev_time, after.prev_replica) if isinstance(after, Event) else ("", "")
        return [Finding(position, when, where, "removed (the ledger has no event at this position)")]
    if isinstance(entry, str):
        return [Finding(position, "", "", f"edited: its bytes are no event ({entry})")]
    if entry.seq != position:
        return [
            Finding(position, entry.time, entry.replica, f"reordered: this position holds event {entry.seq}")
        ]
    if entry.sealed().hash != entry.hash:
        return [Finding(position, entry.time, entry.replica, "edited: its hash does not match its contents")]
    if isinstance(after, Event) and _intact(after, position + 1) and not _follows(after, entry):
        return [
            Finding(
                position,
                entry.time,
                entry.replica,
                f"edited after event {position + 1} was appended: that event names another predecessor",
            )
        ]
    return []


def _intact(entry: Event | str | None, position: int) -> bool:
    """An event in its place whose hash matches its contents (its own fault is named at it)."""
    return isinstance(entry, Event) and entry.seq == position and entry.sealed().hash == entry.hash


def _follows(after: Event, entry: Event) -> bool:
    return after.prev == entry.hash and after.prev_time == entry.time and after.prev_replica == entry.replica


def _tail(found: dict[int, Event | str], last: int, pointer: dict[str, Any] | str | None) -> list[Finding]:
    if isinstance(pointer, str):
        return [Finding(last, "", "", f"head.json (the ledger's last event) was edited: {pointer}")]
    if pointer is None:
        return [Finding(last, "", "", "head.json (which names the last event) is missing")] if last else []
    seq, when, where = int(pointer["seq"]), str(pointer["time"]), str(pointer["replica"])
    if seq > last:
        return [Finding(seq, when, where, "removed (head.json names it as the last event)")]
    entry = found.get(seq)
    if isinstance(entry, Event) and entry.seq == seq and entry.hash != pointer["hash"]:
        return [Finding(seq, when, where, "edited: it is not the event head.json names")]
    return []


# -- where a store's ledger lives ------------------------------------------------------------------


def ledger_of(objects: ObjectStore) -> Ledger:
    """The ledger beside ``objects`` (a repository's: see the module's docstring): their place
    beside them (``ObjectStore.place_beside``), through the same client, journaled by no session."""
    place, prefix = objects.place_beside(LEDGER)
    if prefix:  # keys at a bucket's root: <LEDGER>.*
        uri = f"{place.uri.rstrip('/')}/{prefix}*"
    else:  # a folder: an S3 one named with its trailing slash, as the ledger has always been
        uri = f"{place.uri.rstrip('/')}/" if place.uri.startswith("s3://") else place.uri
    return Ledger(place, prefix, uri)


__all__ = ["LEDGER", "Finding", "Ledger", "ledger_of", "verify_chain"]
