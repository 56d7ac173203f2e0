"""Where versions serve, written into MLflow: the versions' tags, the promotion run's links, the
registered model's ``deployed_<env>`` tags and description (``registry.mlflow.deployments``
reads and renders them)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from registry.lineage import deployment_stamp
from registry.mlflow.connection import MlflowConnection
from registry.mlflow.deployments import deployments_of, describe_deployments
from registry.mlflow.runs import MlflowRuns
from registry.mlflow.versions import MlflowVersions


class MlflowDeployments:
    """Records and forgets which version of a model serves in which environment."""

    def __init__(self, connection: MlflowConnection, versions: MlflowVersions, runs: MlflowRuns) -> None:
        self.connection = connection
        self.versions = versions
        self.runs = runs

    @property
    def _client(self) -> Any:
        return self.connection.client

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None:
        """Record in MLflow that ``model`` ``version`` serves in ``env`` after promotion ``run_id``.

        The version's tags say when (``promoted_<env>``), by which run (``promotion_run_<env>``) and
        on which replicas (``serving_<env>``; removed from the version served before); the run links
        back (tags + the version's logged model as the run's input); the registered model's tag
        ``deployed_<env>`` and description list every environment and its version.
        """
        stamp = deployment_stamp()
        replicas = ",".join(targets)
        self._stop_serving(model, env, keep=str(version))
        for key, value in (
            (f"promoted_{env}", stamp),
            (f"promotion_run_{env}", run_id),
            (f"serving_{env}", replicas or "-"),
        ):
            self.versions.set_version_tag(model, version, key, value)
        self._link_run(model, version, env, run_id)
        entry = json.dumps({"version": str(version), "when": stamp, "run": run_id, "targets": list(targets)})
        self.connection.call(
            "model tag update", lambda: self._client.set_registered_model_tag(model, f"deployed_{env}", entry)
        )
        self._describe(model)

    def forget_deployment(self, model: str, env: str) -> None:
        """``model`` serves nowhere in ``env`` any more: its serving tag, entry and row go."""
        self._stop_serving(model, env)
        if env in self.deployments(model):
            self.connection.call(
                "model tag removal",
                partial(self._client.delete_registered_model_tag, model, f"deployed_{env}"),
            )
        self._describe(model)

    def _stop_serving(self, model: str, env: str, keep: str | None = None) -> None:
        """The ``serving_<env>`` tag off every version of ``model`` but ``keep``."""
        for previous in self.versions.find_by_tag(model, f"serving_{env}", "%", like=True):
            if str(previous.version) != keep:
                self.connection.call(
                    "tag removal",
                    partial(
                        self._client.delete_model_version_tag, model, str(previous.version), f"serving_{env}"
                    ),
                )

    def _describe(self, model: str) -> None:
        registered = self.versions.registered_model(model)
        text = describe_deployments(registered.description or "", deployments_of(dict(registered.tags or {})))
        self.connection.call(
            "model update", lambda: self._client.update_registered_model(model, description=text)
        )

    def _link_run(self, model: str, version: str, env: str, run_id: str) -> None:
        mv = self.versions.version(model, version)
        for key, value in (
            ("mlreg_model_version", f"models:/{model}/{version}"),
            ("mlreg_environment", env),
        ):
            self.runs.set_run_tag(run_id, key, value)
        model_id = getattr(mv, "model_id", None) or _model_id(str(mv.source or ""))
        if model_id:
            self.runs.log_model_input(run_id, model_id)

    def deployments(self, model: str) -> dict[str, dict[str, Any]]:
        """environment -> {version, when, run, targets}, from the registered model's tags."""
        return deployments_of(dict(self.versions.registered_model(model).tags or {}))


def _model_id(source: str) -> str:
    """``models:/m-...`` (a logged model) -> its id; registry URIs (``models:/name/1``) -> ""."""
    found = source.removeprefix("models:/") if source.startswith("models:/") else ""
    return found if found.startswith("m-") and "/" not in found else ""
