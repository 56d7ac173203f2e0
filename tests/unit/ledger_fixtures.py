"""Shared by the ledger's test modules (a test module never imports another: test_suite_rules):
an event's fields, and a receipt signing key."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fields(
    replica: str = "r0:8001", model: str = "m", versions: tuple[str, ...] = ("1",), **more: Any
) -> dict[str, Any]:
    return {
        "kind": "load",
        "replica": replica,
        "model": model,
        "version": versions[-1] if versions else "",
        "versions": versions,
        "digests": {v: f"{int(v):064x}" for v in versions},
        "signer": "",
        "operation": "promote",
        "promotion": "p-1",
        "env": "local",
        "result": "ok",
        "detail": "",
        "receipt": None,
    } | more


def receipt_keys(tmp_path: Path) -> tuple[Path, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "receipts.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path, public
