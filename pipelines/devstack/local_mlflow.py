"""A real ``mlflow server`` process on 127.0.0.1: the MLflow UI of the local stack, and tests' server.

Started lean (FACTS.md): ``--workers 1`` and job execution off, about 0.5 GB and ~8 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.devstack.local_triton import free_port
from pipelines.devstack.processes import ManagedProcess, stop_process

START_TIMEOUT_S = 90.0
STOP_GRACE_S = 15.0  # SIGTERM stops the server and its workers (FACTS.md)


@dataclass
class MlflowServer:
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def mlflow_process(
    backend_uri: str, artifacts: Path, log_path: Path, *, serve_artifacts: bool, port: int
) -> ManagedProcess:
    """``mlflow server`` on 127.0.0.1:``port`` (sqlite or any backend store) as a managed process."""
    exe = Path(sys.executable).parent / "mlflow"
    command = [
        str(exe) if exe.is_file() else "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    if serve_artifacts:
        command += ["--serve-artifacts", "--artifacts-destination", str(artifacts)]
    else:
        command += ["--no-serve-artifacts", "--default-artifact-root", artifacts.as_uri()]
    env = {"MLFLOW_DISABLE_TELEMETRY": "true", **os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return ManagedProcess(
        name="mlflow server",
        argv=command,
        health_url=f"http://127.0.0.1:{port}/health",
        log_path=log_path,
        marker="mlflow",
        env=env,
        start_timeout=START_TIMEOUT_S,
        stop_grace=STOP_GRACE_S,
        health_interval=0.2,
    )


def start_mlflow(
    backend_uri: str, artifacts: Path, log_path: Path, *, serve_artifacts: bool, port: int | None = None
) -> tuple[MlflowServer, subprocess.Popen[bytes]]:
    port = port or free_port()
    artifacts.mkdir(parents=True, exist_ok=True)
    managed = mlflow_process(backend_uri, artifacts, log_path, serve_artifacts=serve_artifacts, port=port)
    process = managed.start()
    return MlflowServer(process.pid, port), process


def stop_mlflow(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM stops the server and its workers (FACTS.md); SIGKILL the group after 15 s."""
    stop_process(pid, process, grace=STOP_GRACE_S, marker=None if process else "mlflow")
