"""The relay's unit-test world: a real embedded MLflow registry (a copy of the run's sqlite file,
versions and alias rows written with sqlite3), a real local store (its lock, the relay's record),
real queues, a real uvicorn on 127.0.0.1 -- and a stand-in deployer: what a deployment *does* to
Triton is the promotion's (tested elsewhere); here it only has to be counted.  The stand-in keeps
what the environment serves in memory and counts every deploy; it never decides anything itself.
"""

from __future__ import annotations

import shutil
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlreg.relay.actions import Outcome
from mlreg.relay.config import RelayConfig, Target
from mlreg.relay.core import Relay
from mlreg.relay.queue import Queue
from mlreg.relay.service import RegistryAliases, app
from mlreg.relay.wire import payload, sign
from pipelines.storage.base import Repository
from registry.settings import Settings

SECRET = b"relay-test-secret-0123456789"
MODEL = "a"


class Clock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class StandIn:
    """What an environment serves (model -> version) and every deploy made to it."""

    served: dict[str, str] = field(default_factory=dict)
    deploys: list[tuple[str, str, str]] = field(default_factory=list)  # (env, model, version)
    pause: float = 0.0  # seconds a deploy takes (widens the window two relays could race in)
    refuse: set[str] = field(default_factory=set)  # versions "the promotion" refuses

    def serving(self, env: str, model: str) -> str:
        return self.served.get(model, "")

    def deploy(self, env: str, model: str, version: str) -> Outcome:
        if version in self.refuse:
            return Outcome("refused", f"version {version} breaks the contract")
        self.deploys.append((env, model, version))
        time.sleep(self.pause)
        self.served[model] = version
        return Outcome("done", "promoted")


def registry_with_versions(db: Path, model: str, count: int) -> None:
    """``model`` gets versions 2..count, each a copy of version 1's row (the alias rows stay)."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        row = dict(
            conn.execute("SELECT * FROM model_versions WHERE name = ? AND version = 1", (model,)).fetchone()
        )
        for version in range(2, count + 1):
            row["version"] = version
            marks = ",".join("?" for _ in row)
            conn.execute(f"INSERT INTO model_versions ({','.join(row)}) VALUES ({marks})", list(row.values()))


def set_alias(db: Path, model: str, alias: str, version: str) -> None:
    """The alias row written straight into MLflow's database (what no webhook ever sees)."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM registered_model_aliases WHERE name = ? AND alias = ?", (model, alias))
        conn.execute(
            "INSERT INTO registered_model_aliases (name, alias, version) VALUES (?, ?, ?)",
            (model, alias, int(version)),
        )


def home_with_registry(state_home: Path, dest: Path, versions: int) -> Settings:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(state_home / "mlflow.db", dest / "mlflow.db")
    registry_with_versions(dest / "mlflow.db", MODEL, versions)
    return Settings.from_env(env={"MLREG_HOME": str(dest)})


def make_relay(
    settings: Settings,
    store_root: Path,
    standin: StandIn,
    clock: Clock,
    follows: dict[str, str] | None = None,
    queue_file: Path | None = None,
    targets: dict[str, Target] | None = None,
) -> Relay:
    config = RelayConfig(
        settings.home / "mlreg.toml", follows or {"production": "champion"}, targets or {}, interval=1.0
    )
    store = Repository.local(store_root)
    return Relay(
        None,
        config,
        Queue(queue_file or settings.home / "relay" / "queue.db"),
        lambda env: store,
        lambda env: standin,
        RegistryAliases(settings),
        SECRET,
        clock,
    )


def delivery(
    model: str, alias: str, version: str, stamp: float, secret: bytes = SECRET, delivery_id: str = ""
) -> tuple[dict[str, str], bytes]:
    """Headers (lower-case) and body as MLflow 3.17 sends an alias move."""
    body = payload(model, alias, version)
    ident, when = delivery_id or str(uuid.uuid4()), str(int(stamp))
    headers = {
        "content-type": "application/json",
        "x-mlflow-delivery-id": ident,
        "x-mlflow-timestamp": when,
        "x-mlflow-signature": sign(secret, ident, when, body),
    }
    return headers, body


@contextmanager
def served_app(relay: Relay) -> Iterator[str]:
    """The relay's real ASGI app on a real uvicorn bound to 127.0.0.1: its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app(relay), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 20 s"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
