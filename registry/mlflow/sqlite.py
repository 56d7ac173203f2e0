"""Read-only queries on the embedded registry's sqlite file, without importing MLflow.

MLflow's import costs 3-5 s.  The promotion's resolve step only needs a version's run, source
and tags, which the embedded registry keeps in ``model_versions`` / ``model_version_tags``; this
reader answers those and returns None on anything unexpected, so callers fall back to the MLflow
client (``registry.mlflow.registry``), the one place that writes.  A database another process
holds is the exception: after ``wait`` seconds it is a RegistryError naming the file
(``registry.mlflow.locked``), since MLflow would only wait longer (20 s a query) for the same answer.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from registry.errors import RegistryError
from registry.lineage import VERSION_FOLDER
from registry.mlflow.locked import LOCK_WAIT, is_locked, locked_error
from registry.settings import redact_uri

EMBEDDED = "sqlite:///"  # the embedded registry's tracking URI: this prefix, then the file's path
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"  # MLflow's error code for a model or version it does not hold
CHECK_NAME = "check the name and version ('mlreg versions MODEL')"
DELETED_STAGE = "Deleted_Internal"  # MLflow's mark on a deleted version (its searches skip it)


@dataclass(frozen=True)
class VersionRecord:
    name: str
    version: str
    run_id: str
    source: str
    tags: dict[str, str]
    storage_location: str = ""
    created: int = 0  # creation time, ms since the epoch

    @property
    def creation_timestamp(self) -> int:
        """MLflow's ``ModelVersion`` name for ``created`` (callers read either)."""
        return self.created

    def local_source(self) -> Path | None:
        """The version folder on disk (its parent holds config.pbtxt) when artifacts are local files.

        A version logged as an MLflow Model (source ``models:/<id>``) keeps the Triton model folder
        ``<name>/config.pbtxt`` + ``<name>/1/`` in the logged model's storage location; an older
        version's source is the run's ``model`` folder, next to the run's ``config.pbtxt``.
        """
        if self.source.startswith("models:/"):
            root = _file_path(self.storage_location)
            return root / self.name / VERSION_FOLDER if root else None
        return _file_path(self.source)


def _file_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


@contextlib.contextmanager
def _read_only(db: Path, wait: float) -> Iterator[sqlite3.Connection]:
    """``db`` opened read-only, closed on leaving (sqlite3's own ``with`` only ends a transaction);
    a RegistryError when another process holds it locked for ``wait`` seconds."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=wait)) as conn:
            yield conn
    except sqlite3.OperationalError as exc:
        if is_locked(exc):
            raise locked_error(db, "reading it", wait) from exc
        raise


def wait_unlocked(tracking_uri: str, wait: float, what: str) -> None:
    """Return once the embedded registry's database can take a write (``BEGIN IMMEDIATE``, rolled
    back at once: no byte written), waiting at most ``wait`` seconds; a RegistryError when another
    process still holds it.  Anything else (no file yet, a read-only file) is MLflow's to report."""
    db = database(tracking_uri)
    if db is None:
        return
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=wait, isolation_level=None)
        ) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        if is_locked(exc):
            raise locked_error(db, what, wait) from exc


def database(tracking_uri: str) -> Path | None:
    if not tracking_uri.startswith(EMBEDDED):
        return None
    path = Path(tracking_uri.removeprefix(EMBEDDED))
    return path if path.is_file() else None


def model_version(
    tracking_uri: str, name: str, version: str, wait: float = LOCK_WAIT
) -> VersionRecord | None:
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            row = conn.execute(
                "SELECT source, run_id, storage_location, creation_time FROM model_versions"
                " WHERE name = ? AND version = ? AND (current_stage IS NULL OR current_stage != ?)",
                (name, int(version), DELETED_STAGE),
            ).fetchone()
            if row is None:
                return None
            tags = dict(
                conn.execute(
                    "SELECT key, value FROM model_version_tags WHERE name = ? AND version = ?",
                    (name, int(version)),
                ).fetchall()
            )
    except (sqlite3.Error, ValueError):
        return None
    run_id, source, where = str(row[1] or ""), str(row[0] or ""), str(row[2] or "")
    return VersionRecord(name, str(int(version)), run_id, source, tags, where, int(row[3] or 0))


