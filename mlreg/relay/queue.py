"""The relay's durable queue: one sqlite file under ``.mlreg/relay/`` (WAL, synchronous writes).

- ``deliveries``: every verified delivery id, kept ``2 x window`` (an older replay fails the
  timestamp window first), so a replayed delivery is refused (409) after a restart too.
- ``jobs``: one row per (environment, model) at most *pending* -- a newer version replaces the
  pending one (the alias names it now; the intermediate would be undone at once); each row ends
  ``done`` (deployed), ``noop`` (already served), ``superseded``, ``dispatched`` (a GitHub run
  started), ``refused`` (the promotion refused it: the reason kept, not retried for that version) or
  stays pending with its last error (``busy``: another relay holds the lock; retried).
- ``events``: the last events received (for ``mlreg relay status``), bounded.

Every statement is short; a writer waits at most ``BUSY_MS`` for another (two relays on one file).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSY_MS = 5000
KEEP_EVENTS = 1000
KEEP_JOBS = 5000
FINAL = ("done", "noop", "superseded", "refused", "dispatched")
SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (id TEXT PRIMARY KEY, received REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, env TEXT NOT NULL, model TEXT NOT NULL,
    version TEXT NOT NULL, source TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, note TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX IF NOT EXISTS one_pending ON jobs (env, model) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, delivery TEXT NOT NULL, model TEXT NOT NULL,
    alias TEXT NOT NULL, version TEXT NOT NULL, received REAL NOT NULL, outcome TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks (name TEXT PRIMARY KEY, value TEXT NOT NULL, at REAL NOT NULL);
"""


@dataclass(frozen=True)
class Job:
    seq: int
    env: str
    model: str
    version: str
    source: str  # "event" | "reconcile"
    created: float
    attempts: int


