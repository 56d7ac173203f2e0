"""The MLflow adapter's one connection: the client, opened once, and the one translation point.

Every MLflow call of mlreg goes through ``MlflowConnection.call``: a failure is translated once
(``registry.mlflow.translate``) into ``RegistryError``.  Requests are bounded
(``MLREG_MLFLOW_TIMEOUT``, two retries), so a tracking server that is down fails in seconds, not
minutes; so does an embedded registry whose database another process holds
(``registry.mlflow.locked``: MLflow itself would wait 20 s a query).  MLflow's settings are
environment variables: they are set only while MLflow works (``registry.mlflow.environ``), so
``os.environ`` is left as it was found.  MLflow itself is imported on the first call (seconds).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from registry import background
from registry.errors import MlregError, RegistryError
from registry.mlflow import rest, sqlite
from registry.mlflow.environ import ENVIRON
from registry.mlflow.locked import DATABASE_LOCKED, lock_wait
from registry.mlflow.translate import translated
from registry.settings import EXPORTS_EXPERIMENT, PROMOTIONS_EXPERIMENT, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


class MlflowConnection:
    """The MLflow client of one registry URI, its errors translated, its lock waits bounded."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.uri = settings.tracking_uri
        self._client: Any = None
        self._lock = threading.Lock()
        # how long a call waits for an embedded database another process holds: none after it
        # waited in vain once (a command fails in seconds, not a wait a call), again after a success
        self._patience = lock_wait(settings)
        self.warming: threading.Thread | None = None
        self._experiments: dict[str, str] = {}  # name -> id (an experiment is never renamed)

    def warm_up(self) -> None:
        """Import MLflow and open the client in the background (it takes seconds).  A failure is
        the next call's to report (it opens the client again): no thread prints a traceback."""
        self.warming = background.start(self._warm, "mlreg-mlflow-warm-up")

    def _warm(self) -> None:
        try:
            self.client  # noqa: B018
        except Exception as exc:
            log.debug("opening MLflow in the background failed: %s", exc)

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
            self.local(partial(sqlite.wait_unlocked, self.uri, what="MLflow ping"))

    def experiment_id(self, name: str = EXPORTS_EXPERIMENT) -> str:
        """The id of experiment ``name``, created where it does not exist yet (the embedded
        registry's artifacts under ``settings.artifact_root``)."""
        if name in self._experiments:
            return self._experiments[name]
        existing = self.call("experiment lookup", lambda: self.client.get_experiment_by_name(name))
        if existing is not None:
            self._experiments[name] = str(existing.experiment_id)
            return self._experiments[name]
        location = None
        if self.uri.startswith("sqlite:"):
            self.settings.artifact_root.mkdir(parents=True, exist_ok=True)
            location = self.settings.artifact_root.as_uri()
        try:
            created = self.call(
                "experiment creation",
                lambda: self.client.create_experiment(name, artifact_location=location),
            )
        except MlregError:
            # another process (a concurrent promotion) created it since the lookup: use theirs
            raced = self.call("experiment lookup", lambda: self.client.get_experiment_by_name(name))
            if raced is None:
                raise
            created = raced.experiment_id
        self._experiments[name] = str(created)
        return self._experiments[name]

    @property
    def local_root(self) -> Path:
        """Where a local registry writes (the sqlite file's folder), else the state folder."""
        if self.uri.startswith("sqlite:///"):
            return Path(self.uri.removeprefix("sqlite:///")).parent
        return self.settings.home

    @property
    def client(self) -> Any:
        """MLflow's ``MlflowClient`` (MLflow imported on the first use, under a lock)."""
        with self._lock, self.environ():
            try:
                return self._open()
            except Exception as exc:
                failure = translated(self.uri, self.local_root, "opening the registry", exc)
                if failure is None:
                    raise
                raise failure from exc

    @contextlib.contextmanager
    def environ(self) -> Iterator[None]:
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
            if not self.settings.debug:  # it logs the traceback of a database error call translates
                logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
            if self.uri.startswith("sqlite:///"):
                self._prepare_database(Path(self.uri.removeprefix("sqlite:///")))
            from mlflow.tracking import MlflowClient  # lazy: mlflow ~1.5 s of import

            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def _prepare_database(self, db: Path) -> None:
        db.parent.mkdir(parents=True, exist_ok=True)
        if not db.exists():  # a new one: copied from a migrated template (seconds saved)
            from mlflow.tracking import MlflowClient  # lazy: mlflow ~1.5 s of import

            sqlite.seed(db, self.settings.template_cache, MlflowClient)
        # opening reads the schema: 5 s of sqlite's default wait on a locked file
        self.local(partial(sqlite.wait_unlocked, self.uri, what="MLflow opening the registry"))

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn``'s answer (``fn`` calls MLflow: ``what`` names it in an error); any failure
        translated once (registry.mlflow.translate).  MLflow waits 20 s a query on a locked
        embedded database: it is asked only once the file can be written."""
        self.local(partial(sqlite.wait_unlocked, self.uri, what=f"MLflow {what}"))
        try:
            # MLflow is imported once, under the lock, by whichever thread gets there first: importing
            # its modules from two threads at once breaks protobuf's descriptor pool (seen for real)
            self.client  # noqa: B018
            with self.environ(), contextlib.redirect_stdout(sys.stderr):  # "View run at" lines
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

    def local(self, read: Callable[[float], T]) -> T:
        """A read of the embedded registry's file (registry.mlflow.sqlite) that waits for a lock
        as long as this connection's patience lasts."""
        try:
            answer = read(self._patience)
        except RegistryError:  # the one error the reader raises: the database is locked
            self._patience = 0.0
            raise
        self._patience = lock_wait(self.settings)
        return answer
