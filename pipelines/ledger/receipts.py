"""A load's receipt: an in-toto Statement v1 whose predicate is SLSA's verification summary
(``https://slsa.dev/verification_summary/v1``) -- what mlreg verified before the load (the stored
bytes against the version's manifest, the manifest against its signature), against which manifest
and signature digests, with which result -- in a DSSE envelope signed with the environment's
receipt key (an EC private key, PEM; ECDSA with SHA-256 over DSSE's PAE encoding).

Anyone can check one with openssl and the standard library (README, "The deployment ledger"):

    pae = b"DSSEv1 %d %s %d %s" % (len(type), type, len(payload), payload)
    openssl dgst -sha256 -verify receipts.pub -signature sig.der pae.bin

The subject is the version (``<model>/<version>``, its manifest's digest as sha256): a receipt says
"this manifest was verified and loaded on that replica at that time".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path
from typing import Any

from registry.errors import StorageError, UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER = "https://github.com/mlreg/mlreg#promotion"
VERIFIED_LEVEL = "MLREG_MANIFEST_VERIFIED"  # a custom level (never SLSA_*): bytes = manifest (= signature)
MAX_PAYLOAD = 16 * 1024
RECEIPT_KEYS = frozenset({"receipt_key"})  # an environment's key of mlreg.toml read here


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement(
    *,
    model: str,
    version: str,
    manifest_digest: str,
    signature_digest: str,
    resource: str,
    policy: str,
    verified_at: str,
    passed: bool,
    verifier_version: str,
) -> dict[str, Any]:
    """The in-toto Statement of one verification (see the module's docstring)."""
    inputs = [{"uri": f"{resource}/.mlreg-manifest.json", "digest": {"sha256": manifest_digest}}]
    if signature_digest:
        inputs.append({"uri": f"{resource}/.mlreg-signature.json", "digest": {"sha256": signature_digest}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{model}/{version}", "digest": {"sha256": manifest_digest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "verifier": {"id": VERIFIER, "version": {"mlreg": verifier_version}},
            "timeVerified": verified_at,
            "resourceUri": resource,
            "policy": {"uri": policy},
            "inputAttestations": inputs,
            "verificationResult": "PASSED" if passed else "FAILED",
            "verifiedLevels": [VERIFIED_LEVEL] if passed else ["FAILED"],
            "slsaVersion": "1.0",
        },
    }


class ReceiptSigner:
    """Signs receipts with an EC private key (PEM file); ``keyid``: sha256 of its public key (DER)."""

    def __init__(self, key_path: Path) -> None:
        from cryptography.hazmat.primitives import serialization  # lazy: cryptography, ~0.1 s
        from cryptography.hazmat.primitives.asymmetric import ec  # lazy: cryptography, ~0.1 s

        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise StorageError(
                f"receipt key {key_path} cannot be read as a PEM private key: {exc}",
                fix="make one: openssl ecparam -name prime256v1 -genkey -noout -out receipts.pem",
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise StorageError(
                f"receipt key {key_path} is not an EC private key",
                fix="make one: openssl ecparam -name prime256v1 -genkey -noout -out receipts.pem",
            )
        self._key = key
        self._ec = ec
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.keyid = hashlib.sha256(public).hexdigest()

    def __repr__(self) -> str:
        return f"ReceiptSigner(keyid={self.keyid[:16]})"

    def sign(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` (a Statement) in a signed DSSE envelope."""
        from cryptography.hazmat.primitives import hashes  # lazy: cryptography, ~0.1 s

        payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        signature = self._key.sign(pae(PAYLOAD_TYPE, payload), self._ec.ECDSA(hashes.SHA256()))
        return {
            "payloadType": PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": self.keyid, "sig": base64.b64encode(signature).decode()}],
        }


def verify_receipt(envelope: dict[str, Any], public_pem: bytes) -> dict[str, Any]:
    """The Statement of ``envelope`` once a signature verifies with ``public_pem`` (an EC public
    key); StorageError saying why not (bad signature, not a Statement, wrong predicate)."""
    from cryptography.exceptions import InvalidSignature  # lazy: cryptography, ~0.1 s
    from cryptography.hazmat.primitives import hashes, serialization  # lazy: cryptography, ~0.1 s
    from cryptography.hazmat.primitives.asymmetric import ec  # lazy: cryptography, ~0.1 s

    key = serialization.load_pem_public_key(public_pem)
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise StorageError(
            "the receipt key is not an EC public key", fix="pass the receipt key's public half"
        )
    payload = _b64(str(envelope.get("payload", "")), "payload")
    if len(payload) > MAX_PAYLOAD or envelope.get("payloadType") != PAYLOAD_TYPE:
        raise StorageError(
            "the receipt's payload is not an in-toto statement", fix="it was not made by mlreg"
        )
    message = pae(PAYLOAD_TYPE, payload)
    for entry in envelope.get("signatures") or []:
        try:
            key.verify(_b64(str(entry.get("sig", "")), "signature"), message, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, StorageError):
            continue
        return _statement_of(payload)
    raise StorageError(
        "the receipt's signature does not verify with the receipt key",
        fix="the receipt was changed after it was signed, or another key signed it",
    )


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise StorageError(f"the receipt's {what} is not base64", fix="it was changed") from None


def _statement_of(payload: bytes) -> dict[str, Any]:
    from pipelines.ledger.events import Unreadable, strict_json  # lazy: none (kept beside its use)

    try:
        data = strict_json(payload, MAX_PAYLOAD)
    except Unreadable as exc:
        raise StorageError(f"the receipt's statement is not JSON: {exc}", fix="it was changed") from None
    if (
        not isinstance(data, dict)
        or data.get("_type") != STATEMENT_TYPE
        or data.get("predicateType") != PREDICATE_TYPE
    ):
        raise StorageError("the receipt is not a verification-summary statement", fix="it was changed")
    return data


def parse_receipt_key(where: str, raw: dict[str, object], base: Path) -> str:
    """An environment's ``receipt_key = "keys/receipts.pem"`` (relative to mlreg.toml's folder): the
    EC private key (PEM) its load receipts are signed with; "" when absent.  Only its path is kept
    and checked here (a file): it is read when a promotion starts, never echoed."""
    spec = raw.get("receipt_key", "")
    if not spec:
        return ""
    path = base / Path(spec).expanduser() if isinstance(spec, str) else None
    if path is None or not path.is_file():
        raise UsageError(
            f"{where}: receipt_key must be the path of the receipts' EC private key (PEM), "
            "and it names no file",
            fix="make one (openssl ecparam -name prime256v1 -genkey -noout -out keys/receipts.pem) and write "
            'receipt_key = "keys/receipts.pem", relative to mlreg.toml',
        )
    return str(path)


__all__ = [
    "RECEIPT_KEYS",
    "parse_receipt_key",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "ReceiptSigner",
    "pae",
    "statement",
    "verify_receipt",
]
