"""Triton's memory gauges, read the way the headroom guard (pipelines/guards/headroom.py) needs them.

Triton's metrics endpoint (Prometheus text) exports ``nv_gpu_memory_{total,used}_bytes`` per
``gpu_uuid`` and ``nv_cpu_memory_{total,used}_bytes`` (the whole host's RAM, not Triton's alone),
refreshed every ``--metrics-interval-ms``.  ``parse_gauges`` reads them (labels as
pipelines/triton/metrics.py reads the request counters' ``LABEL``), ``read_metrics`` fetches the text.

Where a model's memory goes (``placement``): host memory when every instance_group is KIND_CPU or
the replica reports no GPU; else the replica's GPUs -- all of them, or as many as the config's
``gpus`` names.  Triton's metrics do not say which uuid is CUDA device N, so named GPUs are checked
as the ones with the least free memory: a load that might not fit is never passed.

Host figures are coarse: Triton's host gauge is the whole machine's (other processes, other pods
of the node).  On a shared 2-core machine, one python model holding 400 MiB read 93 to 606 MiB
over three loads, and the first python model a server loads carries the backend's own start-up.
GPU gauges count only what is allocated on each GPU.

``Readings`` is how far the figures can be trusted, per replica: a scrape less than an interval old
is reused, a replica whose metrics cannot be read (or hold no memory gauge) is not read again and
the guard is told why, a fresh figure is polled for (``WAIT`` x the interval at most), and a load
that returned less than an interval before a scrape may not be in it yet (``unseen``).  Every
reading is kept as a ``Sample`` for the record's plot.

Kept apart from the guard so that what the gauges say is read in one place, and the guard holds
only its decisions (check, refuse, measure, fence off) and what it reports.
"""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.triton import metrics
from registry.contracts.config import model_config_pb2, parse_config

WAIT = 1.2  # a fresh figure is waited for this many intervals at most
GPU_USED = "nv_gpu_memory_used_bytes"
HOST_USED = "nv_cpu_memory_used_bytes"
GAUGE = re.compile(r"^nv_(gpu|cpu)_memory_(total|used)_bytes(?:\{([^}]*)\})?\s+(\S+)")
SCRAPE_TIMEOUT = 2.0

Read = Callable[[str], str]  # a metrics URL -> its Prometheus text
Pending = tuple[float, dict[str, float]]  # (monotonic time the load returned, bytes per device)


@dataclass(frozen=True)
class Gauges:
    """One scrape of a replica's memory gauges: (total, used) bytes per GPU uuid and the host's."""

    at: float  # time.monotonic() of the scrape
    gpus: Mapping[str, tuple[float, float]]
    host: tuple[float, float] | None

    def used(self, kind: str) -> float:
        if kind == "host":
            return self.host[1] if self.host else 0.0
        return sum(used for _, used in self.gpus.values())

    def free(self, device: str) -> float:
        total, used = self.host if device == "host" and self.host else self.gpus[device]
        return total - used


def parse_gauges(text: str, at: float = 0.0) -> Gauges:
    """The memory gauges of Triton's metrics text (labels read as ``metrics`` reads them); a value
    that is not a byte count raises ValueError naming it."""
    gpus: dict[str, dict[str, float]] = {}
    host: dict[str, float] = {}
    for line in text.splitlines():
        match = GAUGE.match(line)
        if not match:
            continue
        device, which, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{line.split()[0]} = {raw!r} is not a byte count")
        if device == "cpu":
            host[which] = value
        else:
            uuid = dict(metrics.LABEL.findall(labels or "")).get("gpu_uuid", "")
            gpus.setdefault(uuid, {})[which] = value
    pairs = {u: (g["total"], g["used"]) for u, g in gpus.items() if {"total", "used"} <= g.keys()}
    return Gauges(at, pairs, (host["total"], host["used"]) if {"total", "used"} <= host.keys() else None)


def read_metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
        return str(response.read().decode("utf-8", "replace"))


@dataclass(frozen=True)
class Placement:
    """Where a model's memory goes on one replica: ``kind`` and the devices checked."""

    kind: str  # "gpu" | "host"
    devices: tuple[str, ...]  # GPU uuids, or ("host",)
    named: int = 0  # GPUs the config names (0: every GPU)

    @property
    def source(self) -> str:
        return GPU_USED if self.kind == "gpu" else HOST_USED


def placement(config_text: str, gauges: Gauges) -> Placement:
    groups = parse_config(config_text).instance_group
    cpu = model_config_pb2().ModelInstanceGroup.KIND_CPU
    if not gauges.gpus or (groups and all(g.kind == cpu for g in groups)):
        return Placement("host", ("host",))
    named = len({index for group in groups for index in group.gpus})
    least_free_first = sorted(gauges.gpus, key=gauges.free)
    return Placement("gpu", tuple(least_free_first[:named] if named else least_free_first), named)


