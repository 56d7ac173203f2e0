"""The relay: receive a delivery, act on the queue, reconcile -- each a method a test can drive.

Receive (``receive``): verify (401: forged, unsigned, stale), de-duplicate the delivery id (409),
map the alias to the environments that follow it, queue one job per environment (a version already
pending is a duplicate), answer 202.  Nothing is deployed on the request's path.

Act (``drain``): per job, under the store lock ``mlreg-relay.<env>.<model>`` (never waits: another
relay holding it leaves the job pending, tried again): the alias is read again (moved on since:
``superseded``), what the environment serves is read (the version already: ``noop``), then the
deployer runs; a deployment is recorded in the store with what served before it (the rollback
target).  Two relays on one environment therefore deploy a version once: the second takes the
lock after the first released it and finds the version served.

Reconcile (``reconcile``): every followed alias is read from MLflow and compared with what its
environment serves; a difference is queued (``source = reconcile``) -- a lost delivery, a relay
that was down, an alias written straight into the database all converge within an interval.  A
version the promotion refused is not queued again until the alias moves (the refusal is kept).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mlreg.relay import record
from mlreg.relay.actions import Deployer, Outcome
from mlreg.relay.config import RelayConfig
from mlreg.relay.queue import Job, Queue
from mlreg.relay.wire import DIGITS, NAME, Delivery, Refused, verify
from registry.errors import MlregError, StorageError

if TYPE_CHECKING:
    from pipelines.storage.base import Repository
    from pipelines.storage.objects import ObjectStore
    from registry.settings import Settings

log = logging.getLogger("mlreg.relay")
DRAIN_BATCH = 100
MAX_HOLDERS = 10_000  # models one alias names, read from the registry's database per reconcile
CLOCK_SKEW_S = 60.0  # a record's time may be this far ahead of the relay's clock (another writer's)


def named(model: str, version: str) -> bool:
    """A model name the store can hold and a version number: what a registry's database or the
    queue's file hands back is checked against the rules a webhook's event is (an allow-list)."""
    return (
        isinstance(model, str)
        and NAME.match(model) is not None
        and model not in {".", ".."}
        and isinstance(version, str)
        and DIGITS.match(version) is not None
    )


class Aliases(Protocol):
    def holders(self, alias: str) -> dict[str, str]:
        """Every model whose ``alias`` names a version -> that version."""

    def version(self, model: str, alias: str) -> str:
        """The version ``alias`` names of ``model`` ("" when none)."""


@dataclass
class Relay:
    settings: Settings | None
    config: RelayConfig
    queue: Queue
    store_for: Callable[[str], Repository]
    deployer_for: Callable[[str], Deployer]
    aliases: Aliases
    secret: bytes
    clock: Callable[[], float] = time.time
    wake: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)

    # -- receive ---------------------------------------------------------------------------------

    def receive(self, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        """The HTTP answer to one delivery: (status, JSON document)."""
        now = self.clock()
        try:
            delivery = verify(headers, body, self.secret, now, self.config.window)
            queued, ignored = self._accept(delivery, now)
        except Refused as refused:
            log.warning("relay: delivery refused (%d): %s", refused.status, refused.reason)
            return refused.status, {"refused": refused.reason}
        except sqlite3.OperationalError as exc:  # the queue's file stayed locked past its wait
            log.warning("relay: queue busy (%s): answered 503, nothing recorded; MLflow sends it again", exc)
            return 503, {"retry": "the relay's queue is busy"}
        if ignored:
            log.info("relay: %s: ignored", ignored)
            return 202, {"ignored": ignored}
        self.wake.set()
        return 202, {"queued": queued}

    def _accept(self, delivery: Delivery, now: float) -> tuple[dict[str, str], str]:
        """(queued per environment, why it is ignored); Refused 409 for a delivery id seen before."""
        event = delivery.event
        if event is None:
            ignored = f"event {delivery.kind} is not followed"
            envs: list[str] = []
            fields = ("", "", "")
        else:
            envs = self.config.environments_following(event.alias)
            if self.config.models and event.model not in self.config.models:
                envs = []
            ignored = "" if envs else f"nobody follows alias '{event.alias}' of model '{event.model}'"
            fields = (event.model, event.alias, event.version)
        keep = 2 * self.config.window
        queued = self.queue.accept(delivery.delivery_id, fields, envs, now, keep, ignored)
        if queued is None:
            raise Refused(409, f"delivery {delivery.delivery_id} was received before (a replay)")
        return queued, ignored

    # -- act -------------------------------------------------------------------------------------

    def drain(self) -> list[tuple[Job, str]]:
        """Act on every pending job once; (job, what happened) each.  Once ``stopping`` is set no
        new job starts (the one under way finishes: a promotion is never cut off by the relay)."""
        done = []
        for job in self.queue.pending(DRAIN_BATCH):
            if self.stopping.is_set():
                break
            done.append((job, self.act(job)))
        return done

    def act(self, job: Job) -> str:
        if job.env not in self.config.follows or not named(job.model, job.version):
            state = "refused"  # a row the relay did not write (the queue's file is input too)
            self.queue.finish(
                job, state, "not a job the relay queues: environment, model or version", self.clock()
            )
            log.warning("relay: a queued job names an environment, model or version no event could: refused")
            return state
        store = self.store_for(job.env)
        try:
            with record.lock(store.session, job.env, job.model, self.settings):
                state, note = self._act_locked(store, job)
        except StorageError as exc:  # the lock is held (another relay acts) or the store is down
            self.queue.finish(job, "pending", f"busy: {exc.message}", self.clock())
            return "busy"
        except MlregError as exc:  # what serves could not be read, the record not written: the next
            state, note = "failed", exc.message  # reconcile queues the version again
        self.queue.finish(job, state, note, self.clock())
        log.info("relay: %s %s v%s: %s %s", job.env, job.model, job.version, state, note)
        return state

    def _act_locked(self, store: Repository, job: Job) -> tuple[str, str]:
        alias = self.config.follows.get(job.env, "")
        named = self.aliases.version(job.model, alias) if alias else ""
        if named != job.version:
            return "superseded", f"alias '{alias}' names {named or 'nothing'} now"
        deployer = self.deployer_for(job.env)
        served = deployer.serving(job.env, job.model)
        if served == job.version:
            return "noop", "already served"
        if self._in_flight(store.objects, job, served):
            return "noop", "dispatched already; its run has not served it yet"
        try:
            outcome = deployer.deploy(job.env, job.model, job.version)
        except MlregError as exc:
            outcome = Outcome("failed", exc.message)
        if outcome.state in ("done", "dispatched"):
            try:
                record.write(store.objects, job.env, job.model, job.version, served, self.clock())
            except MlregError as exc:  # deployed all the same: said, never retried as if it were not
                return (
                    outcome.state,
                    f"{outcome.note}; its record (rollback target {served}) NOT written: {exc.message}",
                )
        return outcome.state, outcome.note

    def _in_flight(self, store: ObjectStore, job: Job, served: str) -> bool:
        """The relay's last deployment was this version, from what serves now, within the grace: a
        dispatched run that has not served it yet (a promotion in-process serves before it returns)."""
        last = record.read(store, job.env, job.model)
        now = self.clock()
        return (
            last.deployed == job.version
            and last.previous == served
            and now - self.config.dispatch_grace < last.at <= now + CLOCK_SKEW_S
        )

    # -- reconcile -------------------------------------------------------------------------------

    def reconcile(self) -> dict[str, Any]:
        """Queue every followed alias its environment does not serve; the summary is kept as the
        queue's ``reconcile`` mark (``mlreg relay status``)."""
        now = self.clock()
        summary: dict[str, Any] = {"at": now, "queued": [], "errors": []}
        for env, alias in sorted(self.config.follows.items()):
            try:
                self._reconcile_env(env, alias, now, summary)
            except MlregError as exc:
                summary["errors"].append(f"{env}: {exc.message}")
        self.queue.mark("reconcile", json.dumps(summary), now)
        if summary["queued"]:
            self.wake.set()
        return summary

    def _reconcile_env(self, env: str, alias: str, now: float, summary: dict[str, Any]) -> None:
        holders = self.aliases.holders(alias)
        if len(holders) > MAX_HOLDERS:
            summary["errors"].append(
                f"{env}: alias '{alias}' names {len(holders)} models, over {MAX_HOLDERS}"
            )
            return
        deployer = self.deployer_for(env)
        for model, version in sorted(holders.items()):
            if self.config.models and model not in self.config.models:
                continue
            if not named(model, version):  # written straight into the database: not a name we store
                summary["errors"].append(f"{env}: alias '{alias}' names a model or version that is no name")
                continue
            if self.queue.last_final(env, model, version, ("refused",)) is not None:
                continue  # refused as the CLI would: not again until the alias moves
            if deployer.serving(env, model) == version:
                continue
            state = self.queue.enqueue(env, model, version, "reconcile", now)
            if state != "duplicate":
                summary["queued"].append({"environment": env, "model": model, "version": version})


__all__ = ["Aliases", "Relay"]
