"""What the Fleet is given to remember every call it sends: a :class:`Recorder` appends one ledger
event per load, unload or config update, whoever asked for it (a promotion, its rollback or undo, a
retire, ``fleet sync``, ``mlflow deployments``: each goes through ``Fleet``).

Best effort by design: a ledger that cannot be written is a warning and a line in ``problems``,
never a failed promotion (the calls were sent; the ledger records them, it does not gate them).
The events this recorder appended are kept in ``events``: the promotion's MLflow run gets them as
``ledger.jsonl``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.ledger.chain import Ledger, ledger_of
from pipelines.ledger.events import Event, encode, now
from pipelines.storage.manifest import MANIFEST
from registry.errors import StorageError
from registry.settings import redact_uri
from registry.signing import SIGNATURE_FILE

if TYPE_CHECKING:
    from pipelines.ledger.receipts import ReceiptSigner
    from pipelines.storage.base import Repository

log = logging.getLogger(__name__)
assert MANIFEST == ".mlreg-manifest.json"  # the receipt's input names it (pipelines/ledger/receipts.py)


class Recorder:
    """Appends the events of one operation (``operation``, ``promotion``: its id) on ``env``'s
    replicas to ``ledger``; ``signer``: the environment's receipt key (None: no receipts).

    ``background``: ``sent`` stamps the call's time and returns at once; one writer thread of this
    recorder appends the events in the order they were sent (a fleet's parallel wave would
    otherwise wait on one another's appends: measured, 200 replicas took 1.19x as long).  It is
    not a daemon: the process waits for it at exit.  ``flush`` waits for it (the record stage,
    before the MLflow copy)."""

    def __init__(
        self,
        ledger: Ledger,
        store: Repository,
        env: str,
        *,
        operation: str = "promote",
        promotion: str = "",
        signer: ReceiptSigner | None = None,
        policy: str = "",
        background: bool = False,
    ) -> None:
        self.ledger = ledger
        self.store = store
        self.env = env
        self.operation = operation
        self.promotion = promotion
        self.signer = signer
        self.policy = policy or f"mlreg:environment/{env}"
        self.events: list[Event] = []
        self.problems: list[str] = []
        self._facts: dict[tuple[str, str], tuple[str, str, str]] = {}  # (model, version) -> facts
        self._lock = threading.Lock()
        self.background = background
        self._pending: list[tuple[str, str, dict[str, Any]]] = []  # (time, url, sent's arguments)
        self._writer: threading.Thread | None = None

    def sent(
        self,
        url: str,
        model: str,
        versions: tuple[str, ...],
        before: tuple[str, ...],
        *,
        unload: bool = False,
        result: str = "ok",
        detail: str = "",
        undo: bool = False,
    ) -> Event | None:
        """One call sent to ``url``: the load of ``versions`` (``unload``: of the model), with
        ``before`` READY there (() when unknown); ``result`` ok, failed or queued; ``undo``: sent
        to put back what served.  The event appended (None when the ledger could not be written,
        noted in ``problems``, or in the background: appended later)."""
        args = {"model": model, "versions": versions, "before": before, "unload": unload}
        args |= {"result": result, "detail": detail, "undo": undo}
        if not self.background:
            return self._append(now(), url, args)
        with self._lock:
            self._pending.append((now(), url, args))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="mlreg-ledger", daemon=False)
                self._writer.start()
        return None

    def _write(self) -> None:
        """The writer thread: every pending event appended, in order, until none is left."""
        while True:
            with self._lock:
                if not self._pending:
                    self._writer = None
                    return
                stamp, url, args = self._pending.pop(0)
            self._append(stamp, url, args)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait (at most ``timeout`` s) until every event sent so far is appended or noted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                writer = self._writer
            if writer is None:
                return
            writer.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._pending:
                self.problems.append(
                    f"{len(self._pending)} event(s) still being appended after {timeout:.0f}s"
                )

    def _append(self, stamp: str, url: str, args: dict[str, Any]) -> Event | None:
        model = str(args["model"])
        try:
            fields = self._fields(
                url, model, args["versions"], args["before"], args["unload"], args["result"], args["detail"]
            )
            if args["undo"]:
                fields["operation"] = "undo"
            event = self.ledger.append(time=stamp, **fields)
        except Exception as exc:  # a ledger that fails never fails what it records
            line = f"{redact_uri(self.ledger.uri)}: the {model} call to {url} is not in the ledger: {exc}"
            log.warning("%s", line)
            with self._lock:
                self.problems.append(line)
            return None
        with self._lock:
            self.events.append(event)
        return event

    def _fields(
        self,
        url: str,
        model: str,
        versions: tuple[str, ...],
        before: tuple[str, ...],
        unload: bool,
        result: str,
        detail: str,
    ) -> dict[str, object]:
        named = () if unload else tuple(sorted(set(versions), key=int))
        kind = "unload" if unload else "config" if named and set(named) <= set(before) else "load"
        version = named[-1] if named else ""
        facts = {v: self._facts_of(model, v) for v in named}
        receipt = None
        if self.signer is not None and kind == "load" and version and facts[version][0]:
            receipt = self._receipt(model, version, facts[version])
        return {
            "kind": kind,
            "replica": printable(url),
            "model": model,
            "version": version,
            "versions": named,
            "digests": {v: f[0] for v, f in facts.items() if f[0]},
            "signer": facts[version][2] if version else "",
            "operation": self.operation,
            "promotion": self.promotion,
            "env": self.env,
            "result": result,
            "detail": printable(" ".join(detail.split())),
            "receipt": receipt,
        }

    def _facts_of(self, model: str, version: str) -> tuple[str, str, str]:
        """(manifest digest, signature sha256, who the signature names) of a stored version; read
        once (a stored version is written once), "" where there is none."""
        key = (model, version)
        if key not in self._facts:
            manifest = self.store.versions.read_manifest(model, version)
            signature = self.store.objects.read(f"{model}/{version}/{SIGNATURE_FILE}")
            signer = ""
            if signature is not None:
                from registry.signing import claimed_identity  # lazy: cryptography, ~0.1 s, signed only

                signer = claimed_identity(signature)
            self._facts[key] = (
                manifest.digest if manifest is not None else "",
                hashlib.sha256(signature).hexdigest() if signature is not None else "",
                printable(signer),
            )
        return self._facts[key]

    def _receipt(self, model: str, version: str, facts: tuple[str, str, str]) -> dict[str, object]:
        from pipelines.ledger.receipts import statement  # lazy: only where receipts are signed
        from registry import __version__  # lazy: kept beside its one use

        assert self.signer is not None
        resource = f"{redact_uri(self.store.uri).rstrip('/')}/{model}/{version}"
        return self.signer.sign(
            statement(
                model=model,
                version=version,
                manifest_digest=facts[0],
                signature_digest=facts[1],
                resource=resource,
                policy=self.policy,
                verified_at=now(),
                passed=True,  # a load is sent only once the store's verify_load passed (it raises)
                verifier_version=__version__,
            )
        )

    def jsonl(self) -> bytes:
        """The events appended, one a line (as stored): the promotion's ``ledger.jsonl``."""
        with self._lock:
            return b"".join(encode(e) for e in sorted(self.events, key=lambda e: e.seq))


def printable(text: str, limit: int = 1024) -> str:
    """``text`` as a ledger field takes it: printable characters only (others become '?'), at most
    ``limit`` of them (a replica's address, a signer, a failure's reason are not ours)."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


OPERATION: contextvars.ContextVar[str] = contextvars.ContextVar("mlreg_ledger_operation", default="promote")


@contextlib.contextmanager
def operation(name: str) -> Iterator[None]:
    """Within it, the fleets made for a promotion record ``name`` (rollback, sync, deployments...)
    as their events' operation: the verb that asked, which the promotion itself does not know."""
    token = OPERATION.set(name)
    try:
        yield
    finally:
        OPERATION.reset(token)


def for_fleet(
    store: Repository,
    env: str,
    *,
    operation: str = "",
    promotion: str = "",
    receipt_key: str | Path | None = None,
) -> Recorder | None:
    """The recorder a ``Fleet`` on ``store`` is given (None where the store keeps no ledger: said
    in the log).  ``operation``: default the one :func:`operation` set (else ``promote``);
    ``promotion``: the operation's id (default a fresh one); ``receipt_key``: the environment's
    receipt key -- one that cannot be read refuses here, before anything is sent."""
    try:
        book = ledger_of(store.objects)
    except StorageError as exc:
        log.warning("%s: no deployment ledger: %s", redact_uri(store.uri), exc.message)
        return None
    signer = None
    if receipt_key:
        from pipelines.ledger.receipts import ReceiptSigner  # lazy: cryptography, ~0.1 s, receipts only

        signer = ReceiptSigner(Path(receipt_key))
    return Recorder(
        book,
        store,
        env,
        operation=operation or OPERATION.get(),
        promotion=promotion or new_id(),
        signer=signer,
        background=True,
    )


def new_id() -> str:
    """An operation's id: its start time and 8 random hex digits (``20261206T081500-1a2b3c4d``)."""
    from datetime import UTC, datetime  # lazy: kept beside its one use

    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


__all__ = ["OPERATION", "Recorder", "for_fleet", "new_id", "operation"]
