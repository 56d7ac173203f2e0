"""The local stack: one tritonserver per project, its state kept in ``.mlreg/stack``.

``stack_up`` never starts a second server for the same project: when the recorded
server is still alive it is reused (and asked to load the requested models).  A start that fails
stops what it started (moto_server, tritonservers, the UI: each by the pid it recorded, proven
ours), so no server is left running behind a stack that says it is not.  A server it starts
serves what the store says should serve (pipelines/devstack/restore.py, verified loads only); the
store is the one the stack records (``triton.json``'s ``repository``), which the built-in
``local`` environment writes (``served_store``).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.devstack import local_s3, local_triton, processes
from pipelines.devstack.local_mlflow import start_mlflow, stop_mlflow
from pipelines.devstack.local_s3 import stop_s3
from pipelines.devstack.local_triton import ServerInfo
from pipelines.devstack.restore import Registered, Restored, restore_served
from pipelines.triton.control import TritonControl
from pipelines.triton.control_key import local_key
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
    replicas: list[ServerInfo] = field(default_factory=list)  # `stack up --replicas N`: the others
    restored: Restored | None = None  # what a start brought back from the store (restore.py)

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"running": self.running}
        if self.info is not None:
            data.update(self.info.to_dict())
        if self.mlflow_url:
            data["mlflow_url"] = self.mlflow_url
        if self.loaded:
            data["loaded"] = self.loaded
        if self.replicas:
            data["replicas"] = [r.grpc_url for r in self.replicas]
        if self.info is not None:
            data["servers"] = self.servers()
        if self.restored is not None:
            data["restored"] = self.restored.loaded
            data["not_restored"] = self.restored.left
        return data

    def servers(self) -> list[dict[str, object]]:
        """Every replica's ports, replica 0 (the primary) first: what `targets` and `metrics` of a
        fleet environment name, without reading the replicas' state files."""
        found = [self.info, *self.replicas] if self.info is not None else []
        return [
            {
                "replica": index,
                "pid": server.pid,
                "grpc_url": server.grpc_url,
                "http_url": server.http_url,
                "metrics_url": server.metrics_url,
            }
            for index, server in enumerate(found)
        ]


def state_file(settings: Settings) -> Path:
    return settings.stack_dir / "triton.json"


def running_server(settings: Settings) -> ServerInfo | None:
    """The project's recorded server if it is still alive; a stale record is removed."""
    path = state_file(settings)
    info = local_triton.load_info(path)
    if info is None:
        return None
    if processes.running(path, "tritonserver") is not None:
        return info
    log.info("removed stale stack state for pid %d", info.pid)
    local_triton.remove_shm(info.shm_prefix)
    return None


def running_servers(settings: Settings) -> list[ServerInfo]:
    """The project's server and its extra replicas (``stack up --replicas N``) still alive."""
    primary = running_server(settings)
    if primary is None:
        return []
    return [primary, *_running_replicas(settings)]


def _running_replicas(settings: Settings) -> list[ServerInfo]:
    """The extra replicas still alive, whether or not the primary is (it may have been killed)."""
    found = []
    for path in sorted(settings.stack_dir.glob("replica-*/triton.json"), key=lambda p: p.parent.name):
        if processes.running(path, "tritonserver") is not None:
            info = local_triton.load_info(path)
            found.extend([info] if info is not None else [])
    return found


def start_replicas(
    settings: Settings, repository: str, replicas: int, undo: list[Callable[[], None]] | None = None
) -> list[ServerInfo]:
    """Extra tritonservers on the same repository up to ``replicas`` in all (issue 12); ``undo`` is
    given the way to stop each one started."""
    started = running_servers(settings)[1:]
    for index in range(len(started) + 1, replicas):
        state = settings.stack_dir / f"replica-{index}"
        info, process = local_triton.start_server(
            repository, state, settings.backends_source, control_key=local_key(settings.home).value
        )
        local_triton.save_info(info, state / "triton.json")
        if undo is not None:
            undo.append(functools.partial(_stop_triton, info, state / "triton.json"))
        with warnings.catch_warnings():  # the server is meant to outlive this process
            warnings.simplefilter("ignore", ResourceWarning)
            del process
        started.append(info)
    return started


