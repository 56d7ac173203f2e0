"""The relay as a process: its parts built from the settings, the ASGI receiver, the worker and
the reconcile loop (``mlreg relay serve``).

The receiver (starlette) answers ``POST /webhook`` with 202 once the job is on disk, ``GET
/healthz`` and ``GET /status`` (the queue's counts, no secret).  The worker thread drains the queue
when woken (a delivery) or every second; the reconcile thread runs at start and every
``interval``.  Every wait has a deadline; SIGTERM/SIGINT stop uvicorn, then both threads (each
finishes the job it is on).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlreg.relay.actions import Deployer, deployer_for
from mlreg.relay.config import RelayConfig, load
from mlreg.relay.core import Relay
from mlreg.relay.queue import Queue
from mlreg.relay.wire import MAX_BODY
from registry.errors import MissingDependencyError

if TYPE_CHECKING:
    from pipelines.storage.base import Repository
    from registry.mlflow import MlflowRegistry
    from registry.settings import Settings

log = logging.getLogger("mlreg.relay")
HOST = "127.0.0.1"
PORT = 8086
IDLE_WAKE_S = 1.0  # the worker looks at the queue at least this often (a job left busy)
# SIGTERM waits for the job under way: an in-process promotion restores what it changed on its own
# exits, not on a thread killed under it (infra/k8s/base/relay.yaml gives the pod longer than this)
STOP_WAIT_S = 900.0


class RegistryAliases:
    """Aliases read from the embedded registry's file (no MLflow import), else MLflow's client."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._registry: MlflowRegistry | None = None

    def _client(self) -> MlflowRegistry:
        if self._registry is None:
            from mlreg.ops.context import open_registry  # lazy: MLflow (~1 s)

            self._registry = open_registry(self.settings)
        return self._registry

    def holders(self, alias: str) -> dict[str, str]:
        from registry.mlflow import sqlite  # lazy: the embedded registry's reader

        found = sqlite.alias_holders(self.settings.tracking_uri, alias)
        return found if found is not None else dict(self._client().models.alias_versions(alias))

    def version(self, model: str, alias: str) -> str:
        from registry.mlflow import sqlite  # lazy: the embedded registry's reader

        record = sqlite.registered_model(self.settings.tracking_uri, model)
        if record is not None:
            return record.aliases.get(alias, "")
        if sqlite.model_absent(self.settings.tracking_uri, model):
            return ""
        return str(self._client().models.aliases(model).get(alias, ""))


class Stores:
    """Each environment's store, opened once."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._open: dict[str, Repository] = {}
        self._lock = threading.Lock()

    def __call__(self, env: str) -> Repository:
        with self._lock:
            if env not in self._open:
                from mlreg.ops.context import environment  # lazy: the environments' settings
                from pipelines.storage import open_store  # lazy: boto3 for an S3 store

                self._open[env] = open_store(
                    environment(self.settings, env).store, digest_cache=self.settings.digest_cache
                )
            return self._open[env]


def queue_path(settings: Settings) -> Any:
    return settings.home / "relay" / "queue.db"


def build(settings: Settings, config: RelayConfig | None = None, receive: bool = True) -> Relay:
    """The relay of the project: its mlreg.toml, its queue under .mlreg/relay/, its stores
    (``receive``: the webhook secret is read, else the relay can only reconcile and report)."""
    config = config or load(settings)
    deployers: dict[str, Deployer] = {}

    def deployer(env: str) -> Deployer:
        if env not in deployers:
            deployers[env] = deployer_for(settings, config, env)
        return deployers[env]

    return Relay(
        settings,
        config,
        Queue(queue_path(settings)),
        Stores(settings),
        deployer,
        RegistryAliases(settings),
        config.secret() if receive else b"",
    )


def app(relay: Relay) -> Any:
    """The ASGI receiver of ``relay``."""
    try:
        from starlette.applications import Starlette  # lazy: ~50 ms the CLI's other verbs never pay
    except ImportError:
        raise MissingDependencyError("starlette", "relay", "mlreg relay serve") from None
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def webhook(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            return JSONResponse({"refused": f"body over {MAX_BODY} bytes"}, status_code=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return JSONResponse({"refused": f"body over {MAX_BODY} bytes"}, status_code=413)
        headers = {key.lower(): value for key, value in request.headers.items()}
        from starlette.concurrency import run_in_threadpool  # lazy: with starlette

        status, doc = await run_in_threadpool(relay.receive, headers, bytes(body))
        return JSONResponse(doc, status_code=status)

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def status(_: Request) -> JSONResponse:
        return JSONResponse({"queue": relay.queue.counts()})

    routes = [
        Route("/webhook", webhook, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/status", status),
    ]
    return Starlette(routes=routes)


@dataclass
class Loops:
    """The worker and the reconcile loop of one relay, stopped by ``stop``."""

    relay: Relay
    stop: threading.Event
    reconcile_at_start: bool = True

    def worker(self) -> None:
        while not self.stop.is_set():
            self.relay.wake.wait(IDLE_WAKE_S)
            self.relay.wake.clear()
            try:
                self.relay.drain()
            except Exception:  # a bug must not stop the relay: logged, the job stays pending
                log.exception("relay: the worker failed; it goes on")

    def reconciler(self) -> None:
        first = self.reconcile_at_start
        while first or not self.stop.wait(self.relay.config.interval):
            first = False
            try:
                self.relay.reconcile()
            except Exception:
                log.exception("relay: reconcile failed; it runs again in %.0f s", self.relay.config.interval)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.worker, name="relay-worker", daemon=True)]
        threads.append(threading.Thread(target=self.reconciler, name="relay-reconcile", daemon=True))
        for thread in threads:
            thread.start()
        return threads


def serve(relay: Relay, host: str = HOST, port: int = PORT) -> None:
    """Run the receiver on ``host:port`` with the worker and reconcile loops until SIGTERM/SIGINT."""
    import uvicorn  # lazy: ~0.1 s the CLI's other verbs never pay

    stop = threading.Event()
    threads = Loops(relay, stop).start()
    server = uvicorn.Server(
        uvicorn.Config(app(relay), host=host, port=port, log_level="warning", access_log=False)
    )
    try:
        server.run()
    finally:
        stop.set()
        relay.stopping.set()
        relay.wake.set()
        deadline = time.monotonic() + STOP_WAIT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


__all__ = ["HOST", "PORT", "Loops", "RegistryAliases", "Stores", "app", "build", "queue_path", "serve"]
