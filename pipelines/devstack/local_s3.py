"""A local S3-compatible server for tests and `mlreg stack up --s3`: ``moto_server`` on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.devstack.local_triton import free_port
from pipelines.devstack.processes import ManagedProcess, stop_process
from registry.errors import MissingDependencyError

START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "mlreg",
    "AWS_SECRET_ACCESS_KEY": "mlreg-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    pid: int
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def store_uri(self, bucket: str, prefix: str = "") -> str:
        """Triton's syntax for this endpoint: s3://127.0.0.1:PORT/bucket/prefix."""
        return f"s3://127.0.0.1:{self.port}/{bucket}" + (f"/{prefix}" if prefix else "")


def moto_command() -> list[str]:
    """moto's server: pipelines/devstack/moto_server.py (its routing's per-request package listing
    made once) where this interpreter has moto's server, else the ``moto_server`` script."""
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None:
        # by path, not ``-m``: ``-m`` puts the cwd first on sys.path, where a user's project may
        # have a ``pipelines`` package of its own (and a wheel install has no editable finder)
        return [sys.executable, str(Path(__file__).with_name("moto_server.py"))]
    exe = Path(sys.executable).parent / "moto_server"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found is None:
        raise MissingDependencyError("moto[server]", "dev", "The local S3 server")
    return [found]


def moto_process(log_path: Path, port: int) -> ManagedProcess:
    """moto_server on 127.0.0.1:``port`` as a managed process."""
    return ManagedProcess(
        name="moto_server",
        argv=[*moto_command(), "-H", "127.0.0.1", "-p", str(port)],
        health_url=f"http://127.0.0.1:{port}/moto-api/",
        log_path=log_path,
        marker="moto_server",
        start_timeout=START_TIMEOUT_S,
        stop_grace=STOP_GRACE_S,
    )


def start_s3(log_path: Path, port: int | None = None) -> tuple[S3Server, subprocess.Popen[bytes]]:
    port = port or free_port()
    process = moto_process(log_path, port).start()
    return S3Server(process.pid, port), process


def stop_s3(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    stop_process(pid, process, grace=STOP_GRACE_S, marker=None if process else "moto_server")


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3  # lazy: ~0.6 s of import time a stack without S3 never pays

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