def s3_state_file(settings: Settings) -> Path:
    return settings.stack_dir / "s3.json"


def running_s3(settings: Settings) -> dict[str, object] | None:
    """The project's moto_server ({pid, port, uri}) if it is still alive."""
    return processes.running(s3_state_file(settings), "moto_server")


def use_stack_credentials() -> None:
    """The local S3 server's credentials in this process's environment (where none are set):
    boto3 and tritonserver read them from there."""
    for key, value in local_s3.CREDENTIALS.items():
        os.environ.setdefault(key, value)


def start_s3_repository(
    settings: Settings, source: Path, undo: list[Callable[[], None]] | None = None
) -> str:
    """Start moto_server and copy the repository ``source`` into it as it is stored (seed.py: a
    promoted repository with its manifests, an empty one as nothing); return the S3 URI Triton
    should read.  ``undo`` is given the way to stop this moto_server again; a failure here stops
    it at once."""
    from pipelines.devstack.seed import seed_store  # lazy: store package ~0.15 s, S3 stacks only
    from pipelines.storage import open_store  # lazy: store package ~0.15 s, S3 stacks only

    use_stack_credentials()
    server, process = local_s3.start_s3(settings.stack_dir / "moto.log")
    uri = server.store_uri("mlreg", "model_repository")
    state = {"pid": server.pid, "marker": "moto_server", "port": server.port, "uri": uri}
    processes.write_state(s3_state_file(settings), state | {"source": str(source)})
    with warnings.catch_warnings():  # moto_server outlives this process, like tritonserver
        warnings.simplefilter("ignore", ResourceWarning)
        del process
    stop = functools.partial(_stop_s3, settings, server.pid)
    try:
        local_s3.create_bucket(server.endpoint, "mlreg")
        source_store = open_store(source, digest_cache=settings.digest_cache)
        seed_store(source_store, source, open_store(uri))
    except BaseException:
        stop()
        raise
    if undo is not None:
        undo.append(stop)
    return uri


def _stop_s3(settings: Settings, pid: int) -> None:
    """The moto_server this command started (its pid, still running moto_server), and its record."""
    stop_s3(pid)
    recorded = running_s3(settings)
    if recorded is None or recorded.get("pid") == pid:
        s3_state_file(settings).unlink(missing_ok=True)


def mlflow_state_file(settings: Settings) -> Path:
    return settings.stack_dir / "mlflow.json"


def running_mlflow(settings: Settings) -> dict[str, object] | None:
    """The project's MLflow UI server ({pid, url}) if it is still alive."""
    return processes.running(mlflow_state_file(settings), "mlflow")


def start_ui(settings: Settings, undo: list[Callable[[], None]] | None = None) -> str:
    """The MLflow UI on the project's embedded registry (started once); returns its URL.  ``undo``
    is given the way to stop it when this call started it."""
    running = running_mlflow(settings)
    if running is not None:
        return str(running["url"])
    settings.home.mkdir(parents=True, exist_ok=True)
    server, process = start_mlflow(
        f"sqlite:///{settings.home / 'mlflow.db'}",
        settings.artifact_root,
        settings.stack_dir / "mlflow.log",
        serve_artifacts=False,
    )
    processes.write_state(
        mlflow_state_file(settings), {"pid": server.pid, "marker": "mlflow", "url": server.url}
    )
    if undo is not None:
        undo.append(functools.partial(_stop_ui, settings, server.pid))
    with warnings.catch_warnings():  # the UI outlives this process, like tritonserver
        warnings.simplefilter("ignore", ResourceWarning)
        del process
    return server.url


def _stop_ui(settings: Settings, pid: int) -> None:
    """The MLflow UI this command started, and its record."""
    stop_mlflow(pid)  # only while that pid still runs mlflow (its marker)
    mlflow_state_file(settings).unlink(missing_ok=True)


