"""A local S3-compatible server for tests and `mlreg stack up --s3`: ``moto_server`` on 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.local_triton import free_port, http_ok
from pipelines.processes import stop_group, wait_answering
from registry.errors import MissingDependencyError, StackError

START_TIMEOUT_S = 30.0
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
    exe = Path(sys.executable).parent / "moto_server"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found is None:
        raise MissingDependencyError("moto[server]", "dev", "The local S3 server")
    return [found]


def start_s3(log_path: Path, port: int | None = None) -> tuple[S3Server, subprocess.Popen[bytes]]:
    port = port or free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*moto_command(), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = S3Server(process.pid, port)
    if wait_answering(
        process, lambda: http_ok(f"{server.endpoint}/moto-api/"), "moto_server", log_path, START_TIMEOUT_S
    ):
        return server, process
    stop_s3(server.pid, process)
    raise StackError("moto_server did not answer within 30s", fix=f"read its log: {log_path}")


def stop_s3(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    stop_group(pid, process, grace=10)


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
