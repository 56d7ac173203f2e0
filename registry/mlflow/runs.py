"""Runs, their artifacts and the models they log: what an export or a promotion recorded in MLflow.

``MlflowRuns`` is the run recorder of the adapter (``registry.ports.RunRecorder``: callers take
``MlflowRegistry.runs``) and the reader of what runs logged (artifacts, logged models, the
promotions' history).  Every call goes through the connection's one translation point.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from registry.disk import remove_local
from registry.errors import MlregError, RegistryError
from registry.lineage import VERSION_FOLDER
from registry.logged_model import LoggedTritonModel
from registry.mlflow import sqlite
from registry.mlflow.connection import MlflowConnection
from registry.mlflow.environ import global_tracking_uri
from registry.mlflow.model import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT, mlmodel

log = logging.getLogger(__name__)


class PromotionLinks(Protocol):
    """What links a promotion run and the versions it moved (``registry.mlflow.story.MlflowStory``,
    which reads those versions)."""

    def link_promotion(
        self,
        run_id: str,
        experiment_id: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None: ...


class MlflowRuns:
    """Experiments, runs, logged models and artifact downloads over one connection; a promotion
    run linked to the versions it moved through ``story`` (``MlflowStory``: it reads those
    versions)."""

    def __init__(self, connection: MlflowConnection, story: PromotionLinks) -> None:
        self.connection = connection
        self.story = story
        self._logged: dict[str, str] = {}  # run id -> the model id it logged (removed if discarded)

    @property
    def _client(self) -> Any:
        return self.connection.client

    def experiment_id(self, name: str = EXPORTS_EXPERIMENT) -> str:
        """The id of experiment ``name`` (created where it does not exist: the connection's)."""
        return self.connection.experiment_id(name)

    def start_run(
        self, experiment: str, name: str, tags: dict[str, str], start_time: float | None = None
    ) -> str:
        exp_id = self.experiment_id(experiment)
        began = None if start_time is None else int(start_time * 1000)  # MLflow's milliseconds
        run = self.connection.call(
            "run creation",
            lambda: self._client.create_run(exp_id, start_time=began, run_name=name, tags=tags),
        )
        return str(run.info.run_id)

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.connection.client  # noqa: B018 - imports MLflow under the lock (see MlflowConnection.call)
        from mlflow.entities import Metric, Param  # lazy: mlflow ~1.5 s of import, already done just above

        stamp = 0
        self.connection.call(
            "logging",
            lambda: self._client.log_batch(
                run_id,
                params=[Param(k, str(v)) for k, v in params.items()],
                metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
            ),
        )

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        self.connection.call("artifact upload", lambda: self._client.log_artifacts(run_id, str(folder), path))

    def finish_run(self, run_id: str, ok: bool) -> None:
        status = "FINISHED" if ok else "FAILED"
        self.connection.call("run update", lambda: self._client.set_terminated(run_id, status))

    def link_promotion(
        self,
        run_id: str,
        experiment: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        """The promotion run and the versions it moved or tried, linked both ways in the UI
        (``registry.mlflow.story``)."""
        self.story.link_promotion(run_id, self.experiment_id(experiment), env, outcome, versions, error)

    def discard_run(self, run_id: str) -> None:
        """Best effort: a run whose version was not created must not linger as a success.  Its
        local artifacts go first (on a full disk they free the space the database needs), then the
        logged model ends FAILED and is deleted, and the run ends FAILED and is deleted.  Nothing is
        tried on a database another process holds (MLflow would wait 20 s a step)."""
        model_id = self._logged.pop(run_id, None)
        connection = self.connection
        try:
            connection.local(partial(sqlite.wait_unlocked, connection.uri, what="MLflow run clean-up"))
            connection.client  # noqa: B018 - imports MLflow under the lock (see MlflowConnection.call)
        except MlregError as exc:
            log.warning("could not clean up run %s: %s", run_id, exc.message)
            return
        with connection.environ():
            for step, work in (
                ("artifacts", lambda: self._remove_artifacts(run_id, model_id)),
                ("logged model", lambda: self._discard_model(model_id)),
                ("run", lambda: self._end_failed(run_id)),
            ):
                try:
                    work()
                except Exception as exc:
                    log.warning("could not clean up the %s of run %s: %s", step, run_id, exc)

    def _remove_artifacts(self, run_id: str, model_id: str | None) -> None:
        settings = self.connection.settings
        root = settings.artifact_root if self.connection.uri.startswith("sqlite:") else None
        remove_local(self._client.get_run(run_id).info.artifact_uri, root)
        if model_id:
            remove_local(self._client.get_logged_model(model_id).artifact_location, root)

    def _discard_model(self, model_id: str | None) -> None:
        if not model_id:
            return
        from mlflow.entities import LoggedModelStatus  # lazy: mlflow ~1.5 s of import

        self._client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)
        self._client.delete_logged_model(model_id)

    def _end_failed(self, run_id: str) -> None:
        self._client.set_tag(run_id, "mlreg_orphaned", "true")
        self._client.set_terminated(run_id, "FAILED")
        self._client.delete_run(run_id)

    def artifact_uri(self, run_id: str) -> str:
        return str(self.connection.call("run lookup", lambda: self._client.get_run(run_id)).info.artifact_uri)

    def set_run_tag(self, run_id: str, key: str, value: str) -> None:
        self.connection.call("run tag", partial(self._client.set_tag, run_id, key, value))

    def log_model_input(self, run_id: str, model_id: str) -> None:
        """``model_id`` (a logged model) is an input of run ``run_id``."""
        self.connection.client  # noqa: B018 - imports MLflow under the lock (see MlflowConnection.call)
        from mlflow.entities import LoggedModelInput  # lazy: mlflow ~1.5 s of import, already done just above

        self.connection.call(
            "run update", lambda: self._client.log_inputs(run_id, models=[LoggedModelInput(model_id)])
        )

    # -- logged models (MLflow 3) ----------------------------------------------------------------

    def log_model(self, run_id: str, experiment: str, model: LoggedTritonModel) -> str:
        """Log a Triton model folder as an MLflow Model linked to ``run_id``; returns its model id.

        The artifact is ``MLmodel`` + ``<name>/config.pbtxt`` + ``<name>/1/`` (the version folder's
        bytes are uploaded once, straight from where they are).
        """
        exp_id, call = self.experiment_id(experiment), self.connection.call
        logged = call(
            "model logging",
            lambda: self._client.create_logged_model(
                exp_id,
                name=model.name,
                source_run_id=run_id,
                tags=model.tags,
                params=model.params,
                model_type="triton",
            ),
        )
        model_id = str(logged.model_id)
        self._logged[run_id] = model_id
        with tempfile.TemporaryDirectory(prefix="mlreg-mlmodel-") as tmp:
            root = Path(tmp)
            (root / model.name).mkdir()
            (root / model.name / "config.pbtxt").write_bytes(model.config_path.read_bytes())
            mlmodel(model, run_id, model_id).save(str(root / "MLmodel"))
            call("artifact upload", lambda: self._client.log_model_artifacts(model_id, tmp))
        if any(model.version_dir.iterdir()):
            folder = f"{model.name}/{VERSION_FOLDER}"
            call(
                "artifact upload",
                lambda: self._client.log_model_artifacts(model_id, str(model.version_dir), folder),
            )
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus  # lazy: mlflow ~1.5 s of import

        call("model update", lambda: self._client.finalize_logged_model(model_id, LoggedModelStatus.READY))
        call("run update", lambda: self._client.log_outputs(run_id, [LoggedModelOutput(model_id, 0)]))
        return model_id

    def logged_model_name(self, model_id: str) -> str:
        """The name a logged model (MLflow 3) was logged under."""
        return str(self.connection.call("model lookup", lambda: self._client.get_logged_model(model_id)).name)

    def artifact_paths(self, run_id: str, path: str) -> set[str]:
        """The paths of the artifacts run ``run_id`` logged under ``path`` (one level)."""
        listed = self.connection.call("artifact listing", lambda: self._client.list_artifacts(run_id, path))
        return {str(a.path) for a in listed}

    def download_model(self, model: str, version: str, dest: Path) -> Path:
        """The registered version's MLflow Model folder (MLmodel + its files), downloaded to ``dest``."""
        self.connection.client  # noqa: B018 - imports MLflow under the lock (see MlflowConnection.call)
        import mlflow.artifacts  # lazy: mlflow ~1.5 s of import, already done just above

        dest.mkdir(parents=True)
        with global_tracking_uri(self.connection.uri):  # models:/ URIs resolve against it
            got = self.connection.call(
                "model download",
                lambda: mlflow.artifacts.download_artifacts(
                    artifact_uri=f"models:/{model}/{version}", dst_path=str(dest)
                ),
            )
        return Path(got)

    # -- reading what runs logged ------------------------------------------------------------------

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        """A run's artifact at ``path``, downloaded into ``dest`` (``download``)."""
        return download(self.connection, run_id, path, dest)

    def promotion(self, run_id: str) -> dict[str, Any] | None:
        """One promotion run as a row of ``promotions`` plus its ``model``; None when ``run_id`` is
        no active run of the promotions experiment (a version tag naming it is not trusted)."""
        try:
            run = self.connection.call("history", lambda: self._client.get_run(run_id))
        except RegistryError as exc:
            if exc.context.get("code") != sqlite.NOT_FOUND:
                raise  # MLflow down is said as such, never read as "no such run"
            return None
        exp = self.experiment_id(PROMOTIONS_EXPERIMENT)
        if run.info.experiment_id != exp or run.info.lifecycle_stage != "active":
            return None
        return self._row(run) | {"model": run.data.tags.get("mlreg_model")}

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        """The promotions of ``name`` (in ``env``; None: everywhere), newest first, from the runs
        of the promotions experiment: when (epoch ms), environment, from, to, result, user, run_id."""
        query = f"tags.mlreg_model = '{name}'" + (f" and tags.environment = '{env}'" if env else "")
        exp = self.experiment_id(PROMOTIONS_EXPERIMENT)
        runs = self.connection.call(
            "history",
            lambda: self._client.search_runs(
                [exp], filter_string=query, order_by=["attributes.start_time DESC"], max_results=500
            ),
        )
        return [self._row(run) for run in runs]

    @staticmethod
    def _row(run: Any) -> dict[str, Any]:
        return {
            "when": run.info.start_time,
            "environment": run.data.tags.get("environment"),
            "from": run.data.params.get("from_version"),
            "to": run.data.params.get("to_version"),
            "result": run.data.tags.get("result"),
            "user": run.data.tags.get("user"),
            "run_id": run.info.run_id,
        }


def download(connection: MlflowConnection, run_id: str, path: str, dest: Path) -> Path:
    """A run's artifact at ``path``, downloaded into ``dest``.

    An export run whose version is an MLflow Model keeps the version folder in its logged model,
    not in the run: its ``model`` path resolves to ``<name>/1`` of that logged model, so readers
    written for the older layout (config.pbtxt + model/ in the run) read both.
    """
    try:
        got = Path(
            connection.call(
                "artifact download", lambda: connection.client.download_artifacts(run_id, path, str(dest))
            )
        )
    except RegistryError:
        if path != "model":
            raise
        got = dest / path
    if path == "model" and not got.exists():
        return _download_logged_version(connection, run_id, dest / path) or got
    return got


def _download_logged_version(connection: MlflowConnection, run_id: str, target: Path) -> Path | None:
    call = connection.call
    run = call("run lookup", lambda: connection.client.get_run(run_id))
    outputs = getattr(run, "outputs", None)
    ids = [o.model_id for o in (getattr(outputs, "model_outputs", None) or [])]
    if not ids:
        return None
    import mlflow.artifacts  # lazy: mlflow ~1.5 s of import, already done by the call above

    logged = call("model lookup", lambda: connection.client.get_logged_model(ids[0]))
    uri = f"{logged.artifact_location}/{logged.name}/{VERSION_FOLDER}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        global_tracking_uri(connection.uri),  # mlflow-artifacts:/ URIs resolve against it
        tempfile.TemporaryDirectory(prefix="mlreg-download-", dir=target.parent) as tmp,
    ):
        try:
            got = call(
                "artifact download",
                lambda: mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp),
            )
        except RegistryError:
            return None  # an ensemble's version folder is empty: nothing was logged
        shutil.move(got, target)
    return target