@dataclass(frozen=True)
class Sample:
    """One device's memory as one scrape read it, for the record's plot."""

    seconds: float  # since the guard was made (monotonic)
    replica: str
    device: str  # "host" or a GPU uuid
    used_bytes: int
    total_bytes: int
    what: str  # "before load of net v2", "after load of ...", "leak check after ..."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": round(self.seconds, 3)}


@dataclass
class Readings:
    """Each replica's gauges as one guard reads them (thread-safe: the fleet loads in parallel)."""

    metrics_url: Callable[[str], str]  # replica -> its metrics URL
    read: Read
    interval: float  # seconds between the gauges' refreshes
    sleep: Callable[[float], None]
    skip: Callable[[str, str], None]  # (replica, why its memory is not checked)
    kept: int  # samples kept; the oldest are dropped
    start: float = field(default_factory=time.monotonic)  # the samples' clock

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, Gauges] = {}
        self._dead: set[str] = set()  # replicas whose metrics could not be read
        self._unseen: dict[str, list[Pending]] = {}
        self._samples: deque[Sample] = deque(maxlen=self.kept)

    def dead(self, url: str) -> bool:
        """Whether ``url``'s metrics could not be read (the guard was told once)."""
        return url in self._dead

    def samples(self) -> list[Sample]:
        """Every gauge reading kept, oldest first (the newest ``kept``)."""
        with self._lock:
            return list(self._samples)

    def latest(self, url: str, what: str) -> Gauges | None:
        """The replica's gauges: a scrape less than an interval old, else a new one (None: none
        can be read there, and the guard is told why)."""
        with self._lock:
            last = self._last.get(url)
        if last is not None and time.monotonic() - last.at < self.interval:
            return last
        return self.scrape(url, what)

    def forget(self, url: str) -> None:
        """A load happened on ``url``: no earlier scrape stands for now."""
        with self._lock:
            self._last.pop(url, None)

    def scrape(self, url: str, what: str) -> Gauges | None:
        """A new reading of ``url``'s gauges, each device's kept as a ``Sample`` labelled ``what``."""
        if url in self._dead:
            return None
        try:
            gauges = parse_gauges(self.read(self.metrics_url(url)), time.monotonic())
        except (OSError, ValueError) as exc:
            self._dead.add(url)
            self.skip(url, f"its metrics could not be read ({exc})")
            return None
        if not gauges.gpus and gauges.host is None:
            self._dead.add(url)
            self.skip(url, f"its metrics have neither {GPU_USED} nor {HOST_USED}")
            return None
        devices = dict(gauges.gpus) | ({"host": gauges.host} if gauges.host else {})
        seconds = gauges.at - self.start
        with self._lock:
            self._last[url] = gauges
            self._samples.extend(
                Sample(seconds, url, device, int(used), int(total), what)
                for device, (total, used) in devices.items()
            )
        return gauges

    def poll(self, url: str, kind: str, done: Callable[[float, float], bool], what: str) -> float | None:
        """``url``'s used memory, read until ``done(first figure, figure)`` or ``WAIT`` intervals
        passed (the gauge refreshed at least once since the load returned): the last figure."""
        deadline = time.monotonic() + self.interval * WAIT
        first: float | None = None
        while True:
            gauges = self.scrape(url, what)
            if gauges is None:
                return None
            now = gauges.used(kind)
            if first is None:
                first = now
            elif done(first, now):
                return now
            if time.monotonic() >= deadline:
                return now
            self.sleep(max(0.01, self.interval / 10))

    # -- loads the gauge may not show yet ---------------------------------------------------------

    def loaded(self, url: str, added: dict[str, float]) -> None:
        """A load on ``url`` returned, adding ``added`` bytes per device."""
        with self._lock:
            self._unseen.setdefault(url, []).append((time.monotonic(), added))

    def unseen(self, url: str, gauges: Gauges) -> list[Pending]:
        """The loads on ``url`` that returned less than an interval before the scrape: the gauge
        may not show them yet."""
        with self._lock:
            return [p for p in self._unseen.get(url, []) if gauges.at - p[0] < self.interval]

    def unseen_bytes(self, url: str, gauges: Gauges) -> dict[str, float]:
        found: dict[str, float] = {}
        for _, added in self.unseen(url, gauges):
            for device, size in added.items():
                found[device] = found.get(device, 0.0) + size
        return found

    def shown(self, url: str, returned: float) -> None:
        """The gauge has refreshed since the loads on ``url`` that returned by ``returned``: it
        shows them."""
        with self._lock:
            self._unseen[url] = [p for p in self._unseen[url] if p[0] > returned]
