"""``mlreg ledger verify`` and ``mlreg history --replica/--model``: an environment's deployment
ledger (pipelines/ledger) checked, and asked what served where, when."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import store_of
from registry.errors import MlregError, UsageError
from registry.settings import Settings, redact_uri

if TYPE_CHECKING:
    from pipelines.ledger import Event, Finding, Ledger


@dataclass
class Verified:
    """What ``mlreg ledger verify`` found: the ledger, its events, every change named."""

    environment: str
    ledger: str
    events: int
    findings: list[Finding]
    receipts: int = 0  # receipts whose signature verified
    bad_receipts: list[str] = field(default_factory=list)  # one line per receipt that did not

    @property
    def ok(self) -> bool:
        return not self.findings and not self.bad_receipts

    def lines(self) -> list[str]:
        return [f.line() for f in self.findings] + self.bad_receipts

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "ledger": self.ledger,
            "events": self.events,
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "receipts_verified": self.receipts,
            "bad_receipts": self.bad_receipts,
        }


def ledger(settings: Settings, env_name: str) -> Ledger:
    from pipelines.ledger import ledger_of  # lazy: kept off `mlreg --help`

    return ledger_of(store_of(settings, None, env_name).objects)


def verify(settings: Settings, env_name: str, receipt_key: Path | None = None) -> Verified:
    """Every event of ``env_name``'s ledger read and the chain checked; with ``receipt_key`` (the
    receipts' public key, PEM) every receipt's signature too."""
    book = ledger(settings, env_name)
    events, findings = book.read_all()
    result = Verified(env_name, redact_uri(book.uri), len(events), findings)
    if receipt_key is not None:
        _check_receipts(events, _public(receipt_key), result)
    return result


def _public(path: Path) -> bytes:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"--receipt-key {path}: {exc.strerror or exc}", fix="pass the receipts' public key (PEM)"
        ) from None
    if b"PRIVATE KEY" in pem:
        raise UsageError(
            f"--receipt-key {path} is a private key",
            fix=f"pass its public half: openssl ec -in {path.name} -pubout -out receipts.pub",
        )
    return pem


def _check_receipts(events: list[Event], pem: bytes, result: Verified) -> None:
    from pipelines.ledger.receipts import verify_receipt  # lazy: cryptography, ~0.1 s

    for event in events:
        if event.receipt is None:
            continue
        try:
            statement = verify_receipt(event.receipt, pem)
        except (MlregError, ValueError) as exc:
            why = exc.message if isinstance(exc, MlregError) else str(exc)
            result.bad_receipts.append(f"{event.where()}: its receipt does not verify: {why}")
            continue
        subject = statement.get("subject") or [{}]
        digest = (subject[0].get("digest") or {}).get("sha256") if isinstance(subject[0], dict) else None
        if digest != event.digests.get(event.version):
            result.bad_receipts.append(f"{event.where()}: its receipt names another manifest digest")
            continue
        if subject[0].get("name") != f"{event.model}/{event.version}":  # a receipt moved onto another model
            result.bad_receipts.append(f"{event.where()}: its receipt is for another model or version")
            continue
        result.receipts += 1


def served_at(settings: Settings, env_name: str, replica: str, at: str) -> dict[str, Any]:
    """What ``replica`` served at ``at`` (ISO 8601), from the ledger; and whether it verifies."""
    from pipelines.ledger.events import parse_time  # lazy: kept off `mlreg --help`
    from pipelines.ledger.query import served_at as served  # lazy: kept off `mlreg --help`

    moment = parse_time(at)
    events, findings = ledger(settings, env_name).read_all()
    known = {e.replica for e in events}
    if replica not in known:
        raise UsageError(
            f"the ledger of '{env_name}' has no event of replica '{replica}'",
            fix="name a replica as the ledger does (" + (", ".join(sorted(known)[:8]) or "it is empty") + ")",
        )
    state = served(events, replica, moment)
    return {
        "environment": env_name,
        "replica": replica,
        "at": moment.isoformat(),
        "serving": {model: list(versions) for model, versions in state.items()},
        "verified": not findings,
    }


def model_history(settings: Settings, env_name: str, model: str) -> dict[str, Any]:
    """Every span during which a replica of ``env_name`` served ``model``, from the ledger."""
    from pipelines.ledger.query import intervals  # lazy: kept off `mlreg --help`

    events, findings = ledger(settings, env_name).read_all()
    spans = intervals(events, model)
    return {
        "environment": env_name,
        "model": model,
        "served": [s.to_dict() for s in spans],
        "events": [_row(e) for e in events if e.model == model],
        "verified": not findings,
    }


def _row(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "time": event.time,
        "replica": event.replica,
        "kind": event.kind,
        "versions": list(event.versions),
        "result": event.result,
        "operation": event.operation,
        "promotion": event.promotion,
        "signer": event.signer,
    }


__all__ = ["Verified", "model_history", "served_at", "verify"]
