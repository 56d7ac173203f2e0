"""A real ``tritonserver`` on this machine: the binary shipped in the nvidia-pytriton wheel.

The wheel carries Triton with only the python backend.  ``build_backend_dir``
lays out a backend directory holding that python backend (with the stub built
for the running Python) and mlreg's Python-based stand-ins for the onnxruntime
and TensorFlow backends, so ``onnxruntime_onnx`` and ``tensorflow_savedmodel``
configs load unchanged on CPU.  ``start_server`` checks the stub's shared
libraries first (a stub that cannot start makes ``load_model`` hang forever),
picks free ports, waits until the server is live and keeps its log;
``stop_pid`` sends SIGTERM, then SIGKILL after a bound, and removes the
server's shared-memory regions; ``stop_all`` stops several at once.  Start, health
check and stop are the managed process of ``pipelines.devstack.processes``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from pipelines.devstack.processes import GroupStop, ManagedProcess, process_runs, stop_group
from pipelines.devstack.processes import http_ok as http_ok  # re-exported for callers of the first launcher
from pipelines.devstack.processes import tail as tail
from pipelines.triton.control_key import restriction_args
from registry.errors import MissingDependencyError, StackError
from registry.settings import QUIET_TENSORFLOW

log = logging.getLogger(__name__)

EXIT_TIMEOUT_S = 5
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0
STUB_NAME = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
PORT_ATTEMPTS = 3
TRACES, TRACE_FILE = "traces", "trace.json"  # <state>/traces/trace.json.<n>: captured requests
# The one list of Triton's control arguments of every server mlreg drives: infra/compose/compose.yaml
# and infra/k8s/base/triton.yaml pass exactly these (tests/integration/test_infra.py compares them
# with server_command below). A replica loads the store's desired state on start (--load-model=*)
# and reports not-ready while a model it holds is not. The local stack departs on purpose in
# LOCAL_DEPARTURES only: it loads models on demand (stack up --load), and a failed load on it (the
# quality gate's scratch servers, tests) must not turn it not-ready (FACTS.md, strict readiness).
FLEET_SERVER_ARGS = (
    "--model-control-mode=explicit",
    "--load-model=*",
    "--strict-readiness=true",
    f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    "--allow-metrics=true",
    "--metrics-port=8002",
    "--metrics-interval-ms=2000",  # the memory gauges' refresh: a footprint is read after one
    "--backend-config=triton-backend-memory-tracker=true",  # ModelStatistics.memory_usage (ORT, TRT)
)
# the local stack reads its memory gauges every 500 ms: a footprint measured after a load waits one
LOCAL_DEPARTURES = {
    "--load-model": None,
    "--strict-readiness": "false",
    "--metrics-port": "<free port>",
    "--metrics-interval-ms": "500",
}
LOCAL_SERVER_ARGS = tuple(a for a in FLEET_SERVER_ARGS if a.partition("=")[0] not in LOCAL_DEPARTURES)


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's tritonserver, its libraries and the python backend live."""

    server: Path
    library_dirs: tuple[Path, ...]
    python_backend: Path
    stub: Path


def python_version_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def locate_triton() -> TritonInstall:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("nvidia-pytriton", "local", "The local Triton stack")
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    stub = root / "python_backend_stubs" / python_version_tag() / "triton_python_backend_stub"
    if not stub.is_file():
        shipped = sorted(p.name for p in (root / "python_backend_stubs").glob("*"))
        raise StackError(
            f"the nvidia-pytriton wheel has no python backend stub for Python "
            f"{python_version_tag()} (it ships: {', '.join(shipped) or 'none'})",
            fix="create the virtual environment with one of those Python versions",
        )
    libs = tuple(p for p in (package.parent / "nvidia_pytriton.libs", root / "lib") if p.is_dir())
    return TritonInstall(
        server=root / "bin" / "tritonserver",
        library_dirs=libs,
        python_backend=root / "backends" / "python",
        stub=stub,
    )


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its python stubs need."""
    env = dict(os.environ if base is None else base)
    python_lib = sysconfig.get_config_var("LIBDIR") or ""
    lib_path = [str(p) for p in install.library_dirs] + [python_lib]
    if env.get("LD_LIBRARY_PATH"):
        lib_path.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in lib_path if p)
    # the stub finds the virtual environment's packages (numpy, ...) through PATH
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key, value in QUIET_TENSORFLOW.items():  # the stand-in TensorFlow backend: no start-up lines
        env.setdefault(key, value)
    env.setdefault("MLREG_STANDIN_THREADS", "1")
    # no bytecode in the repository (infra/ sets the same): Triton may take a new entry in a model
    # folder as a change.  Measured on 2.51: the variable reaches the python stub, whose embedded
    # interpreter runs isolated (sys.flags.ignore_environment=1) and still writes __pycache__ into
    # a local store's version folder, so verification keeps tolerating it (pipelines/storage/verify.py)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def missing_libraries(binary: Path, env: dict[str, str]) -> list[str]:
    """Shared libraries ``binary`` needs that the dynamic loader cannot find."""
    try:
        out = subprocess.run(
            ["ldd", str(binary)], env=env, capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except FileNotFoundError:  # no ldd (not glibc): cannot check, the start-up wait still bounds it
        log.warning("ldd not found; skipping the shared-library check of %s", binary)
        return []
    return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]


def check_binaries(install: TritonInstall, env: dict[str, str]) -> None:
    for binary in (install.server, install.stub):
        missing = missing_libraries(binary, env)
        if missing:
            raise StackError(
                f"{binary} cannot start: shared libraries not found: {', '.join(missing)}",
                fix="reinstall nvidia-pytriton in this virtual environment "
                "(pip install --force-reinstall nvidia-pytriton) and make sure the Python "
                "it was created with has a shared libpython",
                binary=str(binary),
            )


def build_backend_dir(install: TritonInstall, standins: Path, dest: Path) -> Path:
    """Write ``dest`` = python backend + one folder per stand-in backend; return it."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        _copy_if_changed(source, python_dir / source.name)
    shared = standins / "standin_base.py"
    for backend in sorted(p for p in standins.iterdir() if (p / "model.py").is_file()):
        target = dest / backend.name
        target.mkdir(exist_ok=True)
        _copy_if_changed(backend / "model.py", target / "model.py")
        _copy_if_changed(shared, target / shared.name)
    return dest