def _local_repository(settings: Settings, repository: str | Path | None) -> Path:
    """The folder Triton serves: ``repository``, which must exist, or the project's local repository,
    created empty when nothing was built yet (``mlreg promote`` fills it)."""
    if repository is None:
        settings.local_repository.mkdir(parents=True, exist_ok=True)
        return settings.local_repository.resolve()
    path = Path(repository).resolve()
    if not path.is_dir():
        raise StackError(
            f"model repository '{path}' does not exist",
            fix=f"build one with 'mlreg template build {path}', or omit --repository to start "
            "on the project's repository (empty until 'mlreg promote')",
        )
    return path


def _repository(
    settings: Settings, repository: str | Path | None, s3: bool, undo: list[Callable[[], None]]
) -> str:
    """What Triton reads: a local folder, an S3 URI (``--s3``: the folder copied to moto_server)."""
    if s3 and running_server(settings) is None:
        source = _local_repository(settings, repository)
        settings.stack_dir.mkdir(parents=True, exist_ok=True)
        return start_s3_repository(settings, source, undo)
    if s3:
        return str((running_s3(settings) or {}).get("uri", repository))
    if repository is not None and "://" in str(repository):
        return str(repository)
    return str(_local_repository(settings, repository))


def stack_up(
    settings: Settings,
    repository: str | Path | None = None,
    load: list[str] | tuple[str, ...] = (),
    ports: tuple[int, int, int] | None = None,
    s3: bool = False,
    ui: bool = False,
    replicas: int = 1,
    step: Callable[[str], None] | None = None,
    registered: Registered | None = None,
) -> StackStatus:
    """Start (or find) the local stack.  ``step`` is told what starts next, as it starts (the
    CLI's progress line: starting a tritonserver and the MLflow UI takes seconds each).  A start
    that fails stops what this call started, then raises.  ``registered`` (model, version ->
    MLflow's ``artifact_digest``): each tritonserver this call starts is given what the store
    says should serve, verified (restore.py); None: it serves nothing until asked."""
    tell = step or (lambda _: None)
    undo: list[Callable[[], None]] = []
    try:
        status, fresh = _start(settings, repository, ports, s3, ui, replicas, tell, undo)
    except BaseException:
        _stop_started(undo)
        raise
    if registered is not None and fresh:
        tell("loading what the store says should serve (verified)")
        status.restored = restore(settings, fresh[0].repository, fresh, registered)
    if load:
        assert status.info is not None
        tell(f"loading {', '.join(load)}")
        load_models(status.info, list(load), settings, status)
        for replica in status.replicas:
            load_models(replica, list(load), settings, StackStatus(running=True, info=replica))
    return status


def _start(
    settings: Settings,
    repository: str | Path | None,
    ports: tuple[int, int, int] | None,
    s3: bool,
    ui: bool,
    replicas: int,
    tell: Callable[[str], None],
    undo: list[Callable[[], None]],
) -> tuple[StackStatus, list[ServerInfo]]:
    """The servers up (``undo``: how to stop each one this call started); the status and the
    tritonservers started now."""
    info = running_server(settings)
    if info is not None and repository is None:  # `mlreg stack up` again: the running one
        repo = info.repository
    else:
        if s3 and info is None:
            tell("copying the repository to a local S3 server (moto_server)")
        repo = _repository(settings, repository, s3, undo)
    already = info is not None
    if info is not None and info.repository != repo:
        raise StackError(
            f"the local stack already runs (pid {info.pid}) on another repository: {info.repository}",
            fix="run 'mlreg stack down' first, or omit --repository",
        )
    fresh: list[ServerInfo] = []
    if info is None:
        info = _start_primary(settings, repo, ports, tell, undo)
        fresh.append(info)
    status = StackStatus(running=True, info=info, already_running=already)
    if replicas > 1:
        tell(f"starting replicas 2 to {replicas} (each until it is ready)")
        before = {r.pid for r in running_servers(settings)}
        status.replicas = start_replicas(settings, repo, replicas, undo)
        fresh.extend(r for r in status.replicas if r.pid not in before)
    if ui:
        tell("starting the MLflow UI")
        status.mlflow_url = start_ui(settings, undo)
    return status, fresh


