"""What signing costs: signature verification beside the byte verification, and signing at registration.

One run, side by side on the same 1 GiB version (4 files, local-folder store, warm page cache), each
pair interleaved ``--rounds`` times in one process (model-signing's import, ~1 s, paid once before
the timings and reported apart):

1. **Digests reused** (what a promotion does before a load when the store's digest cache proves the
   bytes unchanged): ``verify_version`` alone vs ``verify_version`` + the signature check over the
   manifest (``pipelines.promote.integrity.stored_signature_check``: no re-hash).  Target <= 1.1x.
   Reported twice: with the process's memo of verified bundles (a version checked again: validate,
   undo, status, waves), and cold (the memo cleared before each check: the DSSE envelope's ECDSA
   verification and model-signing's parsing every time, as the first check of a promotion).
2. **Full re-hash** (the bytes must be read): ``verify_version(full=True)`` alone vs the same plus
   the signature check.  Target <= 1.05x.
3. **Registration**: ``registry.register.register`` of that version into an embedded MLflow
   registry (sqlite + local artifacts, what ``mlreg register`` does), unsigned vs ``signer=`` an EC
   P-256 key, alternately (``force``: a new version each time).  Target: signing adds <= 5%.

    .venv/bin/python benchmarks/signing.py [--size-mb 1024] [--files 4] [--rounds 3] [--json]

Each registration copies the version into MLflow's artifacts: ``2 * --register-rounds`` copies of
``--size-mb`` on disk in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "big_model"


def make_version(folder: Path, size_mb: int, files: int) -> Path:
    """``folder/big_model`` (config.pbtxt + 1/weights<i>.bin), ``size_mb`` MiB over ``files`` files."""
    model = folder / MODEL
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: 0\n')
    block = os.urandom(1 << 20)
    for i in range(files):
        with (model / "1" / f"weights{i}.bin").open("wb") as f:
            for j in range(max(size_mb // files, 1)):
                f.write(block[(i + j) % 251 :] + block[: (i + j) % 251])  # no two MiB alike
    return model


def make_key(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "key.pem", folder / "key.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def seconds(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def pair(
    rounds: int,
    base: Callable[[], object],
    signed: Callable[[], object],
    before: Callable[[], object] = lambda: None,
) -> dict[str, object]:
    """Interleaved timings of ``base`` and ``signed`` (``before`` runs untimed ahead of each); their
    medians' ratio."""
    plain, both = [], []
    for i in range(rounds):
        order = [(plain, base), (both, signed)] if i % 2 == 0 else [(both, signed), (plain, base)]
        for into, fn in order:
            before()
            into.append(seconds(fn))
    ratio = statistics.median(both) / statistics.median(plain)
    return {
        "bytes_only_s": [round(x, 6) for x in plain],
        "with_signature_s": [round(x, 6) for x in both],
        "median_ratio": round(ratio, 3),
    }


