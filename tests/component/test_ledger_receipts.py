"""A load event's receipt (pipelines/ledger/receipts.py): an in-toto Statement v1 with SLSA's
verification-summary predicate in a DSSE envelope, checked by the real ``openssl`` binary with the
README's own few lines of stdlib Python -- and refused by openssl and by mlreg with one flipped byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.ledger import Recorder, ledger_of
from pipelines.ledger.receipts import PREDICATE_TYPE, ReceiptSigner, verify_receipt
from pipelines.storage import open_store
from registry.errors import StorageError
from registry.signing import SIGNATURE_FILE

ROOT = Path(__file__).resolve().parents[2]
OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="the openssl binary is not installed")


def _readme_lines() -> str:
    """The README's Python lines that turn a receipt into openssl's inputs (pae.bin, sig.der)."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(# receipt -> pae\.bin, sig\.der.*?)```", text, re.S)
    assert found, "README.md lost its receipt-checking lines"
    return found.group(1)


def _keys(tmp_path: Path) -> tuple[Path, Path]:
    assert OPENSSL is not None
    key, pub = tmp_path / "receipts.pem", tmp_path / "receipts.pub"
    subprocess.run(
        [OPENSSL, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True
    )
    subprocess.run(
        [OPENSSL, "ec", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True
    )
    return key, pub


def _loaded_event(tmp_path: Path, key: Path) -> tuple[dict[str, object], str]:
    """A store holding scorer v3 (with a signature file beside its manifest), one load recorded."""
    source = tmp_path / "src" / "scorer"
    (source / "3").mkdir(parents=True)
    (source / "config.pbtxt").write_text('name: "scorer"\nbackend: "python"\nmax_batch_size: 0\n')
    (source / "3" / "model.py").write_text("X = 3\n")
    store = open_store(tmp_path / "repo")
    store.versions.put_version("scorer", "3", source / "3")
    store.objects.write(f"scorer/3/{SIGNATURE_FILE}", b'{"signed": "by someone"}')
    manifest = store.versions.read_manifest("scorer", "3")
    assert manifest is not None
    recorder = Recorder(ledger_of(store.objects), store, "prod", promotion="p-7", signer=ReceiptSigner(key))
    event = recorder.sent("triton-0:8001", "scorer", ("3",), ())
    assert event is not None
    assert event.receipt is not None
    return dict(event.receipt), manifest.digest


@needs_openssl
def test_a_load_receipt_verifies_with_openssl_and_the_readmes_lines(tmp_path: Path) -> None:
    key, pub = _keys(tmp_path)
    receipt, digest = _loaded_event(tmp_path, key)
    (tmp_path / "event.json").write_text(json.dumps({"receipt": receipt}))
    subprocess.run([sys.executable, "-c", _readme_lines()], cwd=tmp_path, check=True)
    checked = subprocess.run(
        [OPENSSL or "openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", "sig.der", "pae.bin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked
    assert checked.stdout.strip() == "Verified OK", checked
    statement = verify_receipt(receipt, pub.read_bytes())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE == "https://slsa.dev/verification_summary/v1"
    assert statement["subject"] == [{"name": "scorer/3", "digest": {"sha256": digest}}]
    predicate = statement["predicate"]
    assert predicate["verificationResult"] == "PASSED"
    assert predicate["resourceUri"] == f"{tmp_path / 'repo'}/scorer/3"
    assert predicate["policy"] == {"uri": "mlreg:environment/prod"}
    signature_sha = hashlib.sha256(b'{"signed": "by someone"}').hexdigest()
    assert [a["digest"]["sha256"] for a in predicate["inputAttestations"]] == [digest, signature_sha]
    assert set(predicate) >= {"verifier", "timeVerified", "resourceUri", "policy", "inputAttestations"}


@needs_openssl
def test_a_receipt_with_one_flipped_byte_is_refused_by_openssl_and_by_mlreg(tmp_path: Path) -> None:
    key, pub = _keys(tmp_path)
    receipt, _ = _loaded_event(tmp_path, key)
    payload = bytearray(base64.b64decode(str(receipt["payload"])))
    payload[payload.index(b"PASSED")] ^= 0x01  # "QASSED": one bit of one byte
    flipped = {**receipt, "payload": base64.b64encode(bytes(payload)).decode()}
    (tmp_path / "event.json").write_text(json.dumps({"receipt": flipped}))
    subprocess.run([sys.executable, "-c", _readme_lines()], cwd=tmp_path, check=True)
    checked = subprocess.run(
        [OPENSSL or "openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", "sig.der", "pae.bin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 1
    assert "Verification failure" in checked.stdout + checked.stderr
    with pytest.raises(StorageError, match="signature does not verify"):
        verify_receipt(flipped, pub.read_bytes())


@needs_openssl
def test_only_loads_carry_receipts_and_no_key_means_none(tmp_path: Path) -> None:
    key, _ = _keys(tmp_path)
    _loaded_event(tmp_path, key)
    store = open_store(tmp_path / "repo")
    signed = Recorder(ledger_of(store.objects), store, "prod", signer=ReceiptSigner(key))
    unload = signed.sent("triton-0:8001", "scorer", (), ("3",), unload=True)
    config = signed.sent("triton-0:8001", "scorer", ("3",), ("3",))  # nothing new: a config update
    plain = Recorder(ledger_of(store.objects), store, "prod").sent("triton-1:8001", "scorer", ("3",), ())
    assert unload is not None
    assert unload.kind == "unload"
    assert unload.receipt is None
    assert config is not None
    assert config.kind == "config"
    assert config.receipt is None
    assert plain is not None
    assert plain.kind == "load"
    assert plain.receipt is None
    assert plain.signer == "unreadable signature"  # what the stored (fake) signature file names


def test_a_receipt_key_that_is_no_ec_private_key_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "receipts.pem"
    bad.write_text("not a key")
    with pytest.raises(StorageError, match=r"receipt key .*receipts.pem cannot be read as a PEM private key"):
        ReceiptSigner(bad)
