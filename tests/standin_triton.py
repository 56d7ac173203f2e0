"""A stand-in Triton fleet: N replicas in one process, on loopback, speaking the gRPC calls mlreg makes
(health, server metadata, repository index, load and unload with Triton's ``config`` and ``file:``
overrides, model readiness and config, statistics, inference) and serving Triton's metrics text (the
request counters a bake reads, the host memory gauges the headroom guard reads): mlreg's control
plane measured at a scale that real tritonservers do not reach on this machine
(tests/integration/test_fleet_scale.py, benchmarks/fleet_scale.py).

A test double, never a substitute for the real-server tests (tests/integration/test_fleet.py): it
does what mlreg relies on, as Triton 2.51 does it --

- a load reads the store as Triton reads its repository: the model's folder, its ``config.pbtxt``
  (parsed as Triton's ``ModelConfig``) unless the load sends one, and each version folder the
  version policy names (with its ``model.py`` for the python backend); anything missing fails the
  load, the version UNAVAILABLE with its reason in the repository index;
- a load takes ``load_delay`` seconds; the versions it names are READY at its end and the others
  unloaded; a failed load leaves what served READY (as 2.51 does after a failed warmup);
- the model-repository and statistics calls take only callers holding the control key, as a
  Triton started with ``--grpc-restricted-protocol`` (pipelines/triton/control_key.py);
- each READY version answers ``rate`` requests a second of simulated traffic (Triton's
  ``nv_inference_*`` counters grow from the moment it became READY, plus the real requests); the
  host memory gauges are refreshed every ``metrics_interval`` (Triton's ``--metrics-interval-ms``)
  and, like a real machine's, never read the same twice.

Faults, set on a ``Replica`` at any time: ``fail_loads`` (every load there that brings a version
fails with that reason), ``failing`` (versions whose traffic fails, ``FAILING_FACTOR`` x the rate,
and whose requests fail), ``memory_total`` (a replica short of memory), ``crash()`` (the server
dies and is restarted ``restart_after`` s later serving nothing; until then every call answers as
an address where nothing listens) and ``crash_on_load`` (the same, in the middle of a load of that
model: the load's caller sees its connection close), ``store_frozen`` (the repository index blocks, as
2.51's does on a frozen S3, while calls on loaded models answer).  Every gRPC call is counted
per replica and method (``Replica.calls``), the metrics scrapes apart (``Replica.scrapes``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from pipelines.triton.control_key import GRPC_HEADER, REFUSED

NOTHING_LISTENS = "failed to connect to all addresses; last error: UNKNOWN: Connection refused"
CONTROL = frozenset({"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "ModelStatistics"})
TRITON_VERSION = "2.51.0"
GIB, MIB = 2**30, 2**20
MEMORY_TOTAL = 64 * GIB  # a replica's host memory (nv_cpu_memory_total_bytes)
FAILING_FACTOR = 10  # a failing version's failures a second, x the rate (clients retry what fails)
LATENCY_US, QUEUE_US, COMPUTE_US = 2000, 100, 1500  # per simulated request
NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}
Reply = TypeVar("Reply")
FROZEN_MAX_S = 120.0  # a frozen store's repository index answers after this at the latest


class LoadFailed(Exception):
    """A load Triton would refuse: ``status`` and the message its client sees."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Version:
    state: str  # READY | UNAVAILABLE
    reason: str = ""
    since: float = 0.0  # monotonic time it became READY
    answered: int = 0  # real inference requests it answered


@dataclass
class Model:
    config: mc.ModelConfig = field(default_factory=mc.ModelConfig)
    versions: dict[str, Version] = field(default_factory=dict)


@dataclass(frozen=True)
class Load:
    """A load read from the store, before its delay: what becomes READY, what the store lacks."""

    model: str
    config: mc.ModelConfig
    versions: tuple[str, ...]
    missing: dict[str, str]  # version -> why it cannot load


