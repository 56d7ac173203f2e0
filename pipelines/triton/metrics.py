"""Triton's own metrics (``:8002/metrics``, Prometheus text): per model and version, the request
counters a bake compares.  No Prometheus server needed: each replica is scraped directly.

A scrape names its real cause: an endpoint that is off (nothing listens), one that answered an
HTTP error, closed the connection without an answer, did not answer in time, or answered 200 with
something that is not Triton's metrics (no ``nv_`` metric, or more than ``MAX_BODY`` bytes) -- each
with its own fix; never "start tritonserver with metrics on" for an endpoint that is on.

A counter a bake reads must be a count: a value that is not a number refuses the scrape, and
``faults`` names a NaN, an infinite or negative value, or one that went down between two scrapes
(the server restarted) — comparisons with NaN are all false, so a NaN would otherwise pass every
threshold.

``DERIVED`` is the one table of the metrics a bake's checks name (``policy.Check``): each derives a
value from the old and the new version's counters over the bake window; adding a metric is one
entry there."""

from __future__ import annotations

import http.client
import itertools
import math
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields

from registry.errors import PromotionError

LINE = re.compile(
    r"^(nv_inference_(?:request_success|request_failure|request_duration_us|queue_duration_us|"
    r"compute_infer_duration_us))\{([^}]*)\}\s+(\S+)"
)
# the Counters field each of Triton's counters adds to
FIELD = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_request_duration_us": "duration_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
}
METRIC = {name: metric for metric, name in FIELD.items()}
QUEUE_FLOOR_US = 1000.0  # queue_ratio compares against at least 1 ms: a few us either way is noise
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
TRITON = re.compile(r"^(?:# (?:HELP|TYPE) )?nv_\w+", re.MULTILINE)  # a metric only Triton exports
MAX_BODY = 32 * 1024 * 1024  # Triton's metrics of a large fleet of models stay far below this
Key = tuple[str, str]  # (model, version)


@dataclass
class Counters:
    success: float = 0.0
    failure: float = 0.0
    duration_us: float = 0.0  # end to end, per request summed
    queue_us: float = 0.0  # waiting in the scheduler's queue
    compute_us: float = 0.0  # the model's own inference time
    # mlreg's own requests during a bake (pipelines/rollout/probes.py), not Triton's: 2.51 does not
    # count a python model's error responses in nv_inference_request_failure
    probe_ok: float = 0.0
    probe_failed: float = 0.0

    @property
    def probes(self) -> float:
        return self.probe_ok + self.probe_failed

    @property
    def probe_failure_ratio(self) -> float:
        return _per(self.probe_failed, self.probes)

    @property
    def requests(self) -> float:
        return self.success + self.failure

    @property
    def failure_ratio(self) -> float:
        return _per(self.failure, self.requests)

    @property
    def mean_latency_us(self) -> float:
        return _per(self.duration_us, self.requests)

    @property
    def mean_queue_us(self) -> float:
        return _per(self.queue_us, self.requests)

    @property
    def mean_compute_us(self) -> float:
        return _per(self.compute_us, self.requests)

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def _per(total: float, count: float) -> float:
    """``total`` per one of ``count`` (0 when there is none)."""
    return total / count if count else 0.0


Snapshot = dict[Key, Counters]


def parse(text: str) -> Snapshot:
    """The request counters of every (model, version); failures summed over ``reason``."""
    found: Snapshot = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        labels = dict(LABEL.findall(match.group(2)))
        key = (labels.get("model", ""), labels.get("version", ""))
        counters = found.setdefault(key, Counters())
        name = match.group(1)
        try:
            value = float(match.group(3))
        except ValueError:
            metric = f"{name}{{{match.group(2)}}}"
            raise ValueError(f"{metric} = {match.group(3)!r} is not a number") from None
        attribute = FIELD[name]
        setattr(counters, attribute, getattr(counters, attribute) + value)
    return found


