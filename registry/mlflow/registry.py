"""The MLflow adapter: every MLflow call of mlreg goes through here.

``MlflowRegistry`` implements the registry's reader and writer (:mod:`registry.ports`) over four
parts sharing one connection, each a public attribute its callers may take alone:
``connection`` (``MlflowConnection``: the client, opened once; ``MlflowException`` and HTTP
failures translated into ``RegistryError`` in its ``call`` only, by ``registry.mlflow.translate``;
requests and lock waits bounded), ``runs`` (``MlflowRuns``: the run recorder -- experiments,
runs, logged models, artifact downloads, the promotions' history), ``models``
(``MlflowVersions``: registered models, versions, aliases, tags, a version's files) and
``deployed`` (``MlflowDeployments``: where versions serve).  Read-only queries against an HTTP server use
MLflow's REST API directly (``registry.mlflow.rest``), and the embedded registry's file is read
directly (``registry.mlflow.sqlite``), so neither ``mlreg versions`` nor a promotion's plan pays
MLflow's multi-second import.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from registry.mlflow import rest, sqlite
from registry.mlflow.connection import MlflowConnection
from registry.mlflow.deployed import MlflowDeployments
from registry.mlflow.model import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT, LoggedTritonModel
from registry.mlflow.runs import MlflowRuns
from registry.mlflow.story import MlflowStory
from registry.mlflow.versions import MlflowVersions
from registry.register import Candidate, register
from registry.settings import Settings

__all__ = ["EXPORTS_EXPERIMENT", "PROMOTIONS_EXPERIMENT", "LoggedTritonModel", "MlflowRegistry"]


class MlflowRegistry:
    """The registry in MLflow: the reader and the writer of ``registry.ports`` over its parts, and
    the parts themselves: ``runs`` is the run recorder (and what ``register()`` and the NVIDIA
    flavors' import record runs through), ``deployed`` where versions serve."""

    def __init__(self, settings: Settings) -> None:
        self.connection = MlflowConnection(settings)
        self.runs = MlflowRuns(self.connection)
        self.models = MlflowVersions(self.connection, self.runs)
        self.deployed = MlflowDeployments(self.connection, self.models, self.runs)
        self.runs.story = MlflowStory(self.connection, self.models, self.runs)  # links read versions

    # -- the connection ------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return self.connection.settings

    @property
    def uri(self) -> str:
        return self.connection.uri

    @property
    def client(self) -> Any:
        """MLflow's own client (tests and tools; mlreg's code calls the methods below)."""
        return self.connection.client

    @property
    def local_root(self) -> Path:
        return self.connection.local_root

    def warm_up(self) -> None:
        self.connection.warm_up()

    def ping(self) -> None:
        """Raise RegistryError unless the registry answers: a tracking server within
        MLREG_MLFLOW_TIMEOUT (over REST: no MLflow import); the embedded registry's database not
        held by another process (MLREG_MLFLOW_TIMEOUT, at most 5 s), created where it does not
        exist yet."""
        if self.uri.startswith(("http://", "https://")):
            rest.ping(self.uri, self.settings.mlflow_timeout)
        elif sqlite.database(self.uri) is None:
            self.runs.experiment_id(PROMOTIONS_EXPERIMENT)
        else:
            self.connection.local(partial(sqlite.wait_unlocked, self.uri, what="MLflow ping"))

    # -- what runs logged (registry.ports.RegistryReader; recording runs: ``runs``) ----------------

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        return self.runs.download(run_id, path, dest)

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        return self.runs.promotions(name, env)

    # -- registered models and versions (registry.ports.RegistryReader / RegistryWriter) ----------

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]:
        return self.models.find_by_tag(name, key, value, like)

    def versions(self, name: str) -> list[Any]:
        return self.models.versions(name)

    def version(self, name: str, version: str) -> Any:
        return self.models.version(name, version)

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        return self.models.version_tags(name, version)

    def aliases(self, name: str) -> dict[str, str]:
        return self.models.aliases(name)

    def alias_versions(self, alias: str) -> dict[str, str]:
        return self.models.alias_versions(alias)

    def require_model(self, name: str) -> dict[str, str]:
        return self.models.require_model(name)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.models.set_alias(name, alias, version)

    def delete_alias(self, name: str, alias: str) -> None:
        self.models.delete_alias(name, alias)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.models.set_version_tag(name, version, key, value)

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self.models.delete_version_tag(name, version, key)

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        return self.models.fetch_version(name, version, dest)

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
        candidate = Candidate(name, version_dir, config_path)
        return register(self, candidate, members=members, export_info=export_info, version_tags=tags).version

    def delete_version(self, name: str, version: str) -> None:
        """The version deleted, then the run that registered it (its artifacts and logged model:
        ``discard_run``, best effort) -- only for a version the caller proved it made."""
        run_id = str(self.models.version(name, version).run_id or "")
        self.models.delete_version(name, version)
        if run_id:
            self.runs.discard_run(run_id)

    def delete_model(self, name: str) -> None:
        self.models.delete_model(name)

    # -- where versions serve (the rest: ``deployed``) -----------------------------------------------

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None:
        self.deployed.record_deployment(model, version, env, run_id, targets)