class Queue:
    """The queue in ``path`` (created with its folder, mode 0700)."""

    def __init__(self, path: Path, busy_s: float = BUSY_MS / 1000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path, self.busy_s = path, busy_s
        self._local = threading.local()
        self._conn().executescript(SCHEMA)  # its own transaction (CREATE ... IF NOT EXISTS)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.busy_s, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # a 202 is answered once the row is on disk
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- deliveries ------------------------------------------------------------------------------

    def first_delivery(self, delivery_id: str, now: float, keep: float) -> bool:
        """Record ``delivery_id``; False when it was seen before (a replay)."""
        with self._tx() as conn:
            return _first(conn, delivery_id, now, keep)

    def accept(
        self,
        delivery: str,
        event: tuple[str, str, str],
        envs: list[str],
        now: float,
        keep: float,
        ignored: str = "",
    ) -> dict[str, str] | None:
        """One delivery in one transaction: its id recorded, a job per environment queued and the
        event noted -- or nothing at all: a replay (None), or the file busy past its wait (sqlite's
        error: MLflow's retry of the same delivery then finds its id unrecorded)."""
        model, alias, version = event
        with self._tx() as conn:
            if not _first(conn, delivery, now, keep):
                return None
            queued = {env: _enqueue(conn, env, model, version, "event", now) for env in envs}
            outcome = ", ".join(f"{env}: {state}" for env, state in queued.items())
            _note(conn, (delivery, model, alias, version), now, f"ignored: {ignored}" if ignored else outcome)
            return queued

    # -- jobs ------------------------------------------------------------------------------------

    def enqueue(self, env: str, model: str, version: str, source: str, now: float) -> str:
        """``queued``, ``duplicate`` (that version is pending already) or ``replaced`` (another
        version was pending for the environment and model: this one takes its place)."""
        with self._tx() as conn:
            return _enqueue(conn, env, model, version, source, now)

    def pending(self, limit: int = 100) -> list[Job]:
        rows = self._conn().execute(
            "SELECT seq, env, model, version, source, created, attempts FROM jobs WHERE state = 'pending' "
            "ORDER BY seq LIMIT ?",
            (limit,),
        )
        return [Job(*row) for row in rows.fetchall()]

    def finish(self, job: Job, state: str, note: str, now: float) -> None:
        """``job`` ends in ``state`` (one of FINAL), or stays pending with ``note`` (state "pending")."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE jobs SET state = ?, note = ?, updated = ?, attempts = attempts + 1"
                " WHERE seq = ? AND state = 'pending'",
                (state, note[:500], now, job.seq),
            )
            conn.execute(
                "DELETE FROM jobs WHERE state != 'pending' AND seq <= (SELECT MAX(seq) FROM jobs) - ?",
                (KEEP_JOBS,),
            )

    def last_final(
        self, env: str, model: str, version: str, states: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """The newest job of (env, model, version) that ended in one of ``states``."""
        marks = ",".join("?" for _ in states)
        row = (
            self._conn()
            .execute(
                "SELECT state, updated, note FROM jobs WHERE env = ? AND model = ? AND version = ?"
                f" AND state IN ({marks}) "
                "ORDER BY seq DESC LIMIT 1",
                (env, model, version, *states),
            )
            .fetchone()
        )
        return None if row is None else {"state": row[0], "at": row[1], "note": row[2]}

    def counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {str(state): int(n) for state, n in rows}

    def recent_jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = (
            self._conn()
            .execute(
                "SELECT env, model, version, source, state, created, updated, attempts, note FROM jobs"
                " ORDER BY seq DESC LIMIT ?",
                (limit,),
            )
            .fetchall()
        )
        keys = (
            "environment",
            "model",
            "version",
            "source",
            "state",
            "created",
            "updated",
            "attempts",
            "note",
        )
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def last_event(self) -> dict[str, Any] | None:
        row = (
            self._conn()
            .execute(
                "SELECT delivery, model, alias, version, received, outcome FROM events"
                " ORDER BY seq DESC LIMIT 1"
            )
            .fetchone()
        )
        keys = ("delivery", "model", "alias", "version", "received", "outcome")
        return None if row is None else dict(zip(keys, row, strict=True))

    # -- marks (last reconcile, ...) -----------------------------------------------------------

    def mark(self, name: str, value: str, now: float) -> None:
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO marks VALUES (?, ?, ?)", (name, value[:2000], now))

    def read_mark(self, name: str) -> tuple[str, float] | None:
        row = self._conn().execute("SELECT value, at FROM marks WHERE name = ?", (name,)).fetchone()
        return None if row is None else (str(row[0]), float(row[1]))


def _first(conn: sqlite3.Connection, delivery_id: str, now: float, keep: float) -> bool:
    conn.execute("DELETE FROM deliveries WHERE received < ?", (now - keep,))
    found = conn.execute("INSERT OR IGNORE INTO deliveries VALUES (?, ?)", (delivery_id, now))
    return found.rowcount == 1


def _note(conn: sqlite3.Connection, event: tuple[str, str, str, str], now: float, outcome: str) -> None:
    conn.execute(
        "INSERT INTO events (delivery, model, alias, version, received, outcome) VALUES (?,?,?,?,?,?)",
        (*event, now, outcome[:300]),
    )
    conn.execute("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (KEEP_EVENTS,))


def _enqueue(conn: sqlite3.Connection, env: str, model: str, version: str, source: str, now: float) -> str:
    row = conn.execute(
        "SELECT seq, version FROM jobs WHERE env = ? AND model = ? AND state = 'pending'", (env, model)
    ).fetchone()
    if row is not None and row[1] == version:
        return "duplicate"
    if row is not None:
        conn.execute(
            "UPDATE jobs SET state = 'superseded', updated = ?, note = ? WHERE seq = ?",
            (now, f"the alias moved on to {version}", row[0]),
        )
    conn.execute(
        "INSERT INTO jobs (env, model, version, source, state, created, updated)"
        " VALUES (?,?,?,?,'pending',?,?)",
        (env, model, version, source, now, now),
    )
    return "queued" if row is None else "replaced"


def now() -> float:
    return time.time()


__all__ = ["FINAL", "Job", "Queue"]
