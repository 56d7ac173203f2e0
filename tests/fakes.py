"""One fake per Protocol the promotion depends on (pipelines/core/ports.py), shared by the tests.

``FakeTarget`` (``ServingTarget``) is httpx's ``MockTransport(handler)``: the fake keeps a
Triton's state (which versions of which model are READY, an ensemble's pins) and hands every
request -- ``is_live``, ``load``, ``unload`` -- to ``handler(target, call)`` first; a test records
calls or provokes a fault there (raise ``TritonError`` to fail the request).  ``FakeRegistry``
(``Registry``) keeps registered versions as folders and aliases and tags in memory, its runs in
its ``runs`` part (``FakeRuns``); ``down`` or ``fail_on`` make its calls fail as an unreachable
MLflow does.

The promotion's Deployer and Gate and the lease's LockStore are not faked: the tests run the real
ones on a real local store.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from registry.errors import RegistryError

# -- ServingTarget -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request a target received: what its handler sees (MockTransport's ``Request``)."""

    url: str
    method: str  # "is_live", "load" or "unload"
    model: str = ""
    config: str | None = None  # a load's config override (Triton's load API: JSON)
    versions: tuple[str, ...] = ()  # the versions a load makes READY
    pins: Mapping[str, str] = field(default_factory=dict)  # a loaded ensemble's member versions


Handler = Callable[["FakeTarget", Call], None]


def answer_all(target: FakeTarget, call: Call) -> None:
    """The handler of a healthy server: every request succeeds."""


