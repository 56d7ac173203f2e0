"""An MLflow webhook delivery, verified and parsed (MLflow 3.17's wire format, read from its wheel:
``mlflow/webhooks/delivery.py``).

MLflow POSTs ``{"entity", "action", "timestamp", "data": {...}}`` with the headers
``X-MLflow-Delivery-Id`` (a uuid4), ``X-MLflow-Timestamp`` (unix seconds) and, where the webhook has
a secret, ``X-MLflow-Signature: v1,<base64(HMAC-SHA256(secret, "<id>.<timestamp>.<raw body>"))>``.
Everything here is input we did not write: the body is bounded, the headers are allow-listed in
shape, the signature is compared in constant time over the *raw* bytes (never a re-serialised
body), and a delivery whose timestamp is outside the window is refused (a captured delivery cannot
be replayed later; a replay inside the window is the queue's delivery-id check).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_BODY = 64 << 10  # MLflow's alias payload is ~200 bytes
SIGNATURE = "x-mlflow-signature"
TIMESTAMP = "x-mlflow-timestamp"
DELIVERY = "x-mlflow-delivery-id"
VERSION = "v1"
WINDOW_S = 300.0  # a delivery's timestamp may be this far from the receiver's clock
ALIAS_CREATED = ("model_version_alias", "created")  # the one event the relay acts on
EVENT_NAME = "model_version_alias.created"
DELIVERY_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
NAME = re.compile(r"^[0-9A-Za-z.\-_]{1,256}$")  # the store's rule for a model name (Triton's S3 rule)
ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,256}$")  # MLflow's alias rule, bounded
DIGITS = re.compile(r"^[0-9]{1,10}$")
MAX_SIGNATURES = 8  # "v1,a v1,b": a rotating secret sends two; more is not a sender we know


class Refused(Exception):
    """A delivery the receiver answers with ``status`` (401, 400, 413, 409) and ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class AliasEvent:
    model: str
    alias: str
    version: str


@dataclass(frozen=True)
class Delivery:
    delivery_id: str
    timestamp: int
    event: AliasEvent | None  # None: another event (verified, nothing to do)
    kind: str  # "entity.action"


def sign(secret: bytes, delivery_id: str, timestamp: str, body: bytes) -> str:
    """The header value MLflow sends for ``body`` (tests and the benchmark sign with it)."""
    digest = hmac.new(secret, f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return f"{VERSION},{base64.b64encode(digest).decode()}"


def signature_ok(secret: bytes, delivery_id: str, timestamp: str, body: bytes, header: str) -> bool:
    """Whether one of the ``v1,<base64>`` entries of ``header`` is the HMAC of this delivery."""
    expected = hmac.new(secret, f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    entries = header.split()
    if not entries or len(entries) > MAX_SIGNATURES:
        return False
    matched = False
    for entry in entries:
        version, _, encoded = entry.partition(",")
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        # every entry compared (no early exit on a match): the time does not depend on which matched
        matched |= version == VERSION and hmac.compare_digest(given, expected)
    return matched


def verify(headers: Mapping[str, str], body: bytes, secret: bytes, now: float, window: float) -> Delivery:
    """The verified delivery of ``body``; :class:`Refused` with 401 (no/forged signature, stale or
    future timestamp), 413 (too big) or 400 (not MLflow's shape).  ``headers``: lower-case names."""
    if len(body) > MAX_BODY:
        raise Refused(413, f"body over {MAX_BODY} bytes")
    delivery_id, stamp = headers.get(DELIVERY, ""), headers.get(TIMESTAMP, "")
    if not DELIVERY_ID.match(delivery_id) or not DIGITS.match(stamp):
        raise Refused(401, "missing or malformed X-MLflow-Delivery-Id / X-MLflow-Timestamp")
    if not secret or not signature_ok(secret, delivery_id, stamp, body, headers.get(SIGNATURE, "")[:1024]):
        raise Refused(401, "signature does not verify")
    if abs(now - int(stamp)) > window:
        raise Refused(401, f"timestamp {stamp} is outside the {window:g} s window (clock {now:.0f})")
    kind, event = parse(body)
    return Delivery(delivery_id, int(stamp), event, kind)


def parse(body: bytes) -> tuple[str, AliasEvent | None]:
    """``(entity.action, the alias event or None)``; :class:`Refused` 400 for anything else."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise Refused(400, f"body is not JSON: {type(exc).__name__}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise Refused(400, "body is not an MLflow webhook payload (no 'data' object)")
    entity, action = doc.get("entity"), doc.get("action")
    if not isinstance(entity, str) or not isinstance(action, str) or len(entity) + len(action) > 64:
        raise Refused(400, "body has no 'entity' and 'action' strings")
    kind = f"{entity}.{action}"
    if (entity, action) != ALIAS_CREATED:
        return kind, None
    data = doc["data"]
    name, alias, version = data.get("name"), data.get("alias"), data.get("version")
    if not (_fits(NAME, name) and _fits(ALIAS, alias) and _fits(DIGITS, version)):
        raise Refused(
            400, "alias event needs data.name (a storable model name), data.alias, data.version (digits)"
        )
    return kind, AliasEvent(str(name), str(alias), str(int(str(version))))


def _fits(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.match(value) is not None and value not in {".", ".."}


def payload(model: str, alias: str, version: str, timestamp: str = "2026-12-06T00:00:00+00:00") -> bytes:
    """The body MLflow 3.17 sends for an alias move (tests and the benchmark deliver it)."""
    doc = {
        "entity": ALIAS_CREATED[0],
        "action": ALIAS_CREATED[1],
        "timestamp": timestamp,
        "data": {"name": model, "alias": alias, "version": version},
    }
    return json.dumps(doc).encode()


__all__ = ["AliasEvent", "Delivery", "Refused", "parse", "payload", "sign", "signature_ok", "verify"]