def scrape(url: str, timeout: float = 5.0) -> Snapshot:
    """Triton's counters at ``url``; PromotionError naming the real cause of a failed read
    (``status``: "off", "http-error", "closed", "timeout", "unreachable" or "not-triton")."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        what = f"cannot read Triton's metrics at {url}: it answered HTTP {exc.code} ({exc.reason})"
        raise unreadable(url, "http-error", what) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        status, what = _failure(exc, timeout)
        raise unreadable(url, status, f"cannot read Triton's metrics at {url}: it {what}") from exc
    return parse_answer(url, body)


def parse_answer(url: str, body: bytes) -> Snapshot:
    """The counters of ``body``, the 200 answer of ``url``; PromotionError when it is not Triton's
    metrics (too large, no ``nv_`` metric at all) or a counter is not a number."""
    if len(body) > MAX_BODY:
        what = f"answered more than {MAX_BODY // 2**20} MiB"
        raise unreadable(url, "not-triton", f"{url} does not answer Triton's metrics: it {what}")
    text = body.decode("utf-8", "replace")
    if not TRITON.search(text):
        shown = f"{len(body)} bytes, none of them an nv_ metric" if body else "an empty body"
        raise unreadable(
            url, "not-triton", f"{url} does not answer Triton's metrics: it answered 200 with {shown}"
        )
    try:
        return parse(text)
    except ValueError as exc:
        raise unreadable(url, "not-triton", f"Triton's metrics at {url} are not counts: {exc}") from exc


def _failure(exc: BaseException, timeout: float) -> tuple[str, str]:
    """(status, what happened) of a read that got no HTTP answer."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "off", "refused the connection (nothing listens there)"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timeout", f"did not answer within {timeout:g} s"
    if isinstance(reason, ConnectionError | http.client.HTTPException):
        return "closed", f"closed the connection without a complete answer ({type(reason).__name__})"
    if isinstance(reason, socket.gaierror):
        return "unreachable", f"names a host that cannot be resolved ({reason})"
    return "unreachable", f"cannot be reached ({reason})"


FIXES = {
    "off": "start tritonserver with metrics on (--allow-metrics=true) and set metrics_port or metrics in "
    "the environment's mlreg.toml section",
    "http-error": "the metrics endpoint is on but failing: read that replica's tritonserver log, restart "
    "the replica if it persists",
    "closed": "the metrics endpoint took the connection and dropped it (a replica restarting or "
    "overloaded, or a proxy in between): check that replica, then try again",
    "timeout": "the replica is hung or overloaded: check it ('mlreg status'), then try again",
    "unreachable": "check the metrics URL (metrics_port or metrics in the environment's mlreg.toml "
    "section) and the network to it",
    "not-triton": "point metrics_port or metrics (the environment's mlreg.toml section) at Triton's own "
    "metrics endpoint (:8002/metrics); this URL answers something else",
}


def unreadable(url: str, status: str, message: str) -> PromotionError:
    return PromotionError(message, fix=FIXES[status], status=status, url=url)


def total(snapshots: list[Snapshot], model: str, versions: set[str]) -> Counters:
    out = Counters()
    for snapshot in snapshots:
        for (name, version), counters in snapshot.items():
            if name == model and version in versions:
                out = out + counters
    return out


def window(before: Snapshot, after: Snapshot) -> Snapshot:
    """What happened between two scrapes of one replica (a restarted server's counters restart;
    the bake refuses that, through ``faults``, for the counters it judges)."""
    out: Snapshot = {}
    for key, now in after.items():
        delta = now - before.get(key, Counters())
        out[key] = now if delta.requests < 0 else delta
    return out