def verification(model: Path, work: Path, rounds: int, public: Path, private: Path) -> dict[str, object]:
    from pipelines.promote.integrity import _CHECKED as checked  # verified (bundle, manifest) pairs
    from pipelines.promote.integrity import stored_signature_check
    from pipelines.storage import open_store
    from registry.manifest import sha256_file
    from registry.signing import _VERIFIED as memo  # the process's memo of verified bundles
    from registry.signing import SIGNATURE_FILE, SigningKey, Trust, sign, signed_files

    store = open_store(work / "store", digest_cache=work / "digests.json")
    store.versions.put_version(MODEL, "1", model / "1", config=model / "config.pbtxt")
    manifest = store.versions.read_manifest(MODEL, "1")
    assert manifest is not None
    digest = manifest.digest
    bundle = sign(
        signed_files(manifest.files, sha256_file(model / "config.pbtxt")), SigningKey(private), MODEL
    )
    store.objects.write(f"{MODEL}/1/{SIGNATURE_FILE}", bundle)
    trust = Trust("required", (public,))
    memo.clear()
    checked.clear()
    began = time.perf_counter()
    stored_signature_check(store, None, MODEL, "1", trust, None)  # cold (model-signing imported by sign)
    first = time.perf_counter() - began

    def check(full: bool, signature: bool, cold: bool = False) -> Callable[[], object]:
        def run() -> None:
            result = store.versions.verify_version(MODEL, "1", digest, full=full)
            assert result.ok, result
            assert full or result.hashed_bytes == 0, result
            if signature:
                if cold:
                    memo.clear()
                    checked.clear()
                stored_signature_check(store, None, MODEL, "1", trust, None, result.digest)

        return run

    many = max(rounds, 5) * 40  # a check with reused digests takes about a millisecond: more rounds
    reused = pair(many, check(False, False), check(False, True))
    cold = pair(many, check(False, False), check(False, True, cold=True))
    full = pair(rounds, check(True, False), check(True, True, cold=True))

    def cold_check() -> None:
        memo.clear()
        checked.clear()
        stored_signature_check(store, None, MODEL, "1", trust, None)

    alone = statistics.median(seconds(cold_check) for _ in range(many))
    full_base = statistics.median(full["bytes_only_s"])  # type: ignore[arg-type]
    return {
        "first_signature_check_s": round(first, 4),
        # the same ratio from its parts, robust to a busy machine: the signature check timed alone
        # (cold: ECDSA + parsing every time), added to the full re-hash's median
        "signature_check_alone_cold_s": round(alone, 6),
        "full_rehash_ratio_from_parts": round((full_base + alone) / full_base, 4),
        "digests_reused": {**reused, "target_ratio": 1.1, "ok": reused["median_ratio"] <= 1.1},  # type: ignore[operator]
        "digests_reused_cold": {**cold, "target_ratio": 1.1, "ok": cold["median_ratio"] <= 1.1},  # type: ignore[operator]
        "full_rehash": {**full, "target_ratio": 1.05, "ok": full["median_ratio"] <= 1.05},  # type: ignore[operator]
    }


def registration(model: Path, work: Path, rounds: int, private: Path) -> dict[str, object]:
    from registry.manifest import manifest_of, sha256_file
    from registry.mlflow import MlflowRegistry
    from registry.register import find_candidate, register
    from registry.settings import Settings
    from registry.signing import SigningKey, sign, signed_files

    settings = Settings.from_env(env={"MLREG_HOME": str(work / "home"), "PATH": os.environ.get("PATH", "")})
    settings.home.mkdir(parents=True, exist_ok=True)
    registry = MlflowRegistry(settings)
    tiny = make_version(work / "tiny", 1, 1)
    register(registry, find_candidate(tiny), force=True)  # MLflow's import and the first run, untimed
    sign({"a": "0" * 64}, SigningKey(private), "warm-up")  # model-signing's import, untimed
    candidate = find_candidate(model)
    timings = pair(
        rounds,
        lambda: register(registry, candidate, force=True),
        lambda: register(registry, candidate, force=True, signer=SigningKey(private)),
        before=os.sync,  # the previous registration's gigabyte written out first, untimed
    )
    added = timings["median_ratio"] - 1  # type: ignore[operator]
    manifest = manifest_of(model / "1")
    files = signed_files(manifest, sha256_file(model / "config.pbtxt"))
    signing = statistics.median(seconds(lambda: sign(files, SigningKey(private), MODEL)) for _ in range(20))
    base = statistics.median(timings["bytes_only_s"])  # type: ignore[arg-type]
    return {
        **timings,
        "added_by_signing": f"{added * 100:.1f}%",
        # from its parts, robust to a busy machine: what signing adds (sign() over the manifest's
        # digests, timed alone) over the unsigned registration's median
        "sign_alone_s": round(signing, 6),
        "added_from_parts": f"{signing / base * 100:.2f}%",
        "target": "<= 5%",
        "ok": added <= 0.05,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="version size in MiB (default 1024)")
    parser.add_argument("--files", type=int, default=4, help="files in the version (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per pair (default 3)")
    parser.add_argument("--register-rounds", type=int, default=2, help="registrations per side (default 2)")
    parser.add_argument("--skip-register", action="store_true", help="only the verification pairs")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its INFO lines go to stdout
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-signing-") as tmp:
        work = Path(tmp)
        private, public = make_key(work)
        model = make_version(work / "src", args.size_mb, args.files)
        out: dict[str, object] = {"size_mb": args.size_mb, "files": args.files}
        out["verification"] = verification(model, work, args.rounds, public, private)
        if not args.skip_register:
            out["registration"] = registration(model, work, args.register_rounds, private)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for section, data in out.items():
        print(f"{section}: {json.dumps(data, indent=1) if isinstance(data, dict) else data}")


if __name__ == "__main__":
    main()
