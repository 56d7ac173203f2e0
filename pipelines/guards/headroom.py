"""Memory headroom before every load, and a replica that leaked memory fenced off (issue 34).

``Headroom`` is this guard's part in a promotion, a ``LoadGuard`` (pipelines/core/check.py) the
runner builds through ``HeadroomGuard.load_guard``: ``Fleet.move`` asks ``before_load`` before it
sends anything (a refusal is a ``LoadRefused``) and tells ``after_load`` how the load went.  Every figure
is read off Triton's own memory gauges, refreshed every ``--metrics-interval-ms`` (2000 by default:
``METRICS_INTERVAL``).  pipelines/triton/gauges.py reads them, says where a model's memory goes
(``placement``) and how far a figure can be trusted; this module holds the guard's decisions
(check, refuse, measure, fence off) and what it reports.

- **Footprint**: what a version adds, learned where it is first loaded (the canary): the used
  gauge (summed over the GPUs, or the host's) read before the load and again after it, once the
  gauge has refreshed -- polled until it moves, ``gauges.WAIT`` x the interval at most.  Only a
  version whose footprint is not recorded yet (``known``: the registry's ``memory_footprint_bytes``
  and ``memory_footprint_kind`` version tags) is measured, so other loads never wait.  A delta that
  is not positive (other work on the replica moved the gauge) is recorded as 0, with a note.
- **Check**: on each replica, each device the model lands on must have ``footprint x margin``
  free (a GPU: its share, the footprint spread over the GPUs it lands on).  ``recreates`` (a
  config that differs from the served one beyond version_policy/instance_group: Triton re-creates
  the serving versions, peak 2 x old + new) adds the serving versions' footprint once more: one
  copy of them is already in the used gauge.  A load this promotion made on the same replica less
  than an interval ago may not be in the gauge yet: it is counted, and a refusal that rests on it
  waits for the gauge's next refresh and checks again.
- **Leak**: after a failed load, used memory must come back within ``LEAK_FLOOR`` (64 MiB of a
  GPU's, 256 MiB of the host's) or 10 % of the footprint, whichever is larger, of the reading before
  the load, once the gauge refreshed; if not, ``after_load`` names the leak and the fleet fences the
  replica off for the rest of the promotion.
- **No metrics** (no URL, an endpoint that does not answer, no memory gauge): nothing is checked
  there, and a note says so -- never a silent pass.

What it found (``findings``: headroom_findings.py ``Findings``; ``to_dict``) goes into the
promotion's result (``result.headroom``); ``version_tags()`` is what the record stage writes to the
registry (``footprints()``, as tags).  Every
reading is kept as a ``Sample`` (the newest ``SAMPLES``), and each load, refusal and leak as an
``Event``, on one clock (seconds since the guard was made): the record stage draws them
(pipelines/promote/plots.py).  Cost: one scrape per replica per load (one
made less than an interval ago is reused); the registry is asked once per version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.core.changes import Change
from pipelines.core.check import PRIVATE_SUFFIX, LoadRefused, Place
from pipelines.core.environment import MEMORY_MARGIN
from pipelines.core.plan import config_facts
from pipelines.core.ports import RegistryReader
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import Fleet
from pipelines.guards.headroom_findings import SAMPLES, Event, Findings, Footprint
from pipelines.triton.gauges import (
    HOST_USED,
    Gauges,
    Placement,
    Read,
    Readings,
    Sample,
    placement,
    read_metrics,
)
from registry.errors import MlregError, UsageError

REFUSED = "no-headroom"  # the refusal's status (a LoadRefused: a replica a fleet policy may skip)
FOOTPRINT_TAG = "memory_footprint_bytes"  # version tags: what a version adds where it loads
FOOTPRINT_KIND_TAG = "memory_footprint_kind"  # "gpu" (summed over the GPUs) or "host"
METRICS_INTERVAL = 2.0  # seconds: Triton's --metrics-interval-ms default (2000)
# bytes a failed load may leave behind: the gauge's noise (the host's counts the whole machine) ...
LEAK_FLOOR = {"gpu": 64 * 2**20, "host": 256 * 2**20}
LEAK_SHARE = 0.10  # ... or this share of the footprint (an allocator's slack), whichever is larger
MIB = 2**20
NO_METRICS = "no metrics URL for it (mlreg.toml names them with the roll-out keys metrics_port or metrics)"

Known = Callable[[str, str], "Footprint | None"]  # (model, version) -> its recorded footprint
Held = Callable[[str, str], Sequence[str]]  # (url, model) -> the versions READY there
Recreates = Callable[[Change], bool] | Collection[str]  # a change that re-creates the serving versions


def footprint_of(model: str, version: str, tags: Mapping[str, str]) -> Footprint | None:
    """The footprint the version tags record (None: none, or one that does not read as bytes)."""
    size, kind = tags.get(FOOTPRINT_TAG, ""), tags.get(FOOTPRINT_KIND_TAG, "")
    if not size.isdigit() or kind not in ("gpu", "host"):
        return None
    return Footprint(model, version, int(size), kind)


def registry_footprints(registry: RegistryReader) -> Known:
    """``known`` from the registry's version tags; a registry that does not answer: unknown."""

    def known(model: str, version: str) -> Footprint | None:
        try:
            return footprint_of(model, version, registry.version_tags(model, version))
        except MlregError:
            return None

    return known