@dataclass
class Replica:
    """One stand-in tritonserver's state; every method runs under its lock."""

    index: int
    store: Path
    load_delay: float
    rate: float
    metrics_interval: float
    key: str | None
    grpc_url: str = ""
    metrics_url: str = ""
    fail_loads: str = ""  # a reason: every load here fails with it
    failing: set[tuple[str, str]] = field(default_factory=set)  # (model, version) whose traffic fails
    memory_total: int = MEMORY_TOTAL
    memory_base: int = 4 * GIB
    footprint: int = 256 * MIB  # host memory a READY version holds
    calls: Counter[str] = field(default_factory=Counter)
    scrapes: int = 0
    models: dict[str, Model] = field(default_factory=dict)
    crash_on_load: str = ""  # a model: the next load of it crashes this replica mid-load (then it restarts)
    restart_after: float = 1.0  # seconds a crashed replica answers nothing (its supervisor restarts it)
    down_until: float = 0.0  # monotonic time until which every call finds nothing listening
    restarts: int = 0
    on_load: Callable[[str], None] | None = None  # told each load's model as it arrives (a test's trigger)
    # the store frozen (S3 SIGSTOPed), as measured on the real server (FACTS.md; H10, issue 45): the
    # repository index polls the repository and blocks; liveness, readiness, config and statistics
    # answer at once -- until an index call has been made: tritonserver answers those gRPC calls on
    # one thread, and each then waits behind the blocked index (inference still answers)
    store_frozen: bool = False
    index_blocked: bool = False  # an index call is blocked on the frozen store (until it thaws)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._gauge = (-1, 0)  # (refresh tick, used bytes)

    def crash(self) -> None:
        """The server dies (SIGKILL, SIGSEGV) and its supervisor starts it again ``restart_after`` s
        later, as Triton starts in explicit mode: serving nothing, its counters from zero."""
        with self.lock:
            self.models.clear()
            self.down_until = time.monotonic() + self.restart_after
            self.restarts += 1

    @property
    def down(self) -> bool:
        return time.monotonic() < self.down_until

    # -- what tests read -----------------------------------------------------------------------

    def ready(self, model: str) -> list[str]:
        """The READY versions of ``model``, in numeric order."""
        with self.lock:
            versions = self.models.get(model, Model()).versions
            return sorted((v for v, s in versions.items() if s.state == "READY"), key=int)

    def states(self) -> dict[str, dict[str, str]]:
        """model -> version -> state, every version this replica ever listed."""
        with self.lock:
            return {m: {v: s.state for v, s in model.versions.items()} for m, model in self.models.items()}

    # -- the repository ------------------------------------------------------------------------

    def repository_index(self, ready_only: bool) -> list[pb.RepositoryIndexResponse.ModelIndex]:
        folders = sorted(p.name for p in self.store.iterdir() if p.is_dir() and not p.name.startswith("."))
        entries = []
        with self.lock:
            for name in sorted({*folders, *self.models}):
                versions = self.models.get(name, Model()).versions
                if not versions and not ready_only:
                    entries.append(pb.RepositoryIndexResponse.ModelIndex(name=name))
                for version, state in sorted(versions.items(), key=lambda item: int(item[0])):
                    if not ready_only or state.state == "READY":
                        entries.append(
                            pb.RepositoryIndexResponse.ModelIndex(
                                name=name, version=version, state=state.state, reason=state.reason
                            )
                        )
        return entries

    def read_load(self, name: str, parameters: Any) -> Load:
        """What a load of ``name`` reads: its config (sent, or the store's) and version folders."""
        folder = self.store / name
        if not folder.is_dir():
            raise LoadFailed(
                grpc.StatusCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository"
            )
        config = self._config(name, folder, parameters)
        files = {key[len("file:") :] for key in parameters if key.startswith("file:")}
        versions = _policy_versions(config, folder)
        missing = {}
        for version in versions:
            if any(f.startswith(f"{version}/") for f in files):
                continue  # the load sends this version's files
            found = folder / version
            wanted = found / (config.default_model_filename or "model.py")
            if not found.is_dir():
                missing[version] = f"Not found: version folder '{found}' does not exist"
            elif config.backend == "python" and not wanted.is_file():
                missing[version] = f"Not found: '{wanted}' does not exist"
        return Load(name, config, versions, missing)

    def _config(self, name: str, folder: Path, parameters: Any) -> mc.ModelConfig:
        config = mc.ModelConfig()
        try:
            if "config" in parameters:
                json_format.Parse(parameters["config"].string_param, config)
            else:
                text_format.Parse((folder / "config.pbtxt").read_text(), config)
        except (json_format.ParseError, text_format.ParseError, OSError) as exc:
            raise LoadFailed(grpc.StatusCode.INVALID_ARGUMENT, f"failed to load '{name}': {exc}") from None
        if config.name and config.name != name:
            raise LoadFailed(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"failed to load '{name}': the configuration's name '{config.name}' differs",
            )
        config.name = name
        return config

    def finish_load(self, load: Load) -> str:
        """The load's end: "" with its versions READY and the others unloaded, else the error (the
        versions that served stay READY, the failed ones UNAVAILABLE with the reason)."""
        now = time.monotonic()
        with self.lock:
            model = self.models.setdefault(load.model, Model())
            failed = dict(load.missing)
            if self.fail_loads:  # what it brings fails; a load of what serves already succeeds
                new = [v for v in load.versions if model.versions.get(v, Version("")).state != "READY"]
                failed.update(dict.fromkeys(new, self.fail_loads))
            if failed:
                for version, why in sorted(failed.items()):
                    if model.versions.get(version, Version("")).state != "READY":
                        model.versions[version] = Version("UNAVAILABLE", f"Internal: {why}")
                return "".join(
                    f"load failed for model '{load.model}': version {v} is at UNAVAILABLE state: "
                    f"Internal: {why};\n"
                    for v, why in sorted(failed.items())
                )
            for version, state in model.versions.items():
                if version not in load.versions and state.state == "READY":
                    model.versions[version] = Version("UNAVAILABLE", "unloaded")
            for version in load.versions:
                if model.versions.get(version, Version("")).state != "READY":
                    model.versions[version] = Version("READY", since=now)
            model.config = load.config
        return ""

    def unload(self, name: str) -> None:
        with self.lock:
            for version, state in self.models.get(name, Model()).versions.items():
                if state.state == "READY":
                    self.models[name].versions[version] = Version("UNAVAILABLE", "unloaded")

    def is_ready(self, name: str, version: str) -> bool:
        with self.lock:
            versions = self.models.get(name, Model()).versions
            return any(s.state == "READY" for v, s in versions.items() if not version or v == version)

    def config_of(self, name: str) -> mc.ModelConfig | None:
        with self.lock:
            model = self.models.get(name)
            return model.config if model is not None and model.versions else None

    # -- inference and what it counts ------------------------------------------------------------

    def infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        """Y = X x the version number, for each output the config declares (or the request asks)."""
        name, wanted = request.model_name, request.model_version
        with self.lock:
            model = self.models.get(name, Model())
            ready = sorted((v for v, s in model.versions.items() if s.state == "READY"), key=int)
            version = wanted if wanted in ready else (ready[-1] if ready and not wanted else "")
            if not version:
                raise LoadFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"Request for unknown model: '{name}' version {wanted or 'latest'} is not at ready state",
                )
            if (name, version) in self.failing:
                raise LoadFailed(grpc.StatusCode.INTERNAL, f"{name} v{version}: failing (an injected fault)")
            model.versions[version].answered += 1
            outputs = [o.name for o in request.outputs] or [o.name for o in model.config.output]
        first = request.inputs[0]
        array = np.frombuffer(request.raw_input_contents[0], NUMPY.get(first.datatype, np.float32))
        answer = (array * int(version)).astype(array.dtype).tobytes()
        response = pb.ModelInferResponse(model_name=name, model_version=version, id=request.id)
        for output in outputs:
            response.outputs.add(name=output, datatype=first.datatype, shape=first.shape)
            response.raw_output_contents.append(answer)
        return response

    def _traffic(self, name: str, version: str, state: Version, now: float) -> tuple[int, int]:
        """(successes, failures) a READY version answered since it became READY."""
        simulated = int(self.rate * (now - state.since))
        if (name, version) in self.failing:
            return state.answered, simulated * FAILING_FACTOR
        return simulated + state.answered, 0

    def statistics(self, name: str, version: str) -> pb.ModelStatisticsResponse:
        response, now = pb.ModelStatisticsResponse(), time.monotonic()
        with self.lock:
            for model_name, model in sorted(self.models.items()):
                for v, state in model.versions.items():
                    if state.state != "READY" or (name and name != model_name) or (version and version != v):
                        continue
                    ok, failed = self._traffic(model_name, v, state, now)
                    stats = response.model_stats.add(name=model_name, version=v)
                    stats.inference_count = stats.execution_count = ok + failed
                    stats.inference_stats.success.count, stats.inference_stats.success.ns = (
                        ok,
                        ok * 1000 * LATENCY_US,
                    )
                    stats.inference_stats.fail.count = failed
        return response

    def metrics_text(self) -> str:
        """Triton's metrics text: per READY version its request counters, then the memory gauges."""
        now, lines = time.monotonic(), []
        with self.lock:
            self.scrapes += 1
            for name, model in sorted(self.models.items()):
                for version, state in sorted(model.versions.items()):
                    if state.state != "READY":
                        continue
                    ok, failed = self._traffic(name, version, state, now)
                    labels = f'model="{name}",version="{version}"'
                    total = ok + failed
                    lines += [
                        f"nv_inference_request_success{{{labels}}} {ok}",
                        f'nv_inference_request_failure{{{labels},reason="BACKEND"}} {failed}',
                        f"nv_inference_count{{{labels}}} {total}",
                        f"nv_inference_exec_count{{{labels}}} {total}",
                        f"nv_inference_request_duration_us{{{labels}}} {total * LATENCY_US}",
                        f"nv_inference_queue_duration_us{{{labels}}} {total * QUEUE_US}",
                        f"nv_inference_compute_infer_duration_us{{{labels}}} {total * COMPUTE_US}",
                    ]
            lines += [
                f"nv_cpu_memory_total_bytes {self.memory_total}",
                f"nv_cpu_memory_used_bytes {self._used(now)}",
            ]
        return "\n".join(lines) + "\n"

    def _used(self, now: float) -> int:
        """The host's used memory as the last refresh read it (refreshed every interval; a real
        machine's figure moves a few pages between two refreshes)."""
        tick = int(now / self.metrics_interval)
        if tick != self._gauge[0]:
            ready = sum(s.state == "READY" for m in self.models.values() for s in m.versions.values())
            self._gauge = (tick, self.memory_base + ready * self.footprint + (tick % 13) * 4096)
        return self._gauge[1]


