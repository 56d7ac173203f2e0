"""Verifying a 1 GiB version before a load: full re-hash vs `sha256sum`, and the unchanged-S3 fast path.

One run, side by side on the same bytes:

1. **Full re-hash** (``verify_version(..., full=True)`` on a local-folder store, what
   ``mlreg store verify`` does) against ``sha256sum`` of the same stored files.  Each is run in its
   own process, alternately, ``--rounds`` times; the page cache is warm for both (the files were
   just written).  Target: store / sha256sum <= 1.2.
2. **Unchanged version on S3** (moto_server): the version is pushed once (its objects' ETag,
   VersionId and LastModified recorded with their digests), then a fresh process verifies it
   (``verify_version`` without ``full``): one manifest read and one listing (at once), no byte
   read.  Target: < 0.2 s for the call (median; the first call of a fresh process, which also
   pays botocore's lazy set-up, is reported beside it).  For scale, ``--s3-full`` also times a
   full re-hash through S3.

    .venv/bin/python benchmarks/verify.py [--size-mib 1024] [--files 4] [--rounds 3] [--s3-full]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.devstack import local_s3  # noqa: E402

VERIFY = """
import json, sys, time
from pathlib import Path
from pipelines.storage import open_store
versions = open_store(sys.argv[1], digest_cache=Path(sys.argv[2]) if sys.argv[2] else None).versions
full = sys.argv[3] == "full"
began = time.perf_counter()
result = versions.verify_version("big_model", "1", sys.argv[4] or None, full=full)
first = time.perf_counter() - began
began = time.perf_counter()
again = versions.verify_version("big_model", "1", sys.argv[4] or None, full=full) if not full else result
print(json.dumps({"seconds": first, "warm_seconds": time.perf_counter() - began,
                  "hashed_bytes": result.hashed_bytes + (again.hashed_bytes if not full else 0),
                  "reused": result.reused, "status": result.status}))
"""


def run_json(code: str, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - began


def make_version(folder: Path, size_mib: int, files: int) -> None:
    (folder / "big_model" / "1").mkdir(parents=True)
    (folder / "big_model" / "config.pbtxt").write_text('name: "big_model"\nbackend: "python"\n')
    block = os.urandom(1 << 20)
    for i in range(files):
        with (folder / "big_model" / "1" / f"weights{i}.bin").open("wb") as f:
            for j in range(size_mib // files):
                f.write(block[j % 251 :] + block[: j % 251])  # no two MiB alike


def local_side_by_side(source: Path, work: Path, rounds: int) -> dict[str, object]:
    from pipelines.storage import open_store

    store_root = work / "local-store"
    store = open_store(store_root)
    store.versions.put_version("big_model", "1", source / "big_model" / "1")
    digest = store.versions.read_manifest("big_model", "1").digest  # type: ignore[union-attr]
    files = sorted((store_root / "big_model" / "1").glob("weights*.bin"))
    ours, theirs, openssl = [], [], []
    for _ in range(rounds):
        theirs.append(timed(["sha256sum", *map(str, files)]))
        result = run_json(VERIFY, str(store_root), "", "full", digest)
        assert result["status"] == "verified", result
        ours.append(float(result["seconds"]))  # type: ignore[arg-type]
        if shutil.which("openssl"):  # a second reference: OpenSSL's sha256 (SHA-NI where the CPU has it)
            openssl.append(timed(["openssl", "dgst", "-sha256", *map(str, files)]))
    mine, base = statistics.median(ours), statistics.median(theirs)
    out: dict[str, object] = {
        "store_full_rehash_s": [round(x, 3) for x in ours],
        "sha256sum_s": [round(x, 3) for x in theirs],
        "median_ratio": round(mine / base, 3),
        "target_ratio": 1.2,
        "ok": mine / base <= 1.2,
    }
    if openssl:
        out["openssl_dgst_s"] = [round(x, 3) for x in openssl]
        out["median_ratio_vs_openssl"] = round(mine / statistics.median(openssl), 3)
    return out


def s3_fast_path(source: Path, work: Path, full: bool) -> dict[str, object]:
    from pipelines.storage import open_store

    for key, value in local_s3.CREDENTIALS.items():
        os.environ.setdefault(key, value)
    server, process = local_s3.start_s3(work / "moto.log")
    try:
        local_s3.create_bucket(server.endpoint, "bench")
        uri = server.store_uri("bench", "verify")
        cache = work / "digests.json"
        began = time.perf_counter()
        store = open_store(uri, digest_cache=cache)
        store.versions.put_version("big_model", "1", source / "big_model" / "1")
        upload = time.perf_counter() - began
        digest = store.versions.read_manifest("big_model", "1").digest  # type: ignore[union-attr]
        fast = [run_json(VERIFY, uri, str(cache), "changed", digest) for _ in range(3)]
        assert all(r["hashed_bytes"] == 0 and r["status"] == "verified" for r in fast), fast
        warm = [float(r["warm_seconds"]) for r in fast]  # type: ignore[arg-type]
        out: dict[str, object] = {
            "upload_s": round(upload, 2),
            # a fresh process's first S3 request also pays botocore's lazy set-up
            "unchanged_verify_first_call_s": [round(float(r["seconds"]), 4) for r in fast],  # type: ignore[arg-type]
            # the client already in use (as in a promotion, which has read the store before)
            "unchanged_verify_s": [round(x, 4) for x in warm],
            "target_s": 0.2,
            "ok": statistics.median(warm) < 0.2,
        }
        if full:
            rehash = run_json(VERIFY, uri, "", "full", digest)
            out["s3_full_rehash_s"] = round(float(rehash["seconds"]), 2)  # type: ignore[arg-type]
        return out
    finally:
        local_s3.stop_s3(server.pid, process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--s3-full", action="store_true", help="also time a full re-hash through S3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-verify-") as tmp:
        work = Path(tmp)
        make_version(work / "src", args.size_mib, args.files)
        report = {
            "size_mib": args.size_mib,
            "files": args.files,
            "local_full_rehash_vs_sha256sum": local_side_by_side(work / "src", work, args.rounds),
            "s3_unchanged_version": s3_fast_path(work / "src", work, args.s3_full),
        }
    print(json.dumps(report, indent=1))
    return 0 if all(part["ok"] for part in report.values() if isinstance(part, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