def model_versions(tracking_uri: str, name: str, wait: float = LOCK_WAIT) -> list[VersionRecord] | None:
    """Every version of ``name`` that is not deleted, as MLflow's ``search_model_versions("name='…'")``
    lists them ([] for a model with none, or none registered); None when the file is not there or
    does not read as expected (then ask MLflow)."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            rows = conn.execute(
                "SELECT version, run_id, source, storage_location, creation_time FROM model_versions"
                " WHERE name = ? AND (current_stage IS NULL OR current_stage != ?) ORDER BY version DESC",
                (name, DELETED_STAGE),
            ).fetchall()
            tags = _version_tags(conn, name)
    except sqlite3.Error:
        return None
    return [
        VersionRecord(
            name, str(v), str(run or ""), str(src or ""), tags.get(str(v), {}), str(where or ""), int(at or 0)
        )
        for v, run, src, where, at in rows
    ]


def _version_tags(conn: sqlite3.Connection, name: str) -> dict[str, dict[str, str]]:
    """version -> its tags, for every version of ``name`` (one query)."""
    tags: dict[str, dict[str, str]] = {}
    for key, value, version in conn.execute(
        "SELECT key, value, version FROM model_version_tags WHERE name = ?", (name,)
    ):
        tags.setdefault(str(version), {})[str(key)] = "" if value is None else str(value)
    return tags


def version_absent(tracking_uri: str, name: str, version: str, wait: float = LOCK_WAIT) -> bool:
    """True when the embedded registry's database reads fine and holds no such version (the
    MLflow client would only say the same, after a 3-5 s import); False when it cannot tell."""
    db = database(tracking_uri)
    if db is None:
        return False
    try:
        number = int(version)
    except ValueError:
        return False
    try:
        with _read_only(db, wait) as conn:
            row = conn.execute(
                "SELECT 1 FROM model_versions WHERE name = ? AND version = ?", (name, number)
            ).fetchone()
    except sqlite3.Error:
        return False
    return row is None


@dataclass(frozen=True)
class ModelRecord:
    """A registered model as ``mlreg versions`` shows it: its aliases and its versions' tags."""

    name: str
    aliases: dict[str, str]  # alias -> version
    versions: list[tuple[str, int, dict[str, str]]]  # (version, creation time in ms, tags)


def registered_model(tracking_uri: str, name: str, wait: float = LOCK_WAIT) -> ModelRecord | None:
    """``name``'s aliases and versions from the embedded registry's file; None when the file is not
    there, does not read as expected, or holds no such model (then ask MLflow, or ``model_absent``)."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            if conn.execute("SELECT 1 FROM registered_models WHERE name = ?", (name,)).fetchone() is None:
                return None
            aliases = dict(
                conn.execute(
                    "SELECT alias, version FROM registered_model_aliases WHERE name = ?", (name,)
                ).fetchall()
            )
            rows = conn.execute(
                "SELECT version, creation_time FROM model_versions"
                " WHERE name = ? AND (current_stage IS NULL OR current_stage != ?)",
                (name, DELETED_STAGE),
            ).fetchall()
            tags = _version_tags(conn, name)
    except sqlite3.Error:
        return None
    return ModelRecord(
        name,
        {str(alias): str(version) for alias, version in aliases.items()},
        [(str(v), int(created or 0), tags.get(str(v), {})) for v, created in rows],
    )


def model_absent(tracking_uri: str, name: str, wait: float = LOCK_WAIT) -> bool:
    """True when the embedded registry's database reads fine and holds no model ``name``, or does
    not exist yet (nothing is registered; asking MLflow would create it); False when it holds the
    model or cannot tell."""
    if not tracking_uri.startswith(EMBEDDED):
        return False
    db = database(tracking_uri)
    if db is None:
        return not Path(tracking_uri.removeprefix(EMBEDDED)).exists()
    try:
        with _read_only(db, wait) as conn:
            row = conn.execute("SELECT 1 FROM registered_models WHERE name = ?", (name,)).fetchone()
    except sqlite3.Error:
        return False
    return row is None


def model_names(tracking_uri: str, wait: float = LOCK_WAIT) -> list[str] | None:
    """Every registered model's name in the embedded registry's file (for "did you mean"); None
    when the file is not there or does not read as expected."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            rows = conn.execute("SELECT name FROM registered_models").fetchall()
    except sqlite3.Error:
        return None
    return sorted(str(name) for (name,) in rows)


def unregistered(tracking_uri: str, name: str, wait: float = LOCK_WAIT) -> RegistryError:
    """The refusal of a model ``name`` the registry does not hold, with "did you mean" where the
    embedded registry's file lists names close to it (``MlflowVersions.require_model`` and
    ``registry.mlflow.reads`` raise this one)."""
    try:
        names = model_names(tracking_uri, wait) or []
    except RegistryError:  # locked: the error being raised matters more than a hint
        names = []
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return RegistryError(
        f"model '{name}' is not registered in MLflow ({redact_uri(tracking_uri)})",
        fix=hint + "check the name; 'mlreg export' or 'mlreg register MODEL PATH' registers one",
    )