class FakeTarget:
    """A Triton as the promotion sees it.  A load serves the versions of the config it is sent
    (the load API's override), else of ``read_config(model)`` (the store's, as Triton reads it)."""

    def __init__(
        self,
        url: str,
        handler: Handler = answer_all,
        *,
        read_config: Callable[[str], str | None] | None = None,
        answer: Callable[[str, str], float] | None = None,
        on_change: Callable[[FakeTarget], None] | None = None,
        ready: Callable[[FakeTarget, str, str], bool] | None = None,
    ) -> None:
        self.url = url
        self.handler = handler
        self.read_config = read_config
        self.answer = answer or (lambda model, version: 0.0)  # the value every output is filled with
        self.on_change = on_change or (lambda target: None)  # after each load or unload
        self.ready = ready or FakeTarget.is_ready  # what wait_ready asks: by default, the loads' states
        self.states: dict[str, dict[str, str]] = {}
        self.ensembles: dict[str, dict[str, str]] = {}  # a loaded model's pins (ensembles)
        self.configs: list[dict[str, Any]] = []  # each load's override as JSON ({} without one)
        self.traces: dict[str, dict[str, list[str]]] = {}  # model -> its trace settings

    def _contract(self, model: str, config: str | None) -> tuple[list[str], dict[str, str]]:
        from google.protobuf import json_format

        from pipelines.core.plan import ensemble_pins, serving_versions
        from registry.contracts.config import model_config_pb2

        if config is not None:
            parsed = json_format.Parse(config, model_config_pb2().ModelConfig())
            versions = [str(v) for v in parsed.version_policy.specific.versions]
            return versions, {s.model_name: str(s.model_version) for s in parsed.ensemble_scheduling.step}
        text = self.read_config(model) if self.read_config else None
        return (serving_versions(text), ensemble_pins(text)) if text is not None else ([], {})

    def is_live(self) -> bool:
        self.handler(self, Call(self.url, "is_live"))
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"version": "2.51.0"}

    def model_states(self) -> dict[str, dict[str, str]]:
        return {m: dict(v) for m, v in self.states.items()}

    def load(self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        versions, pins = self._contract(model, config)
        self.handler(self, Call(self.url, "load", model, config, tuple(versions), pins))
        self.configs.append(json.loads(config) if config else {})
        self.states[model] = dict.fromkeys(versions, "READY")
        self.ensembles[model] = pins
        self.on_change(self)

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.handler(self, Call(self.url, "unload", model))
        self.states.pop(model, None)
        self.ensembles.pop(model, None)
        self.on_change(self)

    def model_config(self, model: str) -> dict[str, Any]:
        steps = [{"model_name": m, "model_version": int(v)} for m, v in self.ensembles.get(model, {}).items()]
        return {"name": model, "ensemble_scheduling": {"step": steps}} if steps else {"name": model}

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None:
        from registry.errors import TritonError

        if not self.ready(self, model, version):
            raise TritonError(f"{self.url}: model '{model}' version {version} is not READY")

    def is_ready(self, model: str, version: str = "") -> bool:
        return self.states.get(model, {}).get(version) == "READY"

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        return {name: np.full((2,), self.answer(model, version), np.float32) for name in outputs}

    def statistics(self, model: str = "") -> list[dict[str, Any]]:
        return []  # no counters: whether a load re-created a version is not known here

    def trace_settings(self, model: str, settings: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
        self.handler(self, Call(self.url, "trace", model))
        found = self.traces.setdefault(model, {"trace_level": ["OFF"]})
        found.update({k: v if isinstance(v, list) else [str(v)] for k, v in (settings or {}).items()})
        return dict(found)

    def close(self) -> None:
        pass


# -- Registry ----------------------------------------------------------------------------------

MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]  # version {version}
"""


class FakeRegistry:
    """Registered versions as folders under ``root`` (config.pbtxt + model/), aliases and tags in
    memory: the registry's ``models`` part itself, with its ``runs`` (``FakeRuns``: the runs
    started, in ``recorded``) and ``deployed`` (``FakeDeployments``) parts beside it, as
    ``MlflowRegistry`` has them.  Registrations and alias moves are appended to ``events``.
    ``down`` fails every call, ``fail_on`` the calls it names ("set_alias" or "set_alias ens")."""

    uri = "memory://registry"

    def __init__(self, root: Path | None = None, events: list[tuple[Any, ...]] | None = None) -> None:
        self.root = root or Path("/nonexistent-fake-registry")
        self.events = events if events is not None else []
        self.tags: dict[tuple[str, str], dict[str, str]] = {}
        self.alias_map: dict[str, dict[str, str]] = {}
        self.recorded: list[dict[str, Any]] = []  # the runs started, newest last (``runs``)
        self.down = False
        self.fail_on: set[str] = set()
        self.deleted: dict[str, int] = {}  # model -> the highest version number deleted
        self.runs = FakeRuns(self)
        self.deployed = FakeDeployments(self)

    @property
    def models(self) -> FakeRegistry:
        """The versions part (``MlflowRegistry.models``): this fake holds its versions itself."""
        return self

    def _call(self, method: str, name: str = "") -> None:
        if self.down or method in self.fail_on or f"{method} {name}" in self.fail_on:
            raise RegistryError(f"MLflow ({self.uri}): {method} failed: connection refused")

    def add(self, name: str, version: str, config: str, validation: str = "passed") -> None:
        """Register ``config`` (a python model's, or an ensemble's) as ``name`` ``version``."""
        from pipelines.core.plan import config_facts
        from registry.manifest import artifact_digest

        folder = self.root / name / version
        (folder / "model" / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config)
        if not config_facts(config).is_ensemble:
            (folder / "model" / "model.py").write_text(MODEL_PY.format(version=version))
        digest = artifact_digest(folder / "model", folder / "config.pbtxt")
        self.tags[(name, version)] = {"validation": validation, "artifact_digest": digest}

    # -- what composes the parts (``DerivedVersions``) --------------------------------------------

    def register_version(
        self,
        name: str,
        version_dir: Path,
        config_path: Path,
        *,
        members: dict[str, str] | None = None,
        export_info: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        self._call("register_version", name)
        # MLflow's counter: a deleted version's number is never given again
        version = str(1 + max([int(v) for (m, v) in self.tags if m == name] + [self.deleted.get(name, 0)]))
        self.add(name, version, config_path.read_text())
        self.tags[(name, version)].update(tags or {})  # set as the version is created
        self.events.append(("register", name, version, tuple(sorted((members or {}).items()))))
        return version

    def delete_version(self, name: str, version: str) -> None:
        self._call("delete_version", name)
        if self.tags.pop((name, version), None) is None:
            raise RegistryError(f"{name} v{version} is not a registered version")
        shutil.rmtree(self.root / name / version)
        self.deleted[name] = max(self.deleted.get(name, 0), int(version))
        self.events.append(("delete", name, version))

    # -- the models part (``RegistryReader``, ``RegistryWriter``) ---------------------------------

    def warm_up(self) -> None:
        pass

    def ping(self) -> None:
        self._call("ping")

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        self._call("fetch_version", name)
        source = self.root / name / version
        shutil.copy2(source / "config.pbtxt", dest / "config.pbtxt")
        shutil.copytree(source / "model", dest / version)
        return dict(self.tags[(name, version)])

    def delete_model(self, name: str) -> None:
        self._call("delete_model", name)
        if any(m == name for m, _ in self.tags):
            raise RegistryError(f"model '{name}' still has versions")
        self.alias_map.pop(name, None)
        self.events.append(("delete_model", name))

    def version(self, name: str, version: str) -> Any:
        self._call("version", name)
        if (name, version) not in self.tags:
            raise RegistryError(f"{name} v{version} is not a registered version")
        return SimpleNamespace(version=version, run_id=f"{name}/{version}", tags=self.tags[(name, version)])

    def versions(self, name: str) -> list[Any]:
        return [self.version(m, v) for (m, v) in self.tags if m == name]

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        self._call("version_tags", name)
        return dict(self.version(name, version).tags)

    def aliases(self, name: str) -> dict[str, str]:
        self._call("aliases", name)
        return dict(self.alias_map.get(name, {}))

    def require_model(self, name: str) -> dict[str, str]:
        if not any(m == name for m, _ in self.tags) and name not in self.alias_map:
            raise RegistryError(f"model '{name}' is not registered in MLflow ({self.uri})")
        return self.aliases(name)

    def alias_versions(self, alias: str) -> dict[str, str]:
        self._call("alias_versions")
        return {m: a[alias] for m, a in self.alias_map.items() if alias in a}

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call("set_alias", name)
        self.events.append(("alias", name, version))
        self.alias_map.setdefault(name, {})[alias] = version

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._call("set_version_tag", name)
        self.tags.setdefault((name, version), {})[key] = value

    def delete_alias(self, name: str, alias: str) -> None:
        self._call("delete_alias", name)
        self.alias_map.get(name, {}).pop(alias, None)

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self._call("delete_version_tag", name)
        self.tags.get((name, version), {}).pop(key, None)

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]:
        self._call("find_by_tag", name)
        return [
            self.version(m, v)
            for (m, v), tags in self.tags.items()
            if m == name and key in tags and (_like(tags[key], value) if like else tags[key] == value)
        ]


class FakeDeployments:
    """Where versions serve (``MlflowRegistry.deployed``): the version's tags of ``registry``."""

    def __init__(self, registry: FakeRegistry) -> None:
        self.registry = registry

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None:
        self.registry._call("record_deployment", model)
        self.registry.tags[(model, version)][f"promotion_run_{env}"] = run_id
        self.registry.tags[(model, version)][f"serving_{env}"] = ",".join(targets)


