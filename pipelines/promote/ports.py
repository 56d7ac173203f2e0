"""What a promotion needs from the outside world, as Protocols.

``MlflowRegistry`` (registry/) and ``TritonControl`` (pipelines/triton.py) are the real
implementations; the unit tests drive the runner with small in-memory fakes of both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Registry(Protocol):
    """The model registry as a promotion uses it (MLflow in production)."""

    uri: str

    def warm_up(self) -> None: ...

    def ping(self) -> None:
        """Raise RegistryError unless the registry answers (a tracking server within its timeout;
        the embedded sqlite registry is created where it does not exist yet)."""
        ...

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        """Write the registered files of ``name`` ``version`` as a Triton model folder:
        ``dest/config.pbtxt`` and ``dest/<version>/``; return the version's tags."""
        ...

    def register_version(
        self,
        name: str,
        version_dir: Path,
        config_path: Path,
        *,
        members: dict[str, str] | None = None,
        export_info: dict[str, Any] | None = None,
    ) -> str:
        """Register a version mlreg derived (a re-pointed ensemble, an ONNX conversion): validated,
        manifest and digest recorded like any other; an identical one is reused. Returns its number."""
        ...

    def experiment_id(self, name: str = ...) -> str: ...

    def version(self, name: str, version: str) -> Any: ...

    def versions(self, name: str) -> list[Any]: ...

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        """The tags of one version (cheap where the registry can answer without a client)."""
        ...

    def aliases(self, name: str) -> dict[str, str]: ...

    def require_model(self, name: str) -> dict[str, str]:
        """``name``'s aliases; RegistryError naming it when it is not registered."""
        ...

    def alias_versions(self, alias: str) -> dict[str, str]:
        """Every registered model whose ``alias`` names a version -> that version."""
        ...

    def set_alias(self, name: str, alias: str, version: str) -> None: ...

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None: ...

    def delete_alias(self, name: str, alias: str) -> None: ...

    def delete_version_tag(self, name: str, version: str, key: str) -> None: ...

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]: ...

    def download(self, run_id: str, path: str, dest: Path) -> Path: ...

    def start_run(self, experiment: str, name: str, tags: dict[str, str]) -> str: ...

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None: ...

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None: ...

    def finish_run(self, run_id: str, ok: bool) -> None: ...

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None: ...

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        """The promotions of ``name`` (in ``env``; None: everywhere) recorded by ``start_run``,
        newest first: when (epoch ms), environment, from, to, result, user, run_id."""
        ...


class ServingTarget(Protocol):
    """One inference server of an environment (a Triton, addressed by its gRPC URL)."""

    url: str

    def is_live(self) -> bool: ...

    def server_metadata(self) -> dict[str, Any]: ...

    def model_states(self) -> dict[str, dict[str, str]]: ...

    def model_config(self, model: str) -> dict[str, Any]: ...

    def load(
        self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None
    ) -> None: ...

    def unload(self, model: str, unload_dependents: bool = False) -> None: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...

    def is_ready(self, model: str, version: str = "") -> bool: ...

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]: ...

    def statistics(self, model: str = "") -> list[dict[str, Any]]:
        """Triton's per-version statistics of ``model`` (its JSON ``model_stats``)."""
        ...

    def trace_settings(self, model: str, settings: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
        """``model``'s trace settings after applying ``settings`` (capture: pipelines/promote/capture.py)."""
        ...

    def close(self) -> None: ...


# A tritonserver started for one quality gate (dry runs, plan jobs): given a model repository
# folder, a context manager whose value is the gRPC URL of a server that serves it in explicit
# model-control mode; leaving it stops the server.  The application provides it
# (pipelines/devstack); the promotion never starts a server itself.
ScratchServers = Callable[[Path], AbstractContextManager[str]]