def _start_primary(
    settings: Settings,
    repo: str,
    ports: tuple[int, int, int] | None,
    tell: Callable[[str], None],
    undo: list[Callable[[], None]],
) -> ServerInfo:
    if repo.startswith("s3://"):  # Triton refuses an S3 prefix holding no object: mark its root
        from pipelines.storage import ensure_root  # lazy: store package ~0.15 s, S3 stacks only

        ensure_root(repo)
    tell("starting tritonserver (waiting until it is ready)")
    info, process = local_triton.start_server(
        repo,
        settings.stack_dir,
        settings.backends_source,
        ports=ports,
        # its control API locked (pipelines/triton/control_key.py)
        control_key=local_key(settings.home).value,
    )
    local_triton.save_info(info, state_file(settings))
    undo.append(functools.partial(_stop_triton, info, state_file(settings)))
    with warnings.catch_warnings():  # the server is meant to outlive this process
        warnings.simplefilter("ignore", ResourceWarning)
        del process
    return info


def _stop_triton(info: ServerInfo, record: Path) -> None:
    """A tritonserver this command started: its group stopped (proven ours by program and start
    time), its record removed."""
    local_triton.stop_server(info.pid, info.shm_prefix, started_at=info.started_at)
    record.unlink(missing_ok=True)


def _stop_started(undo: list[Callable[[], None]]) -> None:
    """Each server a failed start started, the last first; one that cannot be stopped is logged
    (the start's own error is the one raised)."""
    for stop in reversed(undo):
        try:
            stop()
        except Exception as exc:  # the start's failure is what the user must read
            log.warning("could not stop what the failed start started: %s", exc)


def restore(
    settings: Settings, repository: str, servers: list[ServerInfo], registered: Registered
) -> Restored:
    """What the store says should serve, loaded verified on ``servers`` (restore.py)."""
    from pipelines.storage import open_store  # lazy: store package ~0.15 s

    opened: dict[str, TritonControl] = {}

    def connect(url: str) -> TritonControl:
        if url not in opened:
            opened[url] = TritonControl(
                url,
                timeout=settings.triton_timeout,
                load_timeout=settings.triton_timeout * 10,
                key=local_key(settings.home),
            )
        return opened[url]

    store = open_store(repository, digest_cache=settings.digest_cache)
    try:
        urls = [server.grpc_url for server in servers]
        return restore_served(store, urls, connect, registered, ready_timeout=settings.triton_timeout * 10)
    finally:
        for control in opened.values():
            control.close()


def served_store(settings: Settings) -> str | None:
    """The store the running local stack serves (its record of ``--model-repository``): what the
    built-in ``local`` environment writes; None while the stack is down."""
    info = running_server(settings)
    if info is None:
        return None
    if info.repository.startswith("s3://"):
        use_stack_credentials()
    return info.repository