class FakeRuns:
    """The run recorder and reader (``MlflowRegistry.runs``): the runs started kept in
    ``registry.recorded`` (newest last); a run's files read from ``registry.root / run_id``."""

    def __init__(self, registry: FakeRegistry) -> None:
        self.registry = registry

    @property
    def recorded(self) -> list[dict[str, Any]]:
        return self.registry.recorded

    def experiment_id(self, name: str = "x") -> str:
        return "0"

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        source = self.registry.root / run_id / path
        dest.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest / path)
        else:
            shutil.copy2(source, dest / path)
        return dest / path

    def start_run(
        self, experiment: str, name: str, tags: dict[str, str], start_time: float | None = None
    ) -> str:
        self.registry._call("start_run")
        self.recorded.append({"name": name, "tags": tags, "start_time": start_time})
        return f"run-{len(self.recorded)}"

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.recorded[-1].setdefault("params", {}).update(params)
        self.recorded[-1].setdefault("metrics", {}).update(metrics)

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        """Each file's bytes kept in the run (``artifacts``: name -> bytes)."""
        kept = self.recorded[-1].setdefault("artifacts", {})
        kept.update({f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()})

    def finish_run(self, run_id: str, ok: bool) -> None:
        self.recorded[-1]["ok"] = ok

    def link_promotion(
        self,
        run_id: str,
        experiment: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        self.registry._call("link_promotion")
        self.recorded[-1]["linked"] = {"env": env, "outcome": outcome, "versions": list(versions)}

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        return [dict(run["tags"]) for run in reversed(self.recorded) if run["tags"].get("model") == name]


def _like(text: str, pattern: str) -> bool:
    """SQL LIKE as MLflow's search filter reads it: ``%`` any run of characters, ``_`` one."""
    import re

    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None
