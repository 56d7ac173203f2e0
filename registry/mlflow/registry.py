"""The MLflow adapter: every MLflow call of mlreg goes through here.

``MlflowRegistry`` is the registry as four parts sharing one connection, each a public attribute
its callers take alone (``registry.ports``): ``connection`` (``MlflowConnection``: the client,
opened once; ``MlflowException`` and HTTP failures translated into ``RegistryError`` in its
``call`` only, by ``registry.mlflow.translate``; requests and lock waits bounded; the experiments),
``models`` (``MlflowVersions``: registered models, versions, aliases, tags, a version's files --
the ``RegistryReader`` and ``RegistryWriter``), ``runs`` (``MlflowRuns``: the ``RunRecorder`` and
``RunReader`` -- experiments, runs, logged models, artifact downloads, the promotions' history,
the promotion's story through ``MlflowStory``) and ``deployed`` (``MlflowDeployments``: where
versions serve).  What composes parts is the registry's own: a derived version registered
(``register_version``), a version deleted with its run (``delete_version``).  Read-only queries
against an HTTP server use MLflow's REST API directly (``registry.mlflow.rest``), and the embedded
registry's file is read directly (``registry.mlflow.sqlite``), so neither ``mlreg versions`` nor a
promotion's plan pays MLflow's multi-second import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    """The registry in MLflow as its parts: ``models`` the reader and the writer of versions,
    ``runs`` the run recorder (and what ``register()`` and the NVIDIA flavors' import record runs
    through), ``deployed`` where versions serve; and what composes them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connection = MlflowConnection(settings)
        self.uri = self.connection.uri
        self.local_root: Path = self.connection.local_root  # where a local registry writes
        self.models = MlflowVersions(self.connection)
        self.runs = MlflowRuns(self.connection, MlflowStory(self.connection, self.models))
        self.deployed = MlflowDeployments(self.connection, self.models, self.runs)

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