def _policy_versions(config: mc.ModelConfig, folder: Path) -> tuple[str, ...]:
    """The versions Triton's version policy picks (specific, all, or the latest N of the store)."""
    policy = config.version_policy
    if policy.HasField("specific"):
        return tuple(str(v) for v in sorted(policy.specific.versions))
    numbered = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    if policy.HasField("all"):
        return tuple(str(v) for v in numbered)
    latest = policy.latest.num_versions if policy.HasField("latest") else 1
    return tuple(str(v) for v in numbered[-max(1, latest) :])


class Service(rpc.GRPCInferenceServiceServicer):
    """The gRPC methods mlreg calls, on one replica; the others answer UNIMPLEMENTED."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    async def _admit(self, method: str, context: Any) -> None:
        """Count the call; refuse a control call without the key, as Triton does; a crashed
        replica (until it is back) answers as an address where nothing listens."""
        self.replica.calls[method] += 1
        deadline = time.monotonic() + FROZEN_MAX_S
        while method != "ModelInfer" and self.replica.index_blocked and time.monotonic() < deadline:
            if not self.replica.store_frozen:
                self.replica.index_blocked = False
                break
            await asyncio.sleep(0.05)  # behind the blocked index, on Triton's one thread for these calls
        if self.replica.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, NOTHING_LISTENS)
        if method in CONTROL and self.replica.key is not None:
            if dict(context.invocation_metadata() or ()).get(GRPC_HEADER) != self.replica.key:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"{REFUSED}, expecting header '{GRPC_HEADER}'"
                )

    async def _answer(self, method: str, context: Any, work: Callable[[], Reply]) -> Reply:
        await self._admit(method, context)
        try:
            return work()
        except LoadFailed as exc:
            await context.abort(exc.status, str(exc))
            raise  # abort raises: never reached

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return await self._answer("ServerLive", context, lambda: pb.ServerLiveResponse(live=True))

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return await self._answer("ServerReady", context, lambda: pb.ServerReadyResponse(ready=True))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        extensions = ["model_repository", "statistics"]
        meta = pb.ServerMetadataResponse(name="triton", version=TRITON_VERSION, extensions=extensions)
        return await self._answer("ServerMetadata", context, lambda: meta)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        ready = self.replica.is_ready
        return await self._answer(
            "ModelReady", context, lambda: pb.ModelReadyResponse(ready=ready(request.name, request.version))
        )

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        def config() -> pb.ModelConfigResponse:
            found = self.replica.config_of(request.name)
            if found is None:
                raise LoadFailed(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}'")
            return pb.ModelConfigResponse(config=found)

        return await self._answer("ModelConfig", context, config)

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        await self._admit("RepositoryIndex", context)
        deadline = time.monotonic() + FROZEN_MAX_S
        self.replica.index_blocked = self.replica.store_frozen  # it blocks past its caller's deadline
        while self.replica.store_frozen and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the caller's deadline passes first (gRPC cancels this call)
        self.replica.index_blocked = False
        return pb.RepositoryIndexResponse(models=self.replica.repository_index(request.ready))

    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:
        await self._admit("RepositoryModelLoad", context)
        replica = self.replica
        try:
            if replica.on_load is not None:
                replica.on_load(request.model_name)
            wanted = replica.read_load(request.model_name, request.parameters)
            if set(wanted.versions) - set(replica.ready(wanted.model)):
                await asyncio.sleep(replica.load_delay)  # a version to initialise
            if replica.crash_on_load and replica.crash_on_load == request.model_name:
                replica.crash_on_load = ""
                replica.crash()  # mid-load: the client sees its connection close
                raise LoadFailed(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            error = replica.finish_load(wanted)
            if error:
                raise LoadFailed(grpc.StatusCode.INTERNAL, error)
        except LoadFailed as exc:
            await context.abort(exc.status, str(exc))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:
        def unload() -> pb.RepositoryModelUnloadResponse:
            self.replica.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._answer("RepositoryModelUnload", context, unload)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        statistics = self.replica.statistics
        return await self._answer(
            "ModelStatistics", context, lambda: statistics(request.name, request.version)
        )

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        return await self._answer("ModelInfer", context, lambda: self.replica.infer(request))


class StandinFleet:
    """``replicas`` stand-in tritonservers on one store: their gRPC servers and one metrics server
    (``/<index>/metrics``) on one event loop, in a thread of this process.  ``key``: the control
    key their model-repository and statistics calls require (None: open)."""

    def __init__(
        self,
        store: Path,
        replicas: int,
        *,
        load_delay: float = 0.2,
        rate: float = 20.0,
        metrics_interval: float = 2.0,
        key: str | None = None,
    ) -> None:
        self.store = Path(store)
        self.replicas = [
            Replica(i, self.store, load_delay, rate, metrics_interval, key) for i in range(replicas)
        ]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="standin-triton", daemon=True)
        self._servers: list[grpc.aio.Server] = []
        self._http: asyncio.Server | None = None

    def __enter__(self) -> StandinFleet:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _start(self) -> None:
        self._http = await asyncio.start_server(self._serve_metrics, "127.0.0.1", 0)
        http_port = self._http.sockets[0].getsockname()[1]
        for replica in self.replicas:
            server = grpc.aio.server()
            rpc.add_GRPCInferenceServiceServicer_to_server(Service(replica), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self._servers.append(server)
            replica.grpc_url = f"127.0.0.1:{port}"
            replica.metrics_url = f"http://127.0.0.1:{http_port}/{replica.index}/metrics"

    async def _serve_metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # the headers
            path = request[1] if len(request) > 1 else ""
            index = path.strip("/").split("/")[0]
            found = self.replicas[int(index)] if index.isdigit() and int(index) < len(self.replicas) else None
            status, body = ("200 OK", found.metrics_text()) if found else ("404 Not Found", "not found\n")
            data = body.encode()
            head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
            writer.write(f"{head}Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        finally:
            writer.close()

    def close(self) -> None:
        """Every server stopped and the loop's thread ended (idempotent)."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _stop(self) -> None:
        await asyncio.gather(*(server.stop(0) for server in self._servers))
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()

    # -- what tests and benchmarks read -----------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [r.grpc_url for r in self.replicas]

    def replica(self, url: str) -> Replica:
        return next(r for r in self.replicas if r.grpc_url == url)

    def metrics_table(self) -> str:
        """The environment's ``metrics = { target = url }`` table for mlreg.toml."""
        return "{ " + ", ".join(f'"{r.grpc_url}" = "{r.metrics_url}"' for r in self.replicas) + " }"

    def reset_counts(self) -> None:
        for replica in self.replicas:
            replica.calls.clear()
            replica.scrapes = 0
