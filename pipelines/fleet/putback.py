"""Putting a replica back to an earlier state (``PutBack``): what ``Fleet.restore`` does.

A replica still LOADING the model (a load past its deadline) gets the earlier state queued behind
that load: the late version never takes traffic when its load ends; the truth is kept in
``pending`` (and what was queued in ``queued``, checked by ``fleet.confirm_queued``).  A replica
that dropped (crashed, restarting) is waited for up to ``restart_wait`` s, then put back; one that
does not come back is named once (``gone``), and not asked again in this promotion; one that came
back is noted in ``restarted``.  The sends themselves are the fleet's ``Sender`` (sender.py): the
same load and unload a move makes, told to the ledger as an undo.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pipelines.core.changes import Change, States, loading_versions, ready_versions
from pipelines.core.ports import ServingTarget
from pipelines.fleet.sender import Sender
from registry.contracts.config import config_json
from registry.errors import MlregError

QUEUE_WAIT_S = 2.0  # how long a restore queued behind a late load is waited for before it is left queued


@runtime_checkable
class QueuesLoads(Protocol):
    """A target that can send a load and stop waiting for it (``TritonControl.queue_load``)."""

    def queue_load(self, model: str, config: str, wait: float) -> bool: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...


@dataclass(frozen=True)
class Queued:
    """A restore queued behind a late load: at ``url``, ``model`` should end serving ``held``
    (and none of ``late``, the versions whose load outlived its deadline)."""

    url: str
    model: str
    late: tuple[str, ...]
    held: tuple[str, ...]
    behind: str = ""  # the model whose late load it waits for ("": ``model`` itself)


class PutBack:
    """Each replica put back to a ``Change`` (an earlier state), sent by ``sender``; ``restart_wait``:
    how long a replica that dropped is waited for."""

    def __init__(self, sender: Sender, restart_wait: float) -> None:
        self.sender = sender
        self.restart_wait = restart_wait
        self.pending: dict[str, str] = {}  # url -> a restore queued behind a late load (the truth to say)
        self.queued: dict[str, Queued] = {}  # the same keys: what was queued, checked by confirm_queued
        self.gone: dict[str, str] = {}  # url -> why it was not put back (dropped, never came back)
        self.restarted: dict[str, None] = {}  # urls that dropped and came back during this promotion

    def restore(self, url: str, change: Change) -> str:
        """Put the server at ``url`` back to ``change``; returns "" or why not (the module's
        docstring says how a late load and a dropped replica are handled)."""
        if url in self.gone:
            return self.gone[url]
        try:
            states = self._states_back(url)
            loading = loading_versions(states, change.model)
            if loading and change.config is not None:
                self.sender.view.forget([url])
                return self._queue_behind(url, change, loading, ready_versions(states, change.model))
            member = _loading_member(change, states)
            if member:  # an ensemble's load waits for its member's (measured on 2.51): queued too
                self.sender.view.forget([url])
                return self._queue_ensemble(url, change, member, loading_versions(states, member))
            self.sender.send(url, change, undo=True)
        except MlregError as exc:
            why = exc.message if exc.message.startswith(url) else f"{url}: {exc.message}"
            if dropped(exc):
                self.gone[url] = why = (
                    f"{why} (waited {self.restart_wait:.0f}s for it to come back: it did not; what it "
                    "serves once it is back is what it loads at start)"
                )
            return why
        return ""

    def _states_back(self, url: str) -> States:
        """What ``url`` holds now, asked of it; a replica that dropped waited for (``restart_wait``)
        first -- it comes back as it starts (explicit mode: serving nothing), noted in ``restarted``."""
        target = self.sender.target(url)
        try:
            return target.model_states()
        except MlregError as exc:
            if not dropped(exc) or not wait_back(target, self.restart_wait):
                raise
        self.sender.view.forget([url])
        self.restarted.setdefault(url, None)
        return target.model_states()

    def _queue_ensemble(self, url: str, change: Change, member: str, loading: list[str]) -> str:
        """An ensemble's earlier config sent behind its ``member``'s load still running at ``url``:
        Triton makes it wait for that load, so it is left queued (the ensemble serves as it is
        meanwhile) and its truth kept in ``pending``."""
        target = self.sender.target(url)
        assert change.config is not None
        if _pins(change).get(member) == -1:  # following the member's latest: it would follow the late
            return ""  # version when that lands; the undo's own put-back (pinned) is queued next
        if not isinstance(target, QueuesLoads):
            return f"{url}: {member} v{','.join(loading)} is still LOADING: {change.model} not put back"
        try:
            done = target.queue_load(change.model, config_json(change.config, change.model), QUEUE_WAIT_S)
        except MlregError as exc:
            return f"{url}: {change.model} could not be queued behind {member}'s load: {exc.message}"
        self.sender.told(url, change, (), True, "ok" if done else "queued")
        if not done:
            key = f"{url} {change.model}"
            self.pending[key] = (
                f"queued {change.model}'s earlier config (v{','.join(change.versions)}) on {url} behind "
                f"the load of {member} v{','.join(loading)}, still running there"
            )
            self.queued[key] = Queued(url, change.model, (), tuple(change.versions), behind=member)
        return ""

    def _queue_behind(self, url: str, change: Change, loading: list[str], ready: list[str]) -> str:
        """``change`` (what ``url`` held before) sent as a load behind the one still running there:
        Triton runs a model's loads one after the other, so when the late load ends the load that
        names only the held versions unloads the late one (an unload would take the model down,
        the held versions with it: measured on 2.51).  Returns "" (the truth kept in ``pending``)
        or why it could not be queued."""
        target = self.sender.target(url)
        late, held = ",".join(loading), ",".join(change.versions)
        if not isinstance(target, QueuesLoads) or change.config is None:
            return (
                f"{url}: {change.model} v{late} is still LOADING (a load that never finished): "
                "not put back; restart that replica"
            )
        try:
            done = target.queue_load(change.model, config_json(change.config, change.model), QUEUE_WAIT_S)
        except MlregError as exc:
            return (
                f"{url}: {change.model} v{late} is still LOADING and the load of v{held} could not be "
                f"queued behind it ({exc.message}): when it ends v{late} may serve; restart that replica"
            )
        self.sender.told(url, change, (), True, "ok" if done else "queued")
        if done:
            for version in change.versions:
                target.wait_ready(change.model, version, timeout=self.sender.load_timeout)
            return ""
        self.pending[url] = (
            f"the load of {change.model} v{late} is still running on {url}; queued the load of v{held} "
            "behind it (Triton runs a model's loads in turn)"
        )
        self.queued[url] = Queued(url, change.model, tuple(loading), tuple(change.versions))
        return ""


def _loading_member(change: Change, states: States) -> str:
    """A model ``change``'s (ensemble) config pins that is still LOADING in ``states`` ("": none)."""
    return next((m for m in _pins(change) if loading_versions(states, m)), "")


def _pins(change: Change) -> dict[str, int]:
    """member -> the version ``change``'s ensemble config pins ({} for another model)."""
    if change.config is None or "ensemble_scheduling" not in change.config:
        return {}
    steps = json.loads(config_json(change.config, change.model)).get("ensemble_scheduling", {})
    return {str(s.get("model_name", "")): int(s.get("model_version", -1)) for s in steps.get("step", [])}


def dropped(exc: MlregError) -> bool:
    """``exc`` says the replica cannot be reached (gRPC UNAVAILABLE: nothing listens, the connection
    closed mid-call) -- a crash or a restart -- not that it refused (a missing control key)."""
    status = exc.context.get("status")
    return status == "StatusCode.UNAVAILABLE"


def wait_back(target: ServingTarget, wait: float, interval: float = 0.25) -> bool:
    """Whether ``target`` answers a liveness check again within ``wait`` s (polled)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            if target.is_live():
                return True
        except MlregError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
