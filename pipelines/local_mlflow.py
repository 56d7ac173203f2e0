"""A real ``mlflow server`` process on 127.0.0.1: the MLflow UI of the local stack, and tests' server.

Started lean (FACTS.md): ``--workers 1`` and job execution off, about 0.5 GB and ~8 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.local_triton import free_port, http_ok
from pipelines.processes import stop_group, wait_answering
from registry.errors import StackError

START_TIMEOUT_S = 90.0


@dataclass
class MlflowServer:
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_mlflow(
    backend_uri: str, artifacts: Path, log_path: Path, *, serve_artifacts: bool, port: int | None = None
) -> tuple[MlflowServer, subprocess.Popen[bytes]]:
    port = port or free_port()
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
    log_path.parent.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = MlflowServer(process.pid, port)
    if wait_answering(
        process,
        lambda: http_ok(f"{server.url}/health", timeout=2.0),
        "mlflow server",
        log_path,
        START_TIMEOUT_S,
        interval=0.2,
    ):
        return server, process
    stop_mlflow(server.pid, process)
    raise StackError(
        f"mlflow server did not answer within {START_TIMEOUT_S:.0f}s", fix=f"read its log: {log_path}"
    )


def stop_mlflow(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM stops the server and its workers (FACTS.md); SIGKILL the group after 15 s."""
    stop_group(pid, process, grace=15)