def alias_holders(tracking_uri: str, alias: str, wait: float = LOCK_WAIT) -> dict[str, str] | None:
    """Every registered model whose ``alias`` names a version -> that version; None when the
    embedded registry's file is not there or does not read as expected."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            rows = conn.execute(
                "SELECT name, version FROM registered_model_aliases WHERE alias = ?", (alias,)
            ).fetchall()
    except sqlite3.Error:
        return None
    return {str(name): str(version) for name, version in rows}


PROMOTION_FIELDS = {  # a promotion's row (``MlflowRuns.promotions``) -> (table, key) in its run
    "environment": ("tags", "environment"),
    "from": ("params", "from_version"),
    "to": ("params", "to_version"),
    "result": ("tags", "result"),
    "user": ("tags", "user"),
}
HISTORY_LIMIT = 500  # as many as ``MlflowRuns.promotions`` asks MLflow for


def promotions(
    tracking_uri: str, experiment: str, name: str, env: str | None, wait: float = LOCK_WAIT
) -> list[dict[str, Any]] | None:
    """The active runs of ``experiment`` tagged ``mlreg_model = name`` (and ``environment = env``),
    newest first, as ``MlflowRuns.promotions`` returns them (MLflow's ``search_runs`` with its
    default view, active runs only); [] when the experiment does not exist yet; None when the file
    is not there or does not read as expected."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            found = conn.execute(
                "SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = 'active'",
                (experiment,),
            ).fetchone()
            if found is None:
                return []
            runs = conn.execute(
                "SELECT r.run_uuid, r.start_time FROM runs r"
                " WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'"
                " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid"
                "  AND t.key = 'mlreg_model' AND t.value = ?)"
                " AND (? IS NULL OR EXISTS (SELECT 1 FROM tags e WHERE e.run_uuid = r.run_uuid"
                "  AND e.key = 'environment' AND e.value = ?))"
                " ORDER BY r.start_time DESC, r.run_uuid LIMIT ?",
                (found[0], name, env, env, HISTORY_LIMIT),
            ).fetchall()
            return [_promotion(conn, str(run_id), start) for run_id, start in runs]
    except sqlite3.Error:
        return None


def promotion_run(
    tracking_uri: str, experiment: str, run_id: str, wait: float = LOCK_WAIT
) -> dict[str, Any] | None:
    """Run ``run_id`` as a row of ``promotions`` plus its ``model`` (``MlflowRuns.promotion``);
    {} when it is no active run of ``experiment``; None when the file is not there or does not
    read as expected."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            found = conn.execute(
                "SELECT r.start_time FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id"
                " WHERE r.run_uuid = ? AND r.lifecycle_stage = 'active' AND e.name = ?",
                (run_id, experiment),
            ).fetchone()
            if found is None:
                return {}
            model = conn.execute(
                "SELECT value FROM tags WHERE run_uuid = ? AND key = 'mlreg_model'", (run_id,)
            ).fetchone()
            return _promotion(conn, run_id, found[0]) | {"model": model[0] if model else None}
    except sqlite3.Error:
        return None


def _promotion(conn: sqlite3.Connection, run_id: str, start: Any) -> dict[str, Any]:
    found = {
        table: dict(conn.execute(f"SELECT key, value FROM {table} WHERE run_uuid = ?", (run_id,)).fetchall())
        for table in ("tags", "params")  # an allow-list of two table names, never input
    }
    row: dict[str, Any] = {"when": None if start is None else int(start)}
    row |= {field: found[table].get(key) for field, (table, key) in PROMOTION_FIELDS.items()}
    return row | {"run_id": run_id}


def run_artifacts(tracking_uri: str, run_id: str, wait: float = LOCK_WAIT) -> Path | None:
    """The folder holding run ``run_id``'s artifacts when they are local files (the embedded
    registry's default), else None (ask MLflow to download them)."""
    db = database(tracking_uri)
    if db is None:
        return None
    try:
        with _read_only(db, wait) as conn:
            row = conn.execute("SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    except sqlite3.Error:
        return None
    folder = _file_path(str(row[0] or "")) if row is not None else None
    return folder if folder is not None and folder.is_dir() else None


# -- a new embedded registry, seeded ---------------------------------------------------------------


def template_path(cache: Path) -> Path:
    """The pristine, migrated, empty registry of the installed MLflow (its schema is per release)."""
    from importlib.metadata import version  # lazy: ~10 ms, only to seed a database

    return cache / f"mlflow-{version('mlflow')}-empty.db"


def seed(db: Path, cache: Path, client: type) -> bool:
    """Create ``db`` as a copy of an empty registry already migrated (MLflow's ~80 migrations take
    3-10 s on a first open; a copy ~50 ms), making the template in ``cache`` once per MLflow release.
    The template holds no experiment: MLflow creates its Default experiment, with this registry's
    artifact root, on the first open.  ``client``: MlflowClient (imported by the caller).  False (and
    nothing written) when it cannot: the caller then lets MLflow create ``db`` itself."""
    if db.exists():
        return False
    template = template_path(cache)
    try:
        if not template.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile_in(cache) as scratch:
                uri = f"{EMBEDDED}{scratch}"
                client(tracking_uri=uri, registry_uri=uri).search_experiments()  # migrates
                with contextlib.closing(sqlite3.connect(scratch)) as conn, conn:
                    conn.execute("DELETE FROM experiment_tags")
                    conn.execute("DELETE FROM experiments")
                scratch.replace(template)  # atomic: a concurrent maker's copy is as good
        with tempfile_in(db.parent) as scratch:
            scratch.write_bytes(template.read_bytes())
            scratch.replace(db)
        return True
    except (OSError, sqlite3.Error):
        return False


@contextlib.contextmanager
def tempfile_in(folder: Path) -> Iterator[Path]:
    """A fresh path in ``folder`` (same file system: a rename is atomic), removed unless renamed."""
    path = folder / f".mlreg-{os.getpid()}-{uuid.uuid4().hex}.tmp"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
