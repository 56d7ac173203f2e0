"""The local stack: one tritonserver per project, its state kept in ``.mlreg/stack``.

``stack_up`` never starts a second server for the same project: when the recorded
server is still alive it is reused (and asked to load the requested models).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import local_triton
from pipelines.local_triton import ServerInfo
from pipelines.triton import TritonControl
from registry.errors import MlregError, StackError
from registry.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class StackStatus:
    running: bool
    info: ServerInfo | None
    already_running: bool = False
    loaded: list[str] = field(default_factory=list)
    mlflow_url: str = ""

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"running": self.running}
        if self.info is not None:
            data.update(self.info.to_dict())
        if self.mlflow_url:
            data["mlflow_url"] = self.mlflow_url
        if self.loaded:
            data["loaded"] = self.loaded
        return data


def state_file(settings: Settings) -> Path:
    return settings.stack_dir / "triton.json"


def running_server(settings: Settings) -> ServerInfo | None:
    """The project's recorded server if it is still alive; a stale record is removed."""
    path = state_file(settings)
    info = local_triton.load_info(path)
    if info is None:
        return None
    if local_triton.pid_alive(info.pid):
        return info
    log.info("removing stale stack state for pid %d", info.pid)
    local_triton.remove_shm(info.shm_prefix)
    path.unlink(missing_ok=True)
    return None


def s3_state_file(settings: Settings) -> Path:
    return settings.stack_dir / "s3.json"


def running_s3(settings: Settings) -> dict[str, object] | None:
    """The project's moto_server ({pid, port, uri}) if it is still alive."""
    return _live_state(s3_state_file(settings), b"moto_server")


def _live_state(path: Path, marker: bytes) -> dict[str, object] | None:
    """A helper server's recorded state if its process still runs (and is still that server:
    ``marker`` in its command line, so a reused pid does not count); a stale record is removed."""
    from pipelines.processes import process_gone

    try:
        state = json.loads(path.read_text())
        pid = int(state["pid"])
        alive = marker in Path(f"/proc/{pid}/cmdline").read_bytes() and not process_gone(pid)
    except (OSError, ValueError, KeyError, TypeError):
        alive = False
    if not alive:
        path.unlink(missing_ok=True)
        return None
    return dict(state)


def start_s3_repository(settings: Settings, source: Path) -> str:
    """Start moto_server, push ``source`` into it; return the S3 URI Triton should read."""
    from pipelines import local_s3
    from pipelines.storage import open_store
    from pipelines.storage.push import push_path

    for key, value in local_s3.CREDENTIALS.items():
        os.environ.setdefault(key, value)
    server, process = local_s3.start_s3(settings.stack_dir / "moto.log")
    uri = server.store_uri("mlreg", "model_repository")
    s3_state_file(settings).write_text(json.dumps({"pid": server.pid, "port": server.port, "uri": uri}))
    with warnings.catch_warnings():  # moto_server outlives this process, like tritonserver
        warnings.simplefilter("ignore", ResourceWarning)
        del process
    local_s3.create_bucket(server.endpoint, "mlreg")
    push_path(open_store(uri), source)
    return uri


def mlflow_state_file(settings: Settings) -> Path:
    return settings.stack_dir / "mlflow.json"


def running_mlflow(settings: Settings) -> dict[str, object] | None:
    """The project's MLflow UI server ({pid, url}) if it is still alive."""
    return _live_state(mlflow_state_file(settings), b"mlflow")


def start_ui(settings: Settings) -> str:
    """The MLflow UI on the project's embedded registry (started once); returns its URL."""
    running = running_mlflow(settings)
    if running is not None:
        return str(running["url"])
    from pipelines.local_mlflow import start_mlflow

    settings.home.mkdir(parents=True, exist_ok=True)
    server, process = start_mlflow(
        f"sqlite:///{settings.home / 'mlflow.db'}",
        settings.artifact_root,
        settings.stack_dir / "mlflow.log",
        serve_artifacts=False,
    )
    mlflow_state_file(settings).write_text(json.dumps({"pid": server.pid, "url": server.url}))
    with warnings.catch_warnings():  # the UI outlives this process, like tritonserver
        warnings.simplefilter("ignore", ResourceWarning)
        del process
    return server.url


