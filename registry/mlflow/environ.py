"""MLflow reads its settings from ``os.environ``; mlreg sets its own only while MLflow works.

MLflow takes its HTTP timeout and retries, its progress bars and its telemetry switch from
environment variables, and ``mlflow.set_tracking_uri`` writes MLFLOW_TRACKING_URI into the
process environment.  A library user's process (its own MLflow calls, a later registry on another
server, the deployments plugin) must not inherit mlreg's choices: ``MlflowEnviron`` sets them for a
block and puts ``os.environ`` back when the last block of the process leaves (blocks nest, and
threads may overlap: the first one in sets, the last one out restores).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

TRACKING_URI = "MLFLOW_TRACKING_URI"


class MlflowEnviron:
    """A process-wide, reference-counted set of environment variables."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, str | None] = {}

    @contextlib.contextmanager
    def scope(self, values: Mapping[str, str], defaults: Mapping[str, str]) -> Iterator[None]:
        """``values`` set, ``defaults`` set where the user set nothing, for the block."""
        with self._lock:
            if self._depth == 0:
                wanted = {**{k: v for k, v in defaults.items() if k not in os.environ}, **values}
                self._saved = {key: os.environ.get(key) for key in wanted}
                os.environ.update(wanted)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    _restore(self._saved)
                    self._saved = {}


ENVIRON = MlflowEnviron()
_URI_LOCK = threading.RLock()


@contextlib.contextmanager
def global_tracking_uri(uri: str | None) -> Iterator[None]:
    """MLflow's global tracking URI set to ``uri`` for a block (None: left alone), then put back,
    MLFLOW_TRACKING_URI included (``mlflow.set_tracking_uri`` writes it into ``os.environ``)."""
    if uri is None:
        yield
        return
    import mlflow  # lazy: mlflow ~1.5 s of import, paid only where MLflow's client is needed
    from mlflow.tracking import _tracking_service  # lazy: mlflow ~1.5 s of import

    with _URI_LOCK:
        before_env = {TRACKING_URI: os.environ.get(TRACKING_URI)}
        before = getattr(_tracking_service.utils, "_tracking_uri", None)
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            _tracking_service.utils.set_tracking_uri(before)  # type: ignore[arg-type]  # None unsets it
            _restore(before_env)


def _restore(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