def replica_versions(fleet: Fleet) -> Held:
    """``held``: the fleet's view, which keeps what a load kept serving beside what it waited for
    (after the canary gate's load of the candidate, the serving version it kept is in it), so no
    version is counted as new -- measured or counted twice -- because the view forgot it."""
    return fleet.ready


def label(model: str, versions: Sequence[str]) -> str:
    return f"{model.removesuffix(PRIVATE_SUFFIX)} v{','.join(versions)}"


# -- the guard ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ask:
    """One load's question on one replica."""

    url: str
    model: str  # as loaded (a quality gate's private copy included)
    new: tuple[str, ...]  # the versions it adds
    serving: tuple[str, ...]  # the serving versions it re-creates (``recreates``)
    where: Placement
    began: float  # perf_counter() when the check began

    @property
    def name(self) -> str:
        """The registered model (a quality gate's private copy is its model's)."""
        return self.model.removesuffix(PRIVATE_SUFFIX)

    @property
    def label(self) -> str:
        return label(self.model, self.new or self.serving)

    @property
    def source(self) -> str:
        return self.where.source


@dataclass
class _Load:
    """A load under way on one replica: what ``after_load`` needs."""

    ask: _Ask
    used: float  # the used gauge before it (summed over the GPUs, or the host's)
    known: float  # bytes its new versions are known to add
    pending: dict[str, float]  # what it adds per device, until the gauge shows it
    measure: str = ""  # the version whose footprint it measures