def stack_up(
    settings: Settings,
    repository: str | Path | None = None,
    load: list[str] | tuple[str, ...] = (),
    ports: tuple[int, int, int] | None = None,
    s3: bool = False,
    ui: bool = False,
) -> StackStatus:
    if s3 and running_server(settings) is None:
        source = Path(repository or settings.local_repository).resolve()
        if not source.is_dir():
            raise StackError(
                f"model repository '{source}' does not exist",
                fix="build one with 'mlreg template build "
                f"{settings.local_repository}' or pass --repository PATH",
            )
        settings.stack_dir.mkdir(parents=True, exist_ok=True)
        repository = start_s3_repository(settings, source)
    elif s3:
        repository = (running_s3(settings) or {}).get("uri", repository)  # type: ignore[assignment]
    repo = str(repository or settings.local_repository)
    if "://" not in repo:
        repo_path = Path(repo).resolve()
        if not repo_path.is_dir():
            raise StackError(
                f"model repository '{repo_path}' does not exist",
                fix="build one with 'mlreg template build "
                f"{settings.local_repository}' or pass --repository PATH",
            )
        repo = str(repo_path)
    info = running_server(settings)
    already = info is not None
    if info is not None and info.repository != repo:
        raise StackError(
            f"the local stack already runs (pid {info.pid}) on another repository: {info.repository}",
            fix="run 'mlreg stack down' first, or omit --repository",
        )
    if info is None:
        info, process = local_triton.start_server(
            repo,
            settings.stack_dir,
            settings.backends_source,
            ports=ports,
        )
        local_triton.save_info(info, state_file(settings))
        with warnings.catch_warnings():  # the server is meant to outlive this process
            warnings.simplefilter("ignore", ResourceWarning)
            del process
    status = StackStatus(running=True, info=info, already_running=already)
    if ui:
        status.mlflow_url = start_ui(settings)
    if load:
        load_models(info, list(load), settings, status)
    return status


def load_models(info: ServerInfo, models: list[str], settings: Settings, status: StackStatus) -> None:
    with TritonControl(
        info.grpc_url, timeout=settings.triton_timeout, load_timeout=settings.triton_timeout * 10
    ) as triton:
        for model in models:
            try:
                triton.load(model)
            except MlregError as exc:
                exc.fix = f"{exc.fix}; server log: {info.log_path}"
                raise
            status.loaded.append(model)


def stack_status(settings: Settings) -> StackStatus:
    info = running_server(settings)
    if info is None:
        return StackStatus(running=False, info=None)
    status = StackStatus(running=True, info=info)
    status.mlflow_url = str((running_mlflow(settings) or {}).get("url", ""))
    try:
        with TritonControl(info.grpc_url, timeout=5.0) as triton:
            status.loaded = sorted(
                f"{m['name']}:{m.get('version', '')}"
                for m in triton.repository_index()
                if m.get("state") == "READY"
            )
    except MlregError as exc:
        log.warning("could not read the repository index: %s", exc)
    return status


def stack_down(settings: Settings) -> ServerInfo | None:
    """Stop the project's server; return what was stopped (None when nothing ran)."""
    info = running_server(settings)
    if info is None:
        return None
    local_triton.stop_pid(info.pid, info.shm_prefix)
    state_file(settings).unlink(missing_ok=True)
    ui = running_mlflow(settings)
    if ui is not None:
        from pipelines.local_mlflow import stop_mlflow

        stop_mlflow(int(ui["pid"]))  # type: ignore[call-overload]
        mlflow_state_file(settings).unlink(missing_ok=True)
    s3 = running_s3(settings)
    if s3 is not None:
        from pipelines.local_s3 import stop_s3

        stop_s3(int(s3["pid"]))  # type: ignore[call-overload]
        s3_state_file(settings).unlink(missing_ok=True)
    return info
