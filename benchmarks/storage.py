"""Uploading a version with a 1 GiB file: the store vs boto3's plain upload_file, one run, one moto_server.

Reports throughput (target >= 0.9x the baseline), peak RSS of each uploading process
(target < 300 MB) and the re-upload of the unchanged version (target: zero bytes sent,
< 5% of the first upload's time).  Each upload runs in its own process so RSS is its own.

    .venv/bin/python benchmarks/storage.py [--size-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.devstack import local_s3  # noqa: E402

STORE_UPLOAD = """
import json, resource, sys, time
from pipelines.storage import open_store
began = time.perf_counter()
from pathlib import Path
store = open_store(sys.argv[1], digest_cache=Path(sys.argv[3]))
result = store.versions.put_version("big_model", "1", Path(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - began, "bytes_sent": result.bytes_sent,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
BASELINE_UPLOAD = """
import json, resource, sys, time
import boto3
client = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
began = time.perf_counter()
client.upload_file(sys.argv[2], sys.argv[3], "baseline/big_model/1/weights.bin")
print(json.dumps({"seconds": time.perf_counter() - began,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    for key, value in local_s3.CREDENTIALS.items():
        os.environ.setdefault(key, value)
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-storage-"))
    version = work / "1"
    version.mkdir()
    size = args.size_mib << 20
    with (version / "weights.bin").open("wb") as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(1 << 20))
    server, process = local_s3.start_s3(work / "moto.log")
    try:
        local_s3.create_bucket(server.endpoint, "bench")
        uri = server.store_uri("bench", "store")
        baseline = run(BASELINE_UPLOAD, server.endpoint, str(version / "weights.bin"), "bench")
        cache = str(work / "digests.json")
        first = run(STORE_UPLOAD, uri, str(version), cache)
        again = run(STORE_UPLOAD, uri, str(version), cache)
    finally:
        local_s3.stop_s3(server.pid, process)
    mib = size / (1 << 20)
    print(f"{'':34} {'seconds':>8} {'MiB/s':>8} {'peak RSS MB':>12} {'bytes sent':>14}")
    print(
        f"{'boto3 upload_file (baseline)':34} {baseline['seconds']:8.2f} "
        f"{mib / baseline['seconds']:8.1f} {baseline['rss_mb']:12.0f} {size:14,}"
    )
    print(
        f"{'store.versions.put_version (first upload)':34} {first['seconds']:8.2f} "
        f"{mib / first['seconds']:8.1f} {first['rss_mb']:12.0f} {int(first['bytes_sent']):14,}"
    )
    print(
        f"{'store.versions.put_version (unchanged)':34} {again['seconds']:8.2f} {'':>8} "
        f"{again['rss_mb']:12.0f} {int(again['bytes_sent']):14,}"
    )
    print(
        f"throughput ratio store/baseline: {baseline['seconds'] / first['seconds']:.2f} "
        f"(target >= 0.9); re-upload: {100 * again['seconds'] / first['seconds']:.1f}% of the "
        f"first upload's time (target < 5%), {int(again['bytes_sent'])} bytes sent (target 0)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