@dataclass
class Headroom:
    """The fleet's ``LoadGuard``: memory headroom before each load, leaks after a failed one."""

    metrics_url: Callable[[str], str]  # replica -> its metrics URL ("": unknown)
    margin: float = 1.2
    known: Known = lambda model, version: None
    held: Held = lambda url, model: ()
    recreates: Recreates = frozenset()
    interval: float = 0.0  # seconds between the gauges' refreshes (0: METRICS_INTERVAL)
    read: Read = read_metrics
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self.interval = self.interval or METRICS_INTERVAL
        self._lock = threading.Lock()
        self._footprints: dict[tuple[str, str], Footprint | None] = {}
        self._measuring: dict[tuple[str, str], str] = {}  # (model, version) -> the replica measuring
        self._loads: dict[tuple[str, str], _Load] = {}  # (url, model as loaded) -> the load under way
        clock = time.monotonic()  # the samples' and the events' zero
        self.findings = Findings(clock)
        self._readings = Readings(
            self.metrics_url,
            self.read,
            self.interval,
            self.sleep,
            skip=self.findings.skip,
            kept=SAMPLES,
            start=clock,
        )
        # what it found, as the findings hold them (the same lists)
        self.checks, self.refused = self.findings.checks, self.findings.refused
        self.leaks, self.measured = self.findings.leaks, self.findings.measured

    # -- LoadGuard --------------------------------------------------------------------------------

    def before_load(self, url: str, change: Change) -> None:
        if change.config is None or config_facts(change.config).is_ensemble:
            return  # an ensemble holds no memory of its own
        if not self.metrics_url(url):
            self.findings.skip(url, NO_METRICS)
            return
        if self._readings.dead(url):
            return  # its metrics could not be read: noted once
        began = time.perf_counter()
        new, serving = self._versions(url, change)
        if not new and not serving:
            return  # nothing is allocated: a retire, a re-load of what serves
        gauges = self._readings.latest(url, f"before load of {label(change.model, new or serving)}")
        if gauges is None:
            return
        where = placement(change.config, gauges)
        if where.kind == "host" and gauges.host is None:
            self.findings.skip(url, f"it exports no {HOST_USED}")
            return
        ask = _Ask(url, change.model, new, serving, where, began)
        load = self._check(ask, gauges)
        self.findings.event(url, f"load of {ask.label}")
        with self._lock:
            self._loads[(url, change.model)] = load

    def after_load(self, url: str, change: Change, error: MlregError | None) -> str:
        with self._lock:
            load = self._loads.pop((url, change.model), None)
        self._readings.forget(url)  # a load happened: no earlier scrape stands for now
        if load is None:
            return ""
        if error is not None:
            self.findings.event(url, f"failed load of {load.ask.label}")
            return self._leaked(load)
        if load.measure:
            self._measure(load)
        elif load.pending:
            self._readings.loaded(url, load.pending)
        return ""

    # -- what a promotion reports (the findings, and the gauge samples) -------------------------

    def footprints(self) -> list[tuple[str, str, int, str]]:
        """(model, version, bytes, kind) of every footprint this promotion measured."""
        return self.findings.footprints()

    def version_tags(self) -> list[tuple[str, str, dict[str, str]]]:
        """(model, version, tags) for each footprint measured: what the record stage writes to the
        registry, so later loads are checked without measuring (``registry_footprints`` reads it)."""
        return [
            (model, version, {FOOTPRINT_TAG: str(size), FOOTPRINT_KIND_TAG: kind})
            for model, version, size, kind in self.footprints()
        ]

    @property
    def notes(self) -> list[str]:
        return self.findings.notes

    def summary(self) -> str:
        return self.findings.summary()

    def to_dict(self) -> dict[str, Any]:
        settings = {"margin": self.margin, "interval_seconds": self.interval}
        return settings | self.findings.to_dict([s.to_dict() for s in self.samples()])

    def samples(self) -> list[Sample]:
        """Every gauge reading kept, oldest first (the newest ``SAMPLES``)."""
        return self._readings.samples()

    def events(self) -> list[Event]:
        return self.findings.events()

    # -- before the load --------------------------------------------------------------------------

    def _versions(self, url: str, change: Change) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The versions the load adds, and the serving ones it re-creates (``recreates``)."""
        assert change.config is not None
        wanted = config_facts(change.config).versions or change.versions
        held = set(self.held(url, change.model))
        if isinstance(self.recreates, Collection):
            recreated = change.model in self.recreates
        else:
            recreated = self.recreates(change)
        new = tuple(v for v in wanted if v not in held)
        return new, tuple(v for v in wanted if v in held) if recreated else ()

    def _check(self, ask: _Ask, gauges: Gauges) -> _Load:
        sizes = {v: self._footprint(ask, v) for v in ask.new + ask.serving}
        measure = self._claim(ask, [v for v in ask.new if sizes[v] is None])
        for version in (v for v in ask.serving if sizes[v] is None):
            self.findings.note(
                f"{ask.name} v{version} is re-created at {ask.url} with no footprint recorded: not counted"
            )
        known = sum(sizes[v] or 0.0 for v in ask.new)
        needed = known + sum(sizes[v] or 0.0 for v in ask.serving)  # re-created: beside the used copy
        devices = ask.where.devices
        gauges = self._judge(ask, gauges, dict.fromkeys(devices, needed / len(devices)))
        added = known / len(devices)  # until the gauge shows it; named GPUs: on any of them
        pending = dict.fromkeys(tuple(gauges.gpus) if ask.where.named else devices, added) if known else {}
        return _Load(ask, gauges.used(ask.where.kind), known, pending, measure)

    def _judge(self, ask: _Ask, gauges: Gauges, share: dict[str, float]) -> Gauges:
        """Refuse unless each device has its share x margin free; a refusal that rests on a load
        the gauge may not show yet waits for the gauge's refresh and looks again."""
        short = self._short(ask, gauges, share)
        recent = [done for done, _ in self._readings.unseen(ask.url, gauges)]
        if short and recent:
            self.sleep(max(0.0, max(recent) + self.interval - time.monotonic()))
            self._readings.shown(ask.url, max(recent))  # the gauge has refreshed since they returned
            gauges = self._readings.scrape(ask.url, f"before load of {ask.label}") or gauges
            short = self._short(ask, gauges, share)
        self._record(ask, gauges, share, ok=not short)
        if short:
            self._refuse(ask, short)
        return gauges

    def _short(self, ask: _Ask, gauges: Gauges, share: dict[str, float]) -> list[tuple[str, float, float]]:
        """(device, free, needed) of each device short of memory."""
        pending = self._readings.unseen_bytes(ask.url, gauges)
        found = []
        for device in ask.where.devices:
            free, needed = gauges.free(device) - pending.get(device, 0.0), share[device] * self.margin
            if free < needed:
                found.append((device, free, needed))
        return found

    def _refuse(self, ask: _Ask, short: list[tuple[str, float, float]]) -> None:
        device, free, needed = short[0]
        where = "host memory" if device == "host" else f"GPU {device}"
        versions = ",".join(ask.new) or ",".join(ask.serving)
        recreated = f" (v{','.join(ask.serving)} re-created beside it)" if ask.serving else ""
        named = " (the config names GPUs by index; the least free are checked)" if ask.where.named else ""
        message = (
            f"{ask.url}: not enough memory to load {ask.name} v{versions}{recreated} on {where}: "
            f"{free / MIB:,.0f} MiB free, {needed / MIB:,.0f} MiB needed "
            f"({needed / self.margin / MIB:,.0f} MiB footprint x memory_margin {self.margin:g}){named}"
        )
        self.findings.refusal(ask.url, message, ask.label)
        raise LoadRefused(
            message,
            fix=f"unload a model {ask.url} does not need, lower memory_margin in mlreg.toml (now "
            f"{self.margin:g}) only if the recorded {FOOTPRINT_TAG} of {ask.name} is too high, or swap "
            f"sequentially (unload the serving {ask.name} there first: it stops serving there meanwhile); "
            "then promote again",
            model=ask.name,
            status=REFUSED,
        )

    def _record(self, ask: _Ask, gauges: Gauges, share: dict[str, float], ok: bool) -> None:
        pending = self._readings.unseen_bytes(ask.url, gauges)
        seconds = time.perf_counter() - ask.began
        rows = [
            {
                "replica": ask.url,
                "model": ask.name,
                "versions": list(ask.new),
                "recreated": list(ask.serving),
                "source": ask.source,
                "device": device,
                "free_bytes": int(gauges.free(device) - pending.get(device, 0.0)),
                "needed_bytes": int(share[device] * self.margin),
                "footprint_bytes": int(share[device]),
                "checked": share[device] > 0,
                "ok": ok,
                "seconds": seconds,
            }
            for device in ask.where.devices
        ]
        self.findings.checked(rows)

    def _footprint(self, ask: _Ask, version: str) -> float | None:
        """A version's footprint in bytes (None: unknown here); the registry asked once."""
        key = (ask.name, version)
        with self._lock:
            asked, found = key in self._footprints, self._footprints.get(key)
        if not asked:
            found = self.known(*key)
            with self._lock:
                found = self._footprints.setdefault(key, found)
        if found is not None and found.kind != ask.where.kind:
            self.findings.note(
                f"{ask.name} v{version}: its footprint was measured in {found.kind} memory and "
                f"{ask.url} places it in {ask.where.kind} memory: not counted there"
            )
            return None
        return None if found is None else float(found.bytes)

    def _claim(self, ask: _Ask, unknown: list[str]) -> str:
        """The one unknown version this load measures ("": none; another replica is at it, or
        several load at once)."""
        if not unknown:
            return ""
        versions = ",".join(unknown)
        if len(unknown) == 1:
            with self._lock:
                mine = self._measuring.setdefault((ask.name, versions), ask.url) == ask.url
            if mine:
                self.findings.skip(
                    ask.url, f"{ask.name} v{versions} has no footprint recorded yet (measured there)"
                )
                return versions
        self.findings.skip(ask.url, f"{ask.name} v{versions} has no footprint recorded yet")
        return ""

    # -- after the load ---------------------------------------------------------------------------

    def _measure(self, load: _Load) -> None:
        ask, version = load.ask, load.measure
        after = self._readings.poll(
            ask.url, ask.where.kind, lambda first, now: now != first, f"after load of {ask.label}"
        )
        if after is None:
            with self._lock:
                self._measuring.pop((ask.name, version), None)  # another replica may measure it
            return
        delta, note = after - load.used - load.known, ""
        if delta <= 0:
            note = (
                f"{ask.source} moved by {delta / MIB:+,.0f} MiB around the load at {ask.url} (other work "
                "there, or nothing allocated): recorded as 0"
            )
            self.findings.note(f"{ask.name} v{version}: {note}")
        found = Footprint(ask.name, version, max(0, int(delta)), ask.where.kind, ask.url, note)
        with self._lock:
            self._footprints[(ask.name, version)] = found
        self.findings.footprint(found)

    def _leaked(self, load: _Load) -> str:
        """After a failed load: "" when used memory came back, else why the replica is fenced off."""
        ask, bound = load.ask, max(LEAK_FLOOR[load.ask.where.kind], LEAK_SHARE * load.known)
        back = self._readings.poll(
            ask.url,
            ask.where.kind,
            lambda first, now: now != first and now - load.used <= bound,
            f"leak check after {ask.label}",
        )
        if back is None or back - load.used <= bound:
            return ""
        leaked = back - load.used
        leak = {
            "replica": ask.url,
            "model": ask.name,
            "versions": list(ask.new),
            "source": ask.source,
            "leaked_bytes": int(leaked),
            "bound_bytes": int(bound),
        }
        self.findings.leak(ask.url, leak, f"leak of {leaked / MIB:,.0f} MiB after {ask.label}")
        return f"leaked {leaked / MIB:,.0f} MiB after the failed load of {ask.label}; restart it"