def load_models(info: ServerInfo, models: list[str], settings: Settings, status: StackStatus) -> None:
    with TritonControl(
        info.grpc_url,
        timeout=settings.triton_timeout,
        load_timeout=settings.triton_timeout * 10,
        key=local_key(settings.home),
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
    status = StackStatus(running=True, info=info, replicas=running_servers(settings)[1:])
    status.mlflow_url = str((running_mlflow(settings) or {}).get("url", ""))
    try:
        with TritonControl(info.grpc_url, timeout=5.0, key=local_key(settings.home)) as triton:
            status.loaded = sorted(
                f"{m['name']}:{m.get('version', '')}"
                for m in triton.repository_index()
                if m.get("state") == "READY"
            )
    except MlregError as exc:
        log.warning("could not read the repository index: %s", exc)
    return status


def stack_down(settings: Settings) -> list[ServerInfo]:
    """Stop the project's servers (``stop_stack``); return the tritonservers stopped ([] when none
    ran)."""
    return [replica.info for replica in stop_stack(settings)]


@dataclass
class StoppedReplica:
    """One replica ``stop_stack`` stopped: its name, its record and what stopping its group did."""

    name: str  # replica-0 (the primary), replica-1, ...
    info: ServerInfo
    group: processes.GroupStop

    def describe(self) -> str:
        """ "stopped replica-0: tritonserver (pid 8312) and 2 python stubs" -- what was signalled."""
        stubs = sum(1 for m in self.group.members if m == local_triton.STUB_NAME)
        others = len(self.group.members) - stubs
        rest = [f"{stubs} python stub{'s' if stubs != 1 else ''}"] if stubs else []
        rest += [f"{others} other process{'es' if others != 1 else ''}"] if others else []
        server = f"tritonserver (pid {self.info.pid})"
        if self.group.leader:
            text = f"stopped {self.name}: {' and '.join([server, *rest])}"
        else:
            text = f"stopped {self.name}: {' and '.join(rest)} left by {server}, which had already exited"
        if self.group.killed:
            text += " (SIGKILL was needed)"
        if self.group.left:
            text += f"; still running after SIGKILL: pid {', '.join(map(str, self.group.left))}"
        return text

    def to_dict(self) -> dict[str, object]:
        stubs = sum(1 for m in self.group.members if m == local_triton.STUB_NAME)
        return {
            "replica": self.name,
            "pid": self.info.pid,
            "tritonserver": self.group.leader,
            "python_stubs": stubs,
            "killed": self.group.killed,
            "left": self.group.left,
        }


def stop_stack(settings: Settings, kept: list[str] | None = None) -> list[StoppedReplica]:
    """Stop the project's servers -- the primary and every replica, each with its whole process
    group (python stubs included: they ignore SIGTERM and outlive their tritonserver, which may
    have died or been killed first) -- and the UI and S3 server it started; return what was
    stopped, replica by replica (none when nothing ran).  ``kept``: told what the S3 server held
    that was copied back to the project's repository folder before it stopped (``keep_s3``)."""
    records = [("replica-0", state_file(settings))] + [
        (path.parent.name, path)
        for path in sorted(settings.stack_dir.glob("replica-*/triton.json"), key=lambda p: p.parent.name)
    ]
    stopped = []
    for name, path in records:
        info = local_triton.load_info(path)
        if info is None:
            continue
        group = local_triton.stop_server(info.pid, info.shm_prefix, started_at=info.started_at)
        path.unlink(missing_ok=True)
        if group.stopped:
            stopped.append(StoppedReplica(name, info, group))
    stopped.sort(key=lambda r: r.name != "replica-0")  # the primary first, as before
    ui = running_mlflow(settings)
    if ui is not None:
        stop_mlflow(int(ui["pid"]))  # type: ignore[call-overload]
        mlflow_state_file(settings).unlink(missing_ok=True)
    s3 = running_s3(settings)
    if s3 is not None:
        copied = keep_s3(settings, s3)
        if kept is not None:
            kept.extend(copied)
        stop_s3(int(s3["pid"]))  # type: ignore[call-overload]
        s3_state_file(settings).unlink(missing_ok=True)
    return stopped


def keep_s3(settings: Settings, s3: dict[str, object]) -> list[str]:
    """Before the stack's moto_server stops (its objects live in memory only): what it holds,
    back into the project's own repository folder when that is what it was copied from
    (seed.copy_back; a folder given with --repository is the user's, never written).  What was
    copied, one line each; a store that cannot be read or written is one line, never a failed
    stop."""
    from pipelines.devstack.seed import copy_back  # lazy: store package ~0.15 s, S3 stacks only
    from pipelines.storage import open_store  # lazy: store package ~0.15 s, S3 stacks only

    source = str(s3.get("source") or "")
    if not source:
        return []
    if Path(source).resolve() != settings.local_repository.resolve():
        return [
            f"not copied back to {source} (a --repository folder is yours, never written): what was "
            "promoted on this stack's S3 server goes with it"
        ]
    use_stack_credentials()
    try:
        lines = copy_back(open_store(str(s3["uri"])), open_store(source, digest_cache=settings.digest_cache))
    except MlregError as exc:
        return [f"not copied back to {source}: {exc.message}"]
    return [f"copied back to {source}: {line}" for line in lines]