def _copy_if_changed(source: Path, target: Path) -> None:
    if (
        target.exists()
        and target.stat().st_size == source.stat().st_size
        and (target.stat().st_mtime >= source.stat().st_mtime)
    ):
        return
    shutil.copy2(source, target)


def free_port() -> int:
    """One free port on 127.0.0.1 (free again the moment it is returned: see ``free_ports``)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1.  Each is held bound until all are picked: a port
    ``free_port`` returns is free again once it returns, so the kernel may hand it out twice, and a
    tritonserver given one port for two of its endpoints exits at start ("cannot listen to HTTP
    requests and metrics requests at the same address and port"; seen once in a suite run)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def three_free_ports() -> tuple[int, int, int]:
    """HTTP, gRPC and metrics ports for one tritonserver, all different (``free_ports``)."""
    http, grpc, metrics = free_ports(3)
    return http, grpc, metrics


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass
class ServerInfo:
    """What ``mlreg stack status`` shows and what a later command needs to reach the server."""

    pid: int
    grpc_port: int
    http_port: int
    metrics_port: int
    repository: str
    log_path: str
    shm_prefix: str
    started_at: float

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = asdict(self)
        data.update(grpc_url=self.grpc_url, http_url=self.http_url, metrics_url=self.metrics_url)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ServerInfo:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})  # type: ignore[arg-type]


def server_command(
    install: TritonInstall,
    repository: str,
    backend_dir: Path,
    ports: tuple[int, int, int],
    shm_prefix: str,
    control_key: str | None = None,
    trace_file: Path | None = None,
) -> list[str]:
    """``control_key``: the model-repository, trace and statistics endpoints answer only calls that
    carry it (pipelines/triton/control_key.py); None leaves them open (a test's own server).  ``trace_file``:
    where Triton writes the requests mlreg captures (off until capture is switched on per model:
    pipelines/checks/capture.py)."""
    grpc, http, metrics = ports
    return [
        str(install.server),
        f"--model-repository={repository}",
        *LOCAL_SERVER_ARGS,  # explicit mode, exit timeout, metrics: shared with infra/
        f"--backend-directory={backend_dir}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
        f"--metrics-interval-ms={LOCAL_DEPARTURES['--metrics-interval-ms']}",
        "--allow-gpu-metrics=false",
        "--strict-readiness=false",
        *(restriction_args(control_key) if control_key else []),
        *([f"--trace-config=triton,file={trace_file}"] if trace_file else []),
    ]


def start_server(
    repository: str | Path,
    state_dir: Path,
    standins: Path,
    *,
    ports: tuple[int, int, int] | None = None,
    timeout: float = START_TIMEOUT_S,
    install: TritonInstall | None = None,
    control_key: str | None = None,
) -> tuple[ServerInfo, subprocess.Popen[bytes]]:
    """Start tritonserver detached from this process's session; return once it is live.
    ``control_key``: lock its model-control API to that key (``server_command``)."""
    install = install or locate_triton()
    env = server_env(install)
    check_binaries(install, env)
    state_dir.mkdir(parents=True, exist_ok=True)
    backend_dir = build_backend_dir(install, standins, state_dir / "backends")
    if ports is not None:
        busy = [p for p in ports if port_in_use(p)]
        if busy:
            raise StackError(
                f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 already in use",
                fix="stop what listens there or choose other ports (omit them to pick free ones)",
            )
    last_error: StackError | None = None
    for _ in range(PORT_ATTEMPTS if ports is None else 1):
        chosen = ports or three_free_ports()
        try:
            return _launch(
                install, env, str(repository), backend_dir, chosen, state_dir, timeout, control_key
            )
        except _PortRace as race:
            last_error = race.error
    assert last_error is not None
    raise last_error


class _PortRace(Exception):
    def __init__(self, error: StackError) -> None:
        self.error = error


def triton_process(
    command: list[str], env: dict[str, str], http_port: int, log_path: Path, timeout: float
) -> ManagedProcess:
    """tritonserver as a managed process: live on /v2/health/live; SIGTERM to the server only (it
    stops its python stubs itself), the group SIGKILLed after the grace period."""
    return ManagedProcess(
        name="tritonserver",
        argv=command,
        health_url=f"http://127.0.0.1:{http_port}/v2/health/live",
        log_path=log_path,
        marker="tritonserver",
        env=env,
        start_timeout=timeout,
        stop_grace=STOP_GRACE_S,
        term_group=False,
    )


def _launch(
    install: TritonInstall,
    env: dict[str, str],
    repository: str,
    backend_dir: Path,
    ports: tuple[int, int, int],
    state_dir: Path,
    timeout: float,
    control_key: str | None = None,
) -> tuple[ServerInfo, subprocess.Popen[bytes]]:
    log_path = state_dir / "triton.log"
    shm_prefix = f"mlreg_{os.getpid()}_{ports[0]}_"
    traces = state_dir / TRACES
    traces.mkdir(exist_ok=True)
    command = server_command(
        install, repository, backend_dir, ports, shm_prefix, control_key, traces / TRACE_FILE
    )
    try:
        process = triton_process(command, env, ports[1], log_path, timeout).start()
    except StackError as error:
        remove_shm(shm_prefix)
        if "address already in use" in error.message.lower():
            raise _PortRace(error) from None
        raise
    info = ServerInfo(
        pid=process.pid,
        grpc_port=ports[0],
        http_port=ports[1],
        metrics_port=ports[2],
        repository=repository,
        log_path=str(log_path),
        shm_prefix=shm_prefix,
        started_at=time.time(),
    )
    return info, process


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs a tritonserver (not a zombie, not a recycled pid)."""
    return process_runs(pid, "tritonserver")


def stop_pid(
    pid: int,
    shm_prefix: str,
    *,
    grace: float = STOP_GRACE_S,
    process: subprocess.Popen[bytes] | None = None,
) -> bool:
    """SIGTERM the server, SIGKILL its process group after ``grace``; True if it had to be killed."""
    return stop_server(pid, shm_prefix, grace=grace, process=process).killed


def stop_server(
    pid: int,
    shm_prefix: str,
    *,
    grace: float = STOP_GRACE_S,
    process: subprocess.Popen[bytes] | None = None,
    started_at: float | None = None,
) -> GroupStop:
    """The server ``pid`` and its python stubs stopped -- also when the server is gone and its stubs
    are not (they ignore SIGTERM, and a hung warmup keeps one busy): SIGTERM to the server, SIGKILL
    to its process group after ``grace`` s, and to each stub left over.  A stub is ours when it is in
    the server's process group (``start_new_session``: the group's id is the server's pid) and its
    shared-memory region carries the server's own ``shm_prefix``."""
    stopped = stop_group(
        pid,
        lambda proc: is_stub_of(proc.cmdline(), shm_prefix),
        process,
        grace=grace,
        marker=None if process is not None else "tritonserver",
        started_at=started_at,  # a pid created after the recorded start is a recycled one
    )
    remove_shm(shm_prefix)
    return stopped


def is_stub_of(argv: Sequence[str], shm_prefix: str) -> bool:
    """``argv`` is a python backend stub of the server whose regions start with ``shm_prefix``
    (the stub's third argument is its shared-memory region: ``<prefix><uuid>``)."""
    return (
        len(argv) > 2
        and Path(argv[0]).name == STUB_NAME
        and bool(shm_prefix)
        and argv[2].startswith(shm_prefix)
    )


def stop_all(
    servers: Sequence[tuple[ServerInfo, subprocess.Popen[bytes] | None]], *, grace: float = STOP_GRACE_S
) -> list[bool]:
    """``stop_pid`` on every server at once: each gets its SIGTERM, then all are waited for and a
    straggler's group is SIGKILLed after ``grace``.  A server takes 2-4 s to exit (it unloads its
    models and checks once a second whether they are gone): N servers stop in the time of one.
    Whether each had to be killed, in order."""
    if len(servers) <= 1:
        return [stop_pid(info.pid, info.shm_prefix, grace=grace, process=p) for info, p in servers]
    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        stopping = [
            pool.submit(stop_pid, info.pid, info.shm_prefix, grace=grace, process=process)
            for info, process in servers
        ]
        return [future.result() for future in stopping]


def remove_shm(prefix: str) -> list[str]:
    removed = []
    for region in SHM_DIR.glob(f"{prefix}*"):
        try:
            region.unlink()
            removed.append(region.name)
        except OSError:
            log.warning("could not remove shared memory region %s", region)
    return removed


def save_info(info: ServerInfo, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info.to_dict(), indent=2))
    tmp.replace(path)


def load_info(path: Path) -> ServerInfo | None:
    try:
        return ServerInfo.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
