"""What the read-only commands ask the registry (``mlreg show``, ``history``), one way per question.

``RegistryReads`` is the question list; it has two answers: ``ClientReads`` asks MLflow's client
(a tracking server, or anything the file cannot answer) and ``EmbeddedReads`` reads the embedded
registry's sqlite file (``registry.mlflow.sqlite``) without importing MLflow (its import alone is
seconds), handing a question to ``ClientReads`` where the file does not read as expected.
``open_reads`` picks one; callers never ask which.  Both answer in the same shapes:
tests/component/test_fast_reads.py compares them on one registry MLflow made.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from registry.errors import RegistryError
from registry.mlflow import sqlite
from registry.mlflow.locked import lock_wait
from registry.mlflow.sqlite import CHECK_NAME, NOT_FOUND, VersionRecord
from registry.settings import PROMOTIONS_EXPERIMENT, Settings, redact_uri

if TYPE_CHECKING:
    from registry.mlflow.registry import MlflowRegistry


MAX_ARTIFACT_BYTES = 64 * 2**20  # a run's config, manifest or validation report: bounded reads


class RegistryReads(Protocol):
    """The registry's answers the read-only commands need."""

    def require_model(self, name: str) -> dict[str, str]:
        """``name``'s aliases (alias -> version); RegistryError naming it (with "did you mean")
        when it is not registered."""
        ...

    def version(self, name: str, version: str) -> VersionRecord:
        """One version's run, source, tags and creation time; RegistryError when it is not there."""
        ...

    def artifact_text(self, run_id: str, path: str) -> str:
        """The text of the file ``path`` among run ``run_id``'s artifacts."""
        ...

    def versions(self, name: str) -> list[VersionRecord]:
        """Every version of ``name`` with its tags ([] for none)."""
        ...

    def promotion(self, run_id: str) -> dict[str, Any] | None:
        """Run ``run_id`` as a row of ``promotions`` plus its ``model``; None when it is no active
        run of the promotions experiment."""
        ...

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        """The promotions of ``name`` (in ``env``), newest first (``MlflowRuns.promotions``' rows)."""
        ...


class ClientReads:
    """The answers of MLflow's client (through ``MlflowRegistry``: one translation point)."""

    def __init__(self, registry: MlflowRegistry) -> None:
        self.registry = registry

    def require_model(self, name: str) -> dict[str, str]:
        return self.registry.models.require_model(name)

    def version(self, name: str, version: str) -> VersionRecord:
        return self._record(self.registry.models.version(name, version))

    def versions(self, name: str) -> list[VersionRecord]:
        return [self._record(mv) for mv in self.registry.models.versions(name)]

    def promotion(self, run_id: str) -> dict[str, Any] | None:
        return self.registry.runs.promotion(run_id)

    @staticmethod
    def _record(mv: Any) -> VersionRecord:
        return VersionRecord(
            str(mv.name),
            str(mv.version),
            str(mv.run_id or ""),
            str(mv.source or ""),
            dict(mv.tags or {}),
            str(getattr(mv, "storage_location", "") or ""),
            int(mv.creation_timestamp or 0),
        )

    def artifact_text(self, run_id: str, path: str) -> str:
        with tempfile.TemporaryDirectory(prefix="mlreg-read-") as tmp:
            return _bounded_text(self.registry.runs.download(run_id, path, Path(tmp)))

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        return self.registry.runs.promotions(name, env)


class EmbeddedReads:
    """The embedded registry's file read directly; a question it cannot answer goes to ``client``
    (made on first use: the adapter's modules cost ~0.1 s of imports a read never needs)."""

    def __init__(self, settings: Settings, registry: Callable[[], MlflowRegistry]) -> None:
        self.uri, self.wait = settings.tracking_uri, lock_wait(settings)
        self._registry = registry

    @functools.cached_property
    def client(self) -> ClientReads:
        return ClientReads(self._registry())

    def require_model(self, name: str) -> dict[str, str]:
        record = sqlite.registered_model(self.uri, name, self.wait)
        if record is not None:
            return dict(record.aliases)
        if sqlite.model_absent(self.uri, name, self.wait):
            raise sqlite.unregistered(self.uri, name, self.wait)
        return self.client.require_model(name)  # the file cannot tell: MLflow's client

    def version(self, name: str, version: str) -> VersionRecord:
        record = sqlite.model_version(self.uri, name, version, self.wait)
        if record is not None:
            return record
        if sqlite.version_absent(self.uri, name, version, self.wait) or not version.isdigit():
            self.require_model(name)  # an unknown model is named as such, with "did you mean"
            raise _no_version(self.uri, name, version, sqlite.registered_model(self.uri, name, self.wait))
        return self.client.version(name, version)

    def artifact_text(self, run_id: str, path: str) -> str:
        folder = sqlite.run_artifacts(self.uri, run_id, self.wait)
        target = (folder / path).resolve() if folder is not None else None
        if folder is None or target is None or not target.is_relative_to(folder.resolve()):
            return self.client.artifact_text(run_id, path)
        if not target.is_file():
            raise RegistryError(
                f"MLflow ({redact_uri(self.uri)}): run {run_id} has no artifact '{path}'",
                fix="the version was registered without it: register it again ('mlreg register')",
            )
        return _bounded_text(target)

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        found = sqlite.promotions(self.uri, PROMOTIONS_EXPERIMENT, name, env, self.wait)
        return self.client.promotions(name, env) if found is None else found

    def versions(self, name: str) -> list[VersionRecord]:
        found = sqlite.model_versions(self.uri, name, self.wait)
        return self.client.versions(name) if found is None else found

    def promotion(self, run_id: str) -> dict[str, Any] | None:
        found = sqlite.promotion_run(self.uri, PROMOTIONS_EXPERIMENT, run_id, self.wait)
        return self.client.promotion(run_id) if found is None else (found or None)


def open_reads(settings: Settings, adapter: Callable[[], MlflowRegistry] | None = None) -> RegistryReads:
    """The file's answers for the embedded registry when its database exists, else the client's.
    ``adapter``: makes the MLflow adapter to ask (default: one of ``settings``), called only when
    the client is asked."""

    def default() -> MlflowRegistry:
        from registry.mlflow.registry import MlflowRegistry  # lazy: the adapter's modules (~0.1 s)

        return MlflowRegistry(settings)

    if sqlite.database(settings.tracking_uri) is not None:
        return EmbeddedReads(settings, adapter or default)
    return ClientReads((adapter or default)())


def _no_version(uri: str, name: str, version: str, model: sqlite.ModelRecord | None) -> RegistryError:
    numbers = sorted((int(v) for v, _, _ in model.versions), reverse=True) if model else []
    shown = ", ".join(str(n) for n in numbers[:5]) + (", ..." if len(numbers) > 5 else "")
    hint = f"{name} has versions {shown}; " if numbers else f"{name} has no versions yet; "
    return RegistryError(
        f"MLflow ({redact_uri(uri)}): {name} version '{version}' is not a registered version",
        fix=hint + CHECK_NAME,
        code=NOT_FOUND,
    )


def _bounded_text(path: Path) -> str:
    if path.stat().st_size > MAX_ARTIFACT_BYTES:
        raise RegistryError(
            f"{path.name} is {path.stat().st_size:,} bytes, over the {MAX_ARTIFACT_BYTES:,} mlreg reads",
            fix="register the version again; its run's files are mlreg's own and small",
        )
    return path.read_text(encoding="utf-8")


__all__ = ["ClientReads", "EmbeddedReads", "RegistryReads", "open_reads"]