def faults(model: str, versions: Collection[str], *scrapes: Snapshot) -> list[str]:
    """Why one replica's successive ``scrapes`` cannot judge ``model``'s ``versions``: a counter
    that is not a finite count, or one that went down (a counter reset: the replica restarted)."""
    found = []
    keys = sorted({k for s in scrapes for k in s if k[0] == model and k[1] in versions})
    for key in keys:
        for name in FIELD.values():  # Triton's counters (a probe count is mlreg's own)
            values = [getattr(s[key], name) for s in scrapes if key in s]
            fault = _counter_fault(values)
            if fault:
                found.append(f'{METRIC[name]}{{model="{key[0]}",version="{key[1]}"}} {fault}')
    return found


def _counter_fault(values: list[float]) -> str:
    """Why one counter's successive values are not a count ("" when they are)."""
    bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
    if bad:
        return f"is {bad[0]}, not a count"
    drops = [(a, b) for a, b in itertools.pairwise(values) if b < a]
    if drops:
        old, new = drops[0]
        return f"went down from {old:.0f} to {new:.0f} (a counter reset: the replica restarted)"
    return ""


def summary(found: list[str], most: int = 2) -> str:
    """``found`` once each, the first ``most`` of them, and how many more."""
    unique = list(dict.fromkeys(found))
    more = f" (and {len(unique) - most} more)" if len(unique) > most else ""
    return "; ".join(unique[:most]) + more


# -- the metrics a bake's checks name ----------------------------------------------------------------


@dataclass(frozen=True)
class Derived:
    """A named metric of the bake window: ``value(old, new)`` (None: it cannot be judged, e.g. no
    old request to compare with) and the words that explain a value."""

    name: str
    about: str
    value: Callable[[Counters, Counters], float | None]
    detail: Callable[[Counters, Counters], str]


def _ratio(new: float, old: float) -> float:
    return new / max(old, 1e-9)


def _queue_ratio(old: Counters, new: Counters) -> float:
    return _ratio(new.mean_queue_us, max(old.mean_queue_us, QUEUE_FLOOR_US))


DERIVED: dict[str, Derived] = {
    d.name: d
    for d in (
        Derived(
            "requests",
            "requests the new version answered during the bake",
            lambda old, new: new.requests,
            lambda old, new: f"the new version answered {new.requests:.0f} request(s) during the bake",
        ),
        Derived(
            "failure_ratio",
            "the new version's failure ratio above the old version's",
            lambda old, new: new.failure_ratio - old.failure_ratio,
            lambda old, new: (
                f"failure ratio {new.failure_ratio:.3f} ({new.failure:.0f} of {new.requests:.0f} requests) "
                f"against {old.failure_ratio:.3f} for the old version ({old.failure:.0f} of "
                f"{old.requests:.0f})"
            ),
        ),
        Derived(
            "latency_ratio",
            "mean request latency, new / old",
            lambda old, new: _ratio(new.mean_latency_us, old.mean_latency_us) if old.requests else None,
            lambda old, new: (
                f"mean latency {new.mean_latency_us:.0f} us against {old.mean_latency_us:.0f} us for the "
                f"old version (x{_ratio(new.mean_latency_us, old.mean_latency_us):.2f})"
            ),
        ),
        Derived(
            "queue_ratio",
            "mean queue time per request, new / old (the old one counted as at least 1 ms)",
            lambda old, new: _queue_ratio(old, new) if old.requests else None,
            lambda old, new: (
                f"mean queue time {new.mean_queue_us:.0f} us against {old.mean_queue_us:.0f} us for the "
                f"old version (x{_queue_ratio(old, new):.2f}, the old one counted as at least 1 ms)"
            ),
        ),
        Derived(
            "probe_failure_ratio",
            "the failure ratio of mlreg's own requests to the new version above the old version's",
            lambda old, new: new.probe_failure_ratio - old.probe_failure_ratio if new.probes else None,
            lambda old, new: (
                f"mlreg's own requests failed {new.probe_failed:.0f} of {new.probes:.0f} times on the new "
                f"version ({new.probe_failure_ratio:.3f}) against {old.probe_failed:.0f} of "
                f"{old.probes:.0f} on the old ({old.probe_failure_ratio:.3f})"
            ),
        ),
    )
}
