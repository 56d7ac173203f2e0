"""The MLflow adapter: every MLflow call of mlreg goes through here.

``MlflowException`` and HTTP failures are translated into ``RegistryError`` in
``_call`` only.  Requests are bounded (``MLREG_MLFLOW_TIMEOUT``, two retries), so a
tracking server that is down fails in seconds, not minutes.  Read-only queries
against an HTTP server use MLflow's REST API directly (``registry.mlflow_rest``),
so ``mlreg versions`` does not pay MLflow's multi-second import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from registry.errors import RegistryError
from registry.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
EXPORTS_EXPERIMENT = "mlreg-exports"


class MlflowRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.uri = settings.tracking_uri
        self._client: Any = None
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Import MLflow and open the client in the background (it takes seconds)."""
        threading.Thread(target=lambda: self.client, daemon=True).start()

    @property
    def client(self) -> Any:
        with self._lock:
            return self._open()

    def _open(self) -> Any:
        if self._client is None:
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(self.settings.mlflow_timeout))
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "2"
            os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
            # MLflow 3 sends usage telemetry from a background thread that holds every command's
            # exit for ~1 s (longer offline); a team can opt in with MLFLOW_DISABLE_TELEMETRY=false
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
            for noisy in ("mlflow", "alembic"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
            if self.uri.startswith("sqlite:///"):
                Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        # MLflow is imported once, under the lock, by whichever thread gets there first: importing
        # its modules from two threads at once breaks protobuf's descriptor pool (seen for real)
        self.client  # noqa: B018
        from mlflow.exceptions import MlflowException

        try:
            with contextlib.redirect_stdout(sys.stderr):  # MLflow prints "View run at" lines
                return fn()
        except MlflowException as exc:
            code = getattr(exc, "error_code", "") or ""
            message = exc.message if hasattr(exc, "message") else str(exc)
            if "RESOURCE_DOES_NOT_EXIST" in code:
                fix = "check the name and version ('mlreg versions MODEL')"
            elif (
                "Max retries exceeded" in message
                or "ConnectionError" in message
                or ("timed out" in message.lower())
            ):
                fix = f"check the tracking server at {self.uri} is up (MLFLOW_TRACKING_URI)"
            else:
                fix = "read the message above"
            raise RegistryError(
                f"MLflow ({self.uri}): {what} failed: {message.splitlines()[0]}", fix=fix, code=code
            ) from exc
        except OSError as exc:  # requests' ConnectionError is an OSError
            raise RegistryError(
                f"MLflow ({self.uri}): {what} failed: {exc}",
                fix=f"check the tracking server at {self.uri} is up",
            ) from exc

    # -- experiments and runs ------------------------------------------------------------------

    def experiment_id(self, name: str = EXPORTS_EXPERIMENT) -> str:
        existing = self._call("experiment lookup", lambda: self.client.get_experiment_by_name(name))
        if existing is not None:
            return str(existing.experiment_id)
        location = None
        if self.uri.startswith("sqlite:"):
            self.settings.artifact_root.mkdir(parents=True, exist_ok=True)
            location = self.settings.artifact_root.as_uri()
        return str(
            self._call(
                "experiment creation", lambda: self.client.create_experiment(name, artifact_location=location)
            )
        )

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

    def discard_run(self, run_id: str) -> None:
        """Best effort: a run whose version was not created must not linger as a success."""
        try:
            self.client.set_tag(run_id, "mlreg_orphaned", "true")
            self.client.set_terminated(run_id, "FAILED")
            self.client.delete_run(run_id)
        except Exception as exc:
            log.warning("could not clean up run %s: %s", run_id, exc)

    def artifact_uri(self, run_id: str) -> str:
        return str(self._call("run lookup", lambda: self.client.get_run(run_id)).info.artifact_uri)

    # -- registered models ----------------------------------------------------------------------

    def ensure_model(self, name: str, description: str) -> None:
        self.client  # noqa: B018 - imports MLflow under the lock (see _call)
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self._call(
                "model registration",
                lambda: self.client.create_registered_model(
                    name, tags={"mlreg": "1"}, description=description
                ),
            )

    def create_version(
        self, name: str, source: str, run_id: str, tags: dict[str, str], description: str
    ) -> str:
        version = self._call(
            "version creation",
            lambda: self.client.create_model_version(
                name, source, run_id=run_id, tags=tags, description=description
            ),
        )
        return str(version.version)

    def find_by_tag(self, name: str, key: str, value: str) -> list[Any]:
        query = f"name='{name}' and tags.{key}='{value}'"
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

    def aliases(self, name: str) -> dict[str, str]:
        """alias -> version (read from the registered model: version searches drop aliases)."""
        model = self._call("model lookup", lambda: self.client.get_registered_model(name))
        return {alias: str(version) for alias, version in (model.aliases or {}).items()}

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call("alias update", lambda: self.client.set_registered_model_alias(name, alias, version))

    def delete_alias(self, name: str, alias: str) -> None:
        self._call("alias removal", lambda: self.client.delete_registered_model_alias(name, alias))

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._call("tag update", lambda: self.client.set_model_version_tag(name, version, key, value))

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        return Path(
            self._call("artifact download", lambda: self.client.download_artifacts(run_id, path, str(dest)))
        )
