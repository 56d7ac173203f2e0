"""What an exception of an MLflow call means to a user: the adapter's one translation
(``MlflowConnection.call``, registry.mlflow.connection, hands every failure here).

A full disk and a locked embedded database are recognised first, whatever wraps them (MLflow,
SQLAlchemy, an ``OSError`` of the artifact folder); then ``MlflowException`` by its error code and
a connection failure by its text.  Anything else is not MLflow's and is left to the caller.
"""

from __future__ import annotations

from pathlib import Path

from registry.disk import disk_full_error, is_disk_full
from registry.errors import MlregError, RegistryError
from registry.mlflow import sqlite
from registry.mlflow.locked import is_locked, locked_error
from registry.settings import redact_uri

UNREACHABLE = ("Max retries exceeded", "ConnectionError", "timed out")


def translated(uri: str, local_root: Path, what: str, exc: Exception) -> MlregError | None:
    """The error a user reads for ``exc``, raised by MLflow ``what`` on registry ``uri``; None when
    it is not MLflow's (a bug: the CLI says so)."""
    if isinstance(exc, MlregError):
        return exc
    if is_disk_full(exc):  # before any other reading: sqlite's or the artifact folder's
        return disk_full_error(exc, local_root, f"MLflow {what}")
    if uri.startswith(sqlite.EMBEDDED) and is_locked(exc):
        return locked_error(Path(uri.removeprefix(sqlite.EMBEDDED)), f"MLflow {what}", None)
    from mlflow.exceptions import MlflowException  # lazy: mlflow ~1.5 s of import

    shown = redact_uri(uri)
    if isinstance(exc, MlflowException):
        code = getattr(exc, "error_code", "") or ""
        message = exc.message if hasattr(exc, "message") else str(exc)
        if "RESOURCE_DOES_NOT_EXIST" in code:
            fix = "check the name and version ('mlreg versions MODEL')"
        elif any(text.lower() in message.lower() for text in UNREACHABLE):
            fix = f"check the tracking server at {shown} is up (MLFLOW_TRACKING_URI)"
        else:
            fix = "read the message above"
        return RegistryError(
            f"MLflow ({shown}): {what} failed: {message.splitlines()[0]}", fix=fix, code=code
        )
    if isinstance(exc, OSError):  # requests' ConnectionError is one
        return RegistryError(
            f"MLflow ({shown}): {what} failed: {exc}", fix=f"check the tracking server at {shown} is up"
        )
    return None
