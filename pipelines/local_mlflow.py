"""A real ``mlflow server`` process on 127.0.0.1: the MLflow UI of the local stack, and tests' server.

Started lean (FACTS.md): ``--workers 1`` and job execution off, about 0.5 GB and ~8 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.local_s3 import process_gone
from pipelines.local_triton import free_port, http_ok, tail
from registry.errors import StackError

START_TIMEOUT_S = 90.0


@dataclass
class MlflowServer:
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_mlflow(backend_uri: str, artifacts: Path, log_path: Path, *, serve_artifacts: bool,
                 port: int | None = None) -> tuple[MlflowServer, subprocess.Popen[bytes]]:
    port = port or free_port()
    exe = Path(sys.executable).parent / "mlflow"
    command = [str(exe) if exe.is_file() else "mlflow", "server",
               "--backend-store-uri", backend_uri, "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
    if serve_artifacts:
        command += ["--serve-artifacts", "--artifacts-destination", str(artifacts)]
    else:
        command += ["--no-serve-artifacts", "--default-artifact-root", artifacts.as_uri()]
    env = {"MLFLOW_DISABLE_TELEMETRY": "true", **os.environ,
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = MlflowServer(process.pid, port)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"mlflow server exited with code {process.returncode}:\n{tail(log_path)}",
                             fix=f"read its log: {log_path}")
        if http_ok(f"{server.url}/health", timeout=2.0):
            return server, process
        time.sleep(0.2)
    stop_mlflow(server.pid, process)
    raise StackError(f"mlflow server did not answer within {START_TIMEOUT_S:.0f}s",
                     fix=f"read its log: {log_path}")


def stop_mlflow(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM stops the server and its workers (FACTS.md); SIGKILL the group after 15 s."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (process.poll() is not None) if process is not None else process_gone(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if process is not None:
        process.wait(timeout=5)
