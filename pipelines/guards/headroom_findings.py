"""What the memory headroom guard (headroom.py ``Headroom``) found in one promotion: ``Findings``.

Per replica, load and device the check made (``checks``), each refusal and leak, each footprint
measured, the replicas not checked and why (``notes``: never a silent pass), and each load,
refusal and leak as an ``Event`` on the samples' clock (seconds since the guard was made, the
newest ``SAMPLES`` kept): the promotion's result carries them, the record stage writes the
footprints to the registry and draws the events (pipelines/promote/plots.py).  Safe to fill from
the threads of a staged wave.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

SAMPLES = 2000  # readings (and events) kept for the record's plot; the oldest are dropped


@dataclass(frozen=True)
class Footprint:
    model: str
    version: str
    bytes: int
    kind: str  # "gpu" (summed over the GPUs) | "host"
    replica: str = ""  # where this promotion measured it ("": recorded before)
    note: str = ""


@dataclass(frozen=True)
class Event:
    """A load sent, refused, failed or leaking, on the samples' clock."""

    seconds: float
    replica: str
    what: str  # "load of net v2", "refused net v2", "failed load of net v2", "leak of 512 MiB ..."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": round(self.seconds, 3)}


class Findings:
    """``start``: the samples' clock's zero (``time.monotonic()`` when the guard was made)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.checks: list[dict[str, Any]] = []  # per replica, load and device
        self.refused: list[str] = []
        self.leaks: list[dict[str, Any]] = []
        self.measured: list[Footprint] = []
        self._lock = threading.Lock()
        self._events: deque[Event] = deque(maxlen=SAMPLES)
        self._unchecked: dict[str, list[str]] = {}  # why -> the replicas not checked for it
        self._notes: list[str] = []

    # -- what the guard tells -------------------------------------------------------------------

    def checked(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.checks.extend(rows)

    def refusal(self, url: str, message: str, label: str) -> None:
        with self._lock:
            self.refused.append(message)
        self.event(url, f"refused {label}")

    def leak(self, url: str, leak: dict[str, Any], what: str) -> None:
        with self._lock:
            self.leaks.append(leak)
        self.event(url, what)

    def footprint(self, found: Footprint) -> None:
        with self._lock:
            self.measured.append(found)

    def event(self, url: str, what: str) -> None:
        with self._lock:
            self._events.append(Event(time.monotonic() - self.start, url, what))

    def skip(self, url: str, why: str) -> None:
        """``url`` not checked, for ``why`` (each replica named once per reason)."""
        with self._lock:
            urls = self._unchecked.setdefault(why, [])
            if url not in urls:
                urls.append(url)

    def note(self, note: str) -> None:
        with self._lock:
            if note not in self._notes:
                self._notes.append(note)

    # -- what a promotion reports -----------------------------------------------------------------

    def footprints(self) -> list[tuple[str, str, int, str]]:
        """(model, version, bytes, kind) of every footprint this promotion measured."""
        return [(f.model, f.version, f.bytes, f.kind) for f in self.measured]

    @property
    def notes(self) -> list[str]:
        with self._lock:
            unchecked = [
                f"memory headroom was not checked at {', '.join(urls)}: {why}"
                for why, urls in self._unchecked.items()
            ]
            return unchecked + self._notes

    def summary(self) -> str:
        return (
            f"{len(self.checks)} check(s), {len(self.refused)} refused, {len(self.leaks)} leak(s), "
            f"{len(self.measured)} footprint(s) measured, {len(self.notes)} note(s)"
        )

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def to_dict(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """What was found, with the gauge ``samples`` the guard kept (``Headroom.to_dict`` adds
        its settings)."""
        return {
            "checks": [dict(c) for c in self.checks],
            "refused": list(self.refused),
            "leaks": [dict(leak) for leak in self.leaks],
            "footprints": [asdict(f) for f in self.measured],
            "notes": self.notes,
            "samples": samples,
            "events": [e.to_dict() for e in self.events()],
        }
