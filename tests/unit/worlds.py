"""The world the promotion's unit tests run in: an ensemble ``ens`` over two members (``pre`` and
``net``) registered in the fake registry of tests/fakes.py, a real local folder as the store, and
two fake Tritons (``Servers``) whose every load and unload is written to one event list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.context import Options
from pipelines.core.reports import PromotionResult
from pipelines.promote.environments import Environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.storage.base import Repository
from registry.errors import TritonError
from registry.settings import Settings
from tests.fakes import Call, FakeRegistry, FakeTarget

MEMBER = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "{src}" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "{dst}" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: 1
      input_map { key: "IN" value: "IN" } output_map { key: "MID" value: "mid" } },
    { model_name: "net" model_version: 1
      input_map { key: "MID" value: "mid" } output_map { key: "OUT" value: "OUT" } }
  ]
}
"""


def scorer_8_and_10(tmp_path: Path, config: str) -> Repository:
    """A local store with scorer v8 and v10 stored (``model.py`` reads ``v8`` / ``v10``) and
    ``config`` as scorer's config: the set-up of the fenced-upload tests (which versions serve is
    the config's word; the caller adds the upload's marker)."""
    store = Repository.local(tmp_path / "store")
    for version in ("8", "10"):
        folder = tmp_path / "src" / version
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(f"v{version}\n")
        store.versions.put_version("scorer", version, folder)
    store.session.write_config("scorer", config)
    return store


class Servers:
    """The environment's Tritons: ``FakeTarget`` s sharing one handler, which writes every load and
    unload to one event list (so the order can be asserted) and provokes the faults a test asks for."""

    def __init__(self, store_root: Path) -> None:
        self.store = open_store(store_root)
        self.events: list[tuple[Any, ...]] = []
        self.locks_seen: list[set[str]] = []
        self.fail_load: set[tuple[str, str, str]] = set()  # (model, version, url or "*")
        self.nan_answers: set[tuple[str, str]] = set()
        self.targets: dict[str, FakeTarget] = {}
        self.pins: list[tuple[str, str, dict[str, str]]] = []  # (url, ensemble, pins) of each load
        self.loads = 0
        self.fail_at_load = 0  # the Nth load (from 1) fails; 0: none
        self.broken: list[str] = []  # an ensemble pinned to a member version not READY there

    def handle(self, target: FakeTarget, call: Call) -> None:
        if call.method == "unload":
            self.events.append(("unload", call.url, call.model))
        if call.method != "load":
            return
        self.events.append(("load", call.url, call.model, call.versions))
        if call.pins:
            self.pins.append((call.url, call.model, dict(call.pins)))
        self.locks_seen.append({m for m in ("pre", "net", "ens") if self.store.session.read_lock(m)})
        self.loads += 1
        if self.loads == self.fail_at_load:
            raise TritonError(f"{call.url}: model '{call.model}' failed to load (load {self.loads})")
        for version in call.versions:
            if {(call.model, version, call.url), (call.model, version, "*")} & self.fail_load:
                target.states[call.model] = {version: "UNAVAILABLE"}
                raise TritonError(f"{call.url}: model '{call.model}' version {version} failed to load")

    def read_config(self, model: str) -> str:
        """What Triton reads without an override: the store's config."""
        text = self.store.read_config(model)
        assert text is not None, f"{model} has no config in the store"
        return text

    def answer(self, model: str, version: str) -> float:
        return np.nan if (model, version) in self.nan_answers else 0.0

    def check(self, target: FakeTarget) -> None:
        """After every change of a target: each loaded ensemble's pins name READY versions."""
        for ensemble, pins in target.ensembles.items():
            for member, version in pins.items():
                ready = [v for v, s in target.states.get(member, {}).items() if s == "READY"]
                if not ready or (version != "-1" and version not in ready):
                    self.broken.append(f"{target.url}: {ensemble} pins {member} v{version}, READY {ready}")

    def connect(self, url: str) -> FakeTarget:
        if url not in self.targets:
            self.targets[url] = FakeTarget(
                url, self.handle, read_config=self.read_config, answer=self.answer, on_change=self.check
            )
        return self.targets[url]


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
        self.store_root = tmp_path / "store"
        self.store_root.mkdir()
        self.env = Environment("test", str(self.store_root), ("t0:8001", "t1:8001"), "test", gpu=False)
        self.fleet = Servers(self.store_root)
        self.events = self.fleet.events
        self.registry = FakeRegistry(tmp_path / "registry", self.events)
        self.registry.add("pre", "1", MEMBER.format(name="pre", src="IN", dst="MID"))
        self.registry.add("net", "1", MEMBER.format(name="net", src="MID", dst="OUT"))
        self.registry.add("ens", "1", ENSEMBLE)

    def promote(self, model: str, version: str, **options: Any) -> PromotionResult:
        promotion = Promotion(
            self.settings,
            self.env,
            self.registry,
            Options(skip_quality=True, **options),
            connect=self.fleet.connect,
        )
        return promotion.run(model, version)

    def config(self, model: str) -> str | None:
        return open_store(self.store_root).read_config(model)

    def loads(self, since: int = 0) -> list[tuple[Any, ...]]:
        return [e for e in self.events[since:] if e[0] == "load"]
