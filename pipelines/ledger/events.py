"""One ledger event: its fields, its canonical bytes, its hash, and the strict reading of bytes a
store gave back (untrusted: bounded, strict JSON, every field checked against an allow-list).

An event records one call mlreg sent to a replica -- ``load``, ``unload`` or ``config`` (a load
that names only versions the replica already served: a version-policy change) -- and its result.
It is hash-chained: ``prev`` is the previous event's ``hash``, ``prev_time`` and ``prev_replica``
its time and replica (so a removed event can still be named), and ``hash`` the sha256 of the
event's canonical JSON without ``hash``.  The stored bytes are exactly :func:`encode`'s: any other
byte -- even whitespace -- is an edit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from registry.errors import StorageError

SCHEMA = 1
GENESIS = "0" * 64  # the ``prev`` of the first event
MAX_EVENT_BYTES = 64 * 1024  # an event (its receipt included) is a few kB; more is not ours
KINDS = ("load", "unload", "config")
RESULTS = ("ok", "failed", "queued")
OPERATIONS = ("promote", "rollback", "undo", "retire", "sync", "deployments", "other")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
VERSION = re.compile(r"^[0-9]{1,19}$")
NAME = re.compile(r"^[0-9A-Za-z.\-_]{1,255}$")  # a model name as a store takes it (check_part)
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
MAX_TEXT = 1024  # replica addresses, identities, details
MAX_VERSIONS = 64


@dataclass(frozen=True)
class Event:
    """One call sent to one replica (see the module's docstring)."""

    seq: int
    prev: str
    prev_time: str
    prev_replica: str
    time: str
    kind: str
    replica: str
    model: str
    version: str  # the version the call is about (the newest it names; "" for an unload)
    versions: tuple[str, ...]  # every version READY after it (a load's version policy; () unload)
    digests: dict[str, str]  # version -> its manifest's digest
    signer: str  # who signed the version ("" unsigned or unknown)
    operation: str  # promote, rollback, undo, retire, sync, deployments, other
    promotion: str  # the operation's id (a promotion's MLflow run carries it: ledger.jsonl)
    env: str
    result: str  # ok, failed, queued (sent behind a late load, not confirmed)
    detail: str = ""  # why it failed
    receipt: dict[str, Any] | None = None  # a DSSE envelope (pipelines/ledger/receipts.py)
    hash: str = field(default="")
    v: int = SCHEMA

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``: what the hash covers."""
        data = {name: getattr(self, name) for name in BODY}
        data["versions"] = list(self.versions)
        data["digests"] = dict(self.digests)
        return data

    def sealed(self) -> Event:
        """This event with its ``hash`` computed."""
        return Event(**{**self.__dict__, "hash": digest(self.body())})

    def where(self) -> str:
        """``event 12 (2026-12-06T08:00:00.000000Z, replica triton-0:8001)``: how a finding names it."""
        return f"event {self.seq} ({self.time}, replica {self.replica})"


BODY = tuple(n for n in Event.__dataclass_fields__ if n != "hash")


def canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


def encode(event: Event) -> bytes:
    """The bytes stored for ``event`` (sealed): canonical JSON and one newline."""
    return canonical({**event.body(), "hash": event.hash}) + b"\n"


def now() -> str:
    return datetime.now(UTC).strftime(TIME_FORMAT)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (``Z`` or an offset; none: UTC), as an aware datetime."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise StorageError(
            f"'{text}' is not an ISO 8601 time",
            fix="write it as 2026-12-06T08:00:00Z (or with an offset: +01:00)",
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def event_time(event: Event) -> datetime:
    return _utc_time(event.time)


@functools.lru_cache(maxsize=16384)
def _utc_time(text: str) -> datetime:
    """``text`` in TIME_FORMAT as an aware UTC time; remembered, since a history question replays
    every event's time (strptime is ~30 us: 1,000 questions over 260 events spent 8 s in it).
    A text that does not parse raises each time (errors are not cached)."""
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC)


# -- reading untrusted bytes ------------------------------------------------------------------------


class Unreadable(ValueError):
    """Bytes that are not a ledger event, and why."""


def strict_json(data: bytes, limit: int = MAX_EVENT_BYTES) -> Any:
    """``data`` as JSON, refusing what a lenient reader would take: more than ``limit`` bytes,
    anything but UTF-8, duplicate keys, NaN or Infinity."""
    if len(data) > limit:
        raise Unreadable(f"{len(data)} bytes, more than the {limit} an event may have")
    try:
        text = data.decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise Unreadable(f"not JSON: {exc}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Unreadable(f"a key is repeated: {sorted(k for k in keys if keys.count(k) > 1)[0]!r}")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise Unreadable(f"{name} is not a JSON number")


TEXT_FIELDS = ("prev_replica", "replica", "signer", "promotion", "env", "detail")
FIELDS = frozenset(Event.__dataclass_fields__)


def decode(data: bytes) -> Event:
    """The event stored as ``data``; :class:`Unreadable` naming the first thing wrong.  The bytes
    must be exactly the event's canonical encoding."""
    raw = strict_json(data)
    if not isinstance(raw, dict):
        raise Unreadable("not a JSON object")
    if set(raw) != FIELDS:
        odd = sorted(set(raw) ^ FIELDS)
        raise Unreadable(f"its fields are not an event's (unexpected or missing: {', '.join(odd)})")
    _check_fields(raw)
    event = Event(**{**raw, "versions": tuple(raw["versions"]), "digests": dict(raw["digests"])})
    if encode(event) != data:
        raise Unreadable("its bytes are not the event's canonical encoding")
    return event


def check_event(event: Event) -> None:
    """:class:`Unreadable` unless ``event`` holds only what :func:`decode` takes back (checked on
    the fields themselves: its bytes are its canonical encoding by construction)."""
    _check_fields({**event.body(), "hash": event.hash})


def _check_fields(raw: dict[str, Any]) -> None:
    _check(raw["v"] == SCHEMA and type(raw["v"]) is int, "v", f"schema {SCHEMA}")
    _check(type(raw["seq"]) is int and 0 < raw["seq"] < 10**12, "seq", "a positive whole number")
    for name in ("prev", "hash"):
        _check(isinstance(raw[name], str) and bool(HEX64.match(raw[name])), name, "64 hex digits")
    _check(isinstance(raw["time"], str) and bool(TIME.match(raw["time"])), "time", TIME_FORMAT)
    prev_time = raw["prev_time"]
    _check(
        isinstance(prev_time, str) and (prev_time == "" or bool(TIME.match(prev_time))), "prev_time", "a time"
    )
    _check(raw["kind"] in KINDS, "kind", "/".join(KINDS))
    _check(raw["result"] in RESULTS, "result", "/".join(RESULTS))
    _check(raw["operation"] in OPERATIONS, "operation", "/".join(OPERATIONS))
    _check(isinstance(raw["model"], str) and bool(NAME.match(raw["model"])), "model", "a model name")
    for name in TEXT_FIELDS:
        _check(_text(raw[name]), name, f"printable text of at most {MAX_TEXT} characters")
    _check(_versions(raw["versions"]), "versions", f"at most {MAX_VERSIONS} version numbers")
    _check(raw["version"] == "" or _version(raw["version"]), "version", "a version number or ''")
    _check(_digests(raw["digests"]), "digests", "version -> 64 hex digits")
    _check(raw["receipt"] is None or _envelope(raw["receipt"]), "receipt", "null or a DSSE envelope")


def _check(ok: bool, name: str, expected: str) -> None:
    if not ok:
        raise Unreadable(f"field '{name}' is not {expected}")


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT and value.isprintable()


def _version(value: Any) -> bool:
    return isinstance(value, str) and bool(VERSION.match(value))


def _versions(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_VERSIONS and all(_version(v) for v in value)


def _digests(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= MAX_VERSIONS
        and all(_version(k) and isinstance(d, str) and bool(HEX64.match(d)) for k, d in value.items())
    )


B64 = re.compile(r"^[A-Za-z0-9+/=_-]*$")


def _envelope(value: Any) -> bool:
    """A DSSE envelope's shape: payloadType, payload (base64), 1-4 signatures {keyid, sig}."""
    if not isinstance(value, dict) or set(value) != {"payloadType", "payload", "signatures"}:
        return False
    sigs = value["signatures"]
    return (
        _text(value["payloadType"])
        and isinstance(value["payload"], str)
        and len(value["payload"]) <= MAX_EVENT_BYTES // 2
        and bool(B64.match(value["payload"]))
        and isinstance(sigs, list)
        and 1 <= len(sigs) <= 4
        and all(_signature(s) for s in sigs)
    )


def _signature(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"keyid", "sig"}
        and _text(value["keyid"])
        and isinstance(value["sig"], str)
        and len(value["sig"]) <= 1024
        and bool(B64.match(value["sig"]))
    )


__all__ = [
    "GENESIS",
    "KINDS",
    "MAX_EVENT_BYTES",
    "OPERATIONS",
    "RESULTS",
    "Event",
    "Unreadable",
    "check_event",
    "decode",
    "digest",
    "encode",
    "event_time",
    "now",
    "parse_time",
    "strict_json",
]
