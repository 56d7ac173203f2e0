"""The MLflow adapter: every MLflow call of mlreg goes through here.

``MlflowException`` and HTTP failures are translated into ``RegistryError`` in ``_call`` only (by
``registry.mlflow.translate``).  Requests are bounded (``MLREG_MLFLOW_TIMEOUT``, two retries), so a
tracking server that is down fails in seconds, not minutes; so does an embedded registry whose
database another process holds (``registry.mlflow.locked``: MLflow itself would wait 20 s a query).
Read-only queries against an HTTP server use MLflow's REST API directly (``registry.mlflow.rest``),
and the embedded registry's file is read directly (``registry.mlflow.sqlite``), so neither
``mlreg versions`` nor a promotion's plan pays MLflow's multi-second import.  MLflow's settings are
environment variables: they are set only while MLflow works (``registry.mlflow.environ``), so
``os.environ`` is left as it was found.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from registry.contracts.config import CONFIG_NAME
from registry.errors import MlregError, RegistryError
from registry.lineage import VERSION_FOLDER, deployment_stamp
from registry.mlflow import rest, sqlite
from registry.mlflow.deployments import deployments_of, describe_deployments
from registry.mlflow.disk import remove_local
from registry.mlflow.environ import ENVIRON, global_tracking_uri
from registry.mlflow.locked import DATABASE_LOCKED, lock_wait
from registry.mlflow.model import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT, LoggedTritonModel
from registry.mlflow.translate import translated
from registry.register import Candidate, register
from registry.settings import Settings, redact_uri

log = logging.getLogger(__name__)
T = TypeVar("T")
__all__ = ["EXPORTS_EXPERIMENT", "PROMOTIONS_EXPERIMENT", "LoggedTritonModel", "MlflowRegistry"]


class MlflowRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.uri = settings.tracking_uri
        self._client: Any = None
        self._lock = threading.Lock()
        self._experiments: dict[str, str] = {}
        self._logged: dict[str, str] = {}  # run id -> the model id it logged (removed if discarded)
        # how long a call waits for an embedded database another process holds: none after it
        # waited in vain once (a command fails in seconds, not a wait a call), again after a success
        self._patience = lock_wait(settings)
        self.warming: threading.Thread | None = None

    def warm_up(self) -> None:
        """Import MLflow and open the client in the background (it takes seconds).  A failure is
        the next call's to report (it opens the client again): no thread prints a traceback."""
        self.warming = threading.Thread(target=self._warm, daemon=True)
        self.warming.start()

    def _warm(self) -> None:
        try:
            self.client  # noqa: B018
        except Exception as exc:
            log.debug("opening MLflow in the background failed: %s", exc)

    @property
    def client(self) -> Any:
        with self._lock, self._environ():
            try:
                return self._open()
            except Exception as exc:
                failure = translated(self.uri, self.local_root, "opening the registry", exc)
                if failure is None:
                    raise
                raise failure from exc

    @contextlib.contextmanager
    def _environ(self) -> Iterator[None]:
        """MLflow's settings, read from os.environ, set for the block only (registry.mlflow.environ)."""
        values = {
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(self.settings.mlflow_timeout)),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        }
        # MLflow 3 sends usage telemetry from a background thread that holds every command's exit
        # for ~1 s (longer offline); a team can opt in with MLFLOW_DISABLE_TELEMETRY=false
        defaults = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        with ENVIRON.scope(values, defaults):
            yield

    def _open(self) -> Any:
        if self._client is None:
            for noisy in ("mlflow", "alembic"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
            if not self.settings.debug:  # it logs the traceback of a database error _call translates
                logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
            if self.uri.startswith("sqlite:///"):
                db = Path(self.uri.removeprefix("sqlite:///"))
                db.parent.mkdir(parents=True, exist_ok=True)
                if not db.exists():  # a new one: copied from a migrated template (seconds saved)
                    from mlflow.tracking import MlflowClient

                    sqlite.seed(db, self.settings.template_cache, MlflowClient)
                # opening reads the schema: 5 s of sqlite's default wait on a locked file
                self._local(partial(sqlite.wait_unlocked, self.uri, what="MLflow opening the registry"))
            from mlflow.tracking import MlflowClient  # heavy (seconds): imported on the first call

            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn``'s answer; any failure translated once (registry.mlflow.translate).  MLflow waits
        20 s a query on a locked embedded database: it is asked only once the file can be written."""
        self._local(partial(sqlite.wait_unlocked, self.uri, what=f"MLflow {what}"))
        try:
            # MLflow is imported once, under the lock, by whichever thread gets there first: importing
            # its modules from two threads at once breaks protobuf's descriptor pool (seen for real)
            self.client  # noqa: B018
            with self._environ(), contextlib.redirect_stdout(sys.stderr):  # "View run at" lines
                answer = fn()
        except Exception as exc:
            failure = translated(self.uri, self.local_root, what, exc)
            if failure is None:
                raise
            if failure.context.get("code") == DATABASE_LOCKED:
                self._patience = 0.0
            if failure is exc:
                raise
            raise failure from exc
        self._patience = lock_wait(self.settings)
        return answer

    def _local(self, read: Callable[[float], T]) -> T:
        """A read of the embedded registry's file (registry.mlflow.sqlite) that waits for a lock
        as long as this adapter's patience lasts."""
        try:
            answer = read(self._patience)
        except RegistryError:  # the one error the reader raises: the database is locked
            self._patience = 0.0
            raise
        self._patience = lock_wait(self.settings)
        return answer

    def ping(self) -> None:
        """Raise RegistryError unless the registry answers: a tracking server within
        MLREG_MLFLOW_TIMEOUT (over REST: no MLflow import); the embedded registry's database not
        held by another process (MLREG_MLFLOW_TIMEOUT, at most 5 s), created where it does not
        exist yet."""
        if self.uri.startswith(("http://", "https://")):
            rest.ping(self.uri, self.settings.mlflow_timeout)
        elif sqlite.database(self.uri) is None:
            self.experiment_id(PROMOTIONS_EXPERIMENT)
        else:
            self._local(partial(sqlite.wait_unlocked, self.uri, what="MLflow ping"))

    # -- experiments and runs ------------------------------------------------------------------

    def experiment_id(self, name: str = EXPORTS_EXPERIMENT) -> str:
        if name in self._experiments:
            return self._experiments[name]
        existing = self._call("experiment lookup", lambda: self.client.get_experiment_by_name(name))
        if existing is not None:
            self._experiments[name] = str(existing.experiment_id)
            return self._experiments[name]
        location = None
        if self.uri.startswith("sqlite:"):
            self.settings.artifact_root.mkdir(parents=True, exist_ok=True)
            location = self.settings.artifact_root.as_uri()
        try:
            created = self._call(
                "experiment creation", lambda: self.client.create_experiment(name, artifact_location=location)
            )
        except MlregError:
            # another process (a concurrent promotion) created it since the lookup: use theirs
            raced = self._call("experiment lookup", lambda: self.client.get_experiment_by_name(name))
            if raced is None:
                raise
            created = raced.experiment_id
        self._experiments[name] = str(created)
        return self._experiments[name]

    def start_run(self, experiment: str, name: str, tags: dict[str, str]) -> str:
        exp_id = self.experiment_id(experiment)
        run = self._call("run creation", lambda: self.client.create_run(exp_id, run_name=name, tags=tags))
        return str(run.info.run_id)

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.client  # noqa: B018 - imports MLflow under the lock (see _call)
        from mlflow.entities import Metric, Param

        stamp = 0
        self._call(
            "logging",
            lambda: self.client.log_batch(
                run_id,
                params=[Param(k, str(v)) for k, v in params.items()],
                metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
            ),
        )

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        self._call("artifact upload", lambda: self.client.log_artifacts(run_id, str(folder), path))

    def finish_run(self, run_id: str, ok: bool) -> None:
        self._call("run update", lambda: self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED"))

    @property
    def local_root(self) -> Path:
        """Where a local registry writes (the sqlite file's folder), else the state folder."""
        if self.uri.startswith("sqlite:///"):
            return Path(self.uri.removeprefix("sqlite:///")).parent
        return self.settings.home

    def discard_run(self, run_id: str) -> None:
        """Best effort: a run whose version was not created must not linger as a success.  Its
        local artifacts go first (on a full disk they free the space the database needs), then the
        logged model ends FAILED and is deleted, and the run ends FAILED and is deleted.  Nothing is
        tried on a database another process holds (MLflow would wait 20 s a step)."""
        model_id = self._logged.pop(run_id, None)
        try:
            self._local(partial(sqlite.wait_unlocked, self.uri, what="MLflow run clean-up"))
            self.client  # noqa: B018 - imports MLflow under the lock (see _call)
        except MlregError as exc:
            log.warning("could not clean up run %s: %s", run_id, exc.message)
            return
        with self._environ():
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
        root = self.settings.artifact_root if self.uri.startswith("sqlite:") else None
        remove_local(self.client.get_run(run_id).info.artifact_uri, root)
        if model_id:
            remove_local(self.client.get_logged_model(model_id).artifact_location, root)

    def _discard_model(self, model_id: str | None) -> None:
        if not model_id:
            return
        from mlflow.entities import LoggedModelStatus

        self.client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)
        self.client.delete_logged_model(model_id)

    def _end_failed(self, run_id: str) -> None:
        self.client.set_tag(run_id, "mlreg_orphaned", "true")
        self.client.set_terminated(run_id, "FAILED")
        self.client.delete_run(run_id)

    def artifact_uri(self, run_id: str) -> str:
        return str(self._call("run lookup", lambda: self.client.get_run(run_id)).info.artifact_uri)

    # -- logged models (MLflow 3) ----------------------------------------------------------------

    def log_model(self, run_id: str, experiment: str, model: LoggedTritonModel) -> str:
        """Log a Triton model folder as an MLflow Model linked to ``run_id``; returns its model id.

        The artifact is ``MLmodel`` + ``<name>/config.pbtxt`` + ``<name>/1/`` (the version folder's
        bytes are uploaded once, straight from where they are).
        """
        exp_id = self.experiment_id(experiment)
        logged = self._call(
            "model logging",
            lambda: self.client.create_logged_model(
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
            model.mlmodel(run_id, model_id).save(str(root / "MLmodel"))
            self._call("artifact upload", lambda: self.client.log_model_artifacts(model_id, tmp))
        if any(model.version_dir.iterdir()):
            folder = f"{model.name}/{VERSION_FOLDER}"
            self._call(
                "artifact upload",
                lambda: self.client.log_model_artifacts(model_id, str(model.version_dir), folder),
            )
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        self._call(
            "model update", lambda: self.client.finalize_logged_model(model_id, LoggedModelStatus.READY)
        )
        self._call("run update", lambda: self.client.log_outputs(run_id, [LoggedModelOutput(model_id, 0)]))
        return model_id

    # -- registered models ----------------------------------------------------------------------

    def ensure_model(self, name: str, description: str) -> None:
        try:
            self._call("model lookup", lambda: self.client.get_registered_model(name))
        except RegistryError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
                raise
            self._call(
                "model registration",
                lambda: self.client.create_registered_model(
                    name, tags={"mlreg": "1"}, description=description
                ),
            )

    def create_version(
        self,
        name: str,
        source: str,
        run_id: str,
        tags: dict[str, str],
        description: str,
        model_id: str | None = None,
    ) -> str:
        # the embedded store resolves ``models:/<id>`` with MLflow's global tracking URI
        with global_tracking_uri(self.uri if model_id else None):
            version = self._call(
                "version creation",
                lambda: self.client.create_model_version(
                    name, source, run_id=run_id, tags=tags, description=description, model_id=model_id
                ),
            )
        if model_id:  # the logged model lists its registered versions (as mlflow.register_model does)
            link = json.dumps([{"name": name, "version": str(version.version)}])
            self._call(
                "model tag update",
                lambda: self.client.set_logged_model_tags(model_id, {"mlflow.modelVersions": link}),
            )
        return str(version.version)

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]:
        query = f"name='{name}' and tags.`{key}` {'LIKE' if like else '='} '{value}'"
        return list(self._call("version search", lambda: self.client.search_model_versions(query)))

    def versions(self, name: str) -> list[Any]:
        return list(
            self._call(
                "version search",
                lambda: self.client.search_model_versions(f"name='{name}'", max_results=200_000),
            )
        )

    def version(self, name: str, version: str) -> Any:
        return self._call("version lookup", lambda: self.client.get_model_version(name, version))

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        """The tags of ``name`` ``version``; the embedded registry answers from its database
        without importing MLflow (a promotion reads the digests of the versions it may go back to)."""
        record = self._local(partial(sqlite.model_version, self.uri, name, version))
        if record is not None:
            return dict(record.tags)
        absent = self._local(partial(sqlite.version_absent, self.uri, name, version))
        if absent:  # e.g. a hand-written folder in the store
            raise RegistryError(
                f"MLflow ({redact_uri(self.uri)}): {name} v{version} is not a registered version",
                fix="check the name and version ('mlreg versions MODEL')",
                code="RESOURCE_DOES_NOT_EXIST",
            )
        return dict(self.version(name, version).tags or {})

    def aliases(self, name: str) -> dict[str, str]:
        """alias -> version (read from the registered model: version searches drop aliases); the
        embedded registry answers from its database without importing MLflow."""
        record = self._local(partial(sqlite.registered_model, self.uri, name))
        if record is not None:
            return dict(record.aliases)
        if self._local(partial(sqlite.model_absent, self.uri, name)):
            raise RegistryError(
                f"MLflow ({redact_uri(self.uri)}): model lookup failed: registered model '{name}' not found",
                fix="check the name and version ('mlreg versions MODEL')",
                code="RESOURCE_DOES_NOT_EXIST",
            )
        model = self._call("model lookup", lambda: self.client.get_registered_model(name))
        return {alias: str(version) for alias, version in (model.aliases or {}).items()}

    def alias_versions(self, alias: str) -> dict[str, str]:
        """Every registered model whose ``alias`` names a version -> that version (the embedded
        registry answers from its database)."""
        held = self._local(partial(sqlite.alias_holders, self.uri, alias))
        if held is not None:
            return dict(sorted(held.items()))
        found: dict[str, str] = {}
        token: str | None = None
        while True:  # paged: 100 registered models a page
            page = self._call("model search", partial(self.client.search_registered_models, page_token=token))
            for model in page:
                version = dict(getattr(model, "aliases", None) or {}).get(alias)
                if version is not None:
                    found[str(model.name)] = str(version)
            token = page.token
            if not token:
                return dict(sorted(found.items()))

    def require_model(self, name: str) -> dict[str, str]:
        """``name``'s aliases; a RegistryError saying so when it is not a registered model."""
        try:
            return self.aliases(name)
        except RegistryError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
                raise
            raise RegistryError(
                f"model '{name}' is not registered in MLflow ({redact_uri(self.uri)})",
                fix="check the name; 'mlreg export' or 'mlreg register MODEL PATH' registers one",
            ) from exc

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call("alias update", lambda: self.client.set_registered_model_alias(name, alias, version))

    def delete_alias(self, name: str, alias: str) -> None:
        self._call("alias removal", lambda: self.client.delete_registered_model_alias(name, alias))

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._call("tag update", lambda: self.client.set_model_version_tag(name, version, key, value))

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self._call("tag removal", lambda: self.client.delete_model_version_tag(name, version, key))

    def register_version(
        self,
        name: str,
        version_dir: Path,
        config_path: Path,
        *,
        members: dict[str, str] | None = None,
        export_info: dict[str, Any] | None = None,
    ) -> str:
        """Register a version mlreg derived (a re-pointed ensemble, an ONNX conversion) like any
        export: validated, manifest and digest recorded; identical bytes reuse their version."""
        candidate = Candidate(name, version_dir, config_path)
        return register(self, candidate, members=members, export_info=export_info).version

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        """``name`` ``version`` as a Triton model folder ``dest`` (``config.pbtxt`` + ``<version>/``,
        replacing what was there); returns the version's tags.  The embedded registry's artifacts
        are local files, copied without importing MLflow; otherwise they are downloaded."""
        record = self._local(partial(sqlite.model_version, self.uri, name, version))
        local = record.local_source() if record else None
        if record is not None and local is not None and (local.parent / CONFIG_NAME).is_file():
            _fresh(dest)
            shutil.copy2(local.parent / CONFIG_NAME, dest / CONFIG_NAME)
            if local.is_dir():
                shutil.copytree(local, dest / version)
            else:
                (dest / version).mkdir()
            return dict(record.tags)
        mv = self.version(name, version)
        _fresh(dest)
        with tempfile.TemporaryDirectory(prefix=f".download-{name}-{version}-", dir=dest.parent) as tmp:
            download = Path(tmp)
            self.download(str(mv.run_id), CONFIG_NAME, download)
            shutil.copy2(download / CONFIG_NAME, dest / CONFIG_NAME)
            try:
                self.download(str(mv.run_id), "model", download)
                shutil.copytree(download / "model", dest / version)
            except (RegistryError, OSError):
                (dest / version).mkdir(exist_ok=True)  # an ensemble's version folder: nothing logged
        return dict(mv.tags or {})

    # -- where versions run ----------------------------------------------------------------------

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        """The promotions of ``name`` (in ``env``; None: everywhere), newest first, from the runs
        of the promotions experiment: when (epoch ms), environment, from, to, result, user, run_id."""
        query = f"tags.mlreg_model = '{name}'" + (f" and tags.environment = '{env}'" if env else "")
        exp = self.experiment_id(PROMOTIONS_EXPERIMENT)
        runs = self._call(
            "history",
            lambda: self.client.search_runs(
                [exp], filter_string=query, order_by=["attributes.start_time DESC"], max_results=500
            ),
        )
        return [
            {
                "when": run.info.start_time,
                "environment": run.data.tags.get("environment"),
                "from": run.data.params.get("from_version"),
                "to": run.data.params.get("to_version"),
                "result": run.data.tags.get("result"),
                "user": run.data.tags.get("user"),
                "run_id": run.info.run_id,
            }
            for run in runs
        ]

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
        for previous in self.find_by_tag(model, f"serving_{env}", "%", like=True):
            if str(previous.version) != str(version):
                self._call(
                    "tag removal",
                    partial(
                        self.client.delete_model_version_tag, model, str(previous.version), f"serving_{env}"
                    ),
                )
        for key, value in (
            (f"promoted_{env}", stamp),
            (f"promotion_run_{env}", run_id),
            (f"serving_{env}", replicas or "-"),
        ):
            self.set_version_tag(model, version, key, value)
        self._link_run(model, version, env, run_id)
        entry = json.dumps({"version": str(version), "when": stamp, "run": run_id, "targets": list(targets)})
        self._call(
            "model tag update", lambda: self.client.set_registered_model_tag(model, f"deployed_{env}", entry)
        )
        self._describe(model)

    def forget_deployment(self, model: str, env: str) -> None:
        """``model`` serves nowhere in ``env`` any more: its serving tag, entry and row go."""
        for previous in self.find_by_tag(model, f"serving_{env}", "%", like=True):
            self._call(
                "tag removal",
                partial(self.client.delete_model_version_tag, model, str(previous.version), f"serving_{env}"),
            )
        if env in self.deployments(model):
            self._call(
                "model tag removal",
                partial(self.client.delete_registered_model_tag, model, f"deployed_{env}"),
            )
        self._describe(model)

    def _describe(self, model: str) -> None:
        registered = self._call("model lookup", lambda: self.client.get_registered_model(model))
        text = describe_deployments(registered.description or "", deployments_of(dict(registered.tags or {})))
        self._call("model update", lambda: self.client.update_registered_model(model, description=text))

    def _link_run(self, model: str, version: str, env: str, run_id: str) -> None:
        mv = self.version(model, version)
        for key, value in (
            ("mlreg_model_version", f"models:/{model}/{version}"),
            ("mlreg_environment", env),
        ):
            self._call("run tag", partial(self.client.set_tag, run_id, key, value))
        model_id = getattr(mv, "model_id", None) or _model_id(str(mv.source or ""))
        if model_id:
            from mlflow.entities import LoggedModelInput

            self._call(
                "run update", lambda: self.client.log_inputs(run_id, models=[LoggedModelInput(model_id)])
            )

    def deployments(self, model: str) -> dict[str, dict[str, Any]]:
        """environment -> {version, when, run, targets}, from the registered model's tags."""
        registered = self._call("model lookup", lambda: self.client.get_registered_model(model))
        return deployments_of(dict(registered.tags or {}))

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        """A run's artifact at ``path``, downloaded into ``dest``.

        An export run whose version is an MLflow Model keeps the version folder in its logged model,
        not in the run: its ``model`` path resolves to ``<name>/1`` of that logged model, so readers
        written for the older layout (config.pbtxt + model/ in the run) read both.
        """
        try:
            got = Path(
                self._call(
                    "artifact download", lambda: self.client.download_artifacts(run_id, path, str(dest))
                )
            )
        except RegistryError:
            if path != "model":
                raise
            got = dest / path
        if path == "model" and not got.exists():
            return self._download_logged_version(run_id, dest / path) or got
        return got

    def _download_logged_version(self, run_id: str, target: Path) -> Path | None:
        run = self._call("run lookup", lambda: self.client.get_run(run_id))
        outputs = getattr(run, "outputs", None)
        ids = [o.model_id for o in (getattr(outputs, "model_outputs", None) or [])]
        if not ids:
            return None
        import mlflow.artifacts  # heavy (seconds); imported by self.client above already

        logged = self._call("model lookup", lambda: self.client.get_logged_model(ids[0]))
        uri = f"{logged.artifact_location}/{logged.name}/{VERSION_FOLDER}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with (
            global_tracking_uri(self.uri),  # mlflow-artifacts:/ URIs resolve against it
            tempfile.TemporaryDirectory(prefix="mlreg-download-", dir=target.parent) as tmp,
        ):
            try:
                got = self._call(
                    "artifact download",
                    lambda: mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp),
                )
            except RegistryError:
                return None  # an ensemble's version folder is empty: nothing was logged
            shutil.move(got, target)
        return target


def _fresh(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def _model_id(source: str) -> str:
    """``models:/m-...`` (a logged model) -> its id; registry URIs (``models:/name/1``) -> ""."""
    found = source.removeprefix("models:/") if source.startswith("models:/") else ""
    return found if found.startswith("m-") and "/" not in found else ""
