"""What served where, when: the ledger's events replayed.

A replica's state of a model after an event: an ``ok`` load or config update -> the versions it
named READY; an ``ok`` unload -> nothing.  A ``failed`` or ``queued`` event leaves the state as it
was (Triton 2.51 keeps what served when a load fails; a queued load is not confirmed).  An event
counts from its time on (the time its result was known); events are replayed in chain order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelines.ledger.events import Event, event_time

Served = dict[str, tuple[str, ...]]  # model -> versions READY


@dataclass(frozen=True)
class Interval:
    """``versions`` of ``model`` served on ``replica`` from ``since`` until ``until`` ("" : still)."""

    replica: str
    model: str
    versions: tuple[str, ...]
    since: str
    until: str
    event: int  # the event that began it

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "model": self.model,
            "versions": list(self.versions),
            "since": self.since,
            "until": self.until,
            "event": self.event,
        }


def changes(event: Event) -> bool:
    """Whether ``event`` changed what its replica serves."""
    return event.result == "ok"


def served_at(events: Iterable[Event], replica: str, at: datetime) -> Served:
    """What ``replica`` served at ``at``, model by model (models it served nothing of left out)."""
    state: Served = {}
    for event in events:
        if event.replica != replica or not changes(event) or event_time(event) > at:
            continue
        state[event.model] = event.versions if event.kind != "unload" else ()
    return {model: versions for model, versions in sorted(state.items()) if versions}


def intervals(events: Iterable[Event], model: str) -> list[Interval]:
    """Every span during which a replica served ``model``'s versions, oldest first."""
    open_: dict[str, tuple[tuple[str, ...], str, int]] = {}
    spans: list[Interval] = []
    for event in events:
        if event.model != model or not changes(event):
            continue
        versions = event.versions if event.kind != "unload" else ()
        before = open_.pop(event.replica, None)
        if before is not None:
            spans.append(Interval(event.replica, model, before[0], before[1], event.time, before[2]))
        if versions:
            open_[event.replica] = (versions, event.time, event.seq)
    spans.extend(Interval(r, model, v, since, "", seq) for r, (v, since, seq) in open_.items())
    return sorted(spans, key=lambda s: (s.since, s.replica))


def replicas(events: Iterable[Event]) -> list[str]:
    return sorted({e.replica for e in events})


__all__ = ["Interval", "Served", "intervals", "replicas", "served_at"]