# -- the seam (pipelines/core/check.py): this guard as the settings loader reads it ---------------


@dataclass(frozen=True)
class HeadroomGuard:
    """Memory headroom before each load; its setting: ``memory_margin`` (a load needs the version's
    measured footprint x margin free on the replica)."""

    name: str = "headroom"
    field: str = "memory_margin"
    owns: frozenset[str] = frozenset({"memory_margin"})
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> float:
        value = raw.get("memory_margin", MEMORY_MARGIN)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 1.0 <= value < float("inf"):
            raise UsageError(
                f"{place.where}: memory_margin must be a number of at least 1, not {value!r}",
                fix=f"write memory_margin = {MEMORY_MARGIN:g} (a number, no quotes) in that section",
            )
        return float(value)

    def load_guard(self, ctx: FleetContext) -> Headroom:
        """Memory headroom before each load and leaks after a failed one, on the environment's
        metrics URLs and margin; footprints known from the registry's version tags; what it finds
        is the promotion's ``result.headroom``."""
        known, held = registry_footprints(ctx.registry.models), replica_versions(ctx.fleet)
        guard = Headroom(ctx.env.metrics_url, ctx.env.memory_margin, known=known, held=held)
        ctx.result.headroom = guard
        return guard


GUARD = HeadroomGuard()
