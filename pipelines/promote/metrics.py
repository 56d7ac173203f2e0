"""Triton's own metrics (``:8002/metrics``, Prometheus text): per model and version, the request
counters a bake compares.  No Prometheus server needed: each replica is scraped directly.

A counter a bake reads must be a count: a value that is not a number refuses the scrape, and
``faults`` names a NaN, an infinite or negative value, or one that went down between two scrapes
(the server restarted) — comparisons with NaN are all false, so a NaN would otherwise pass every
threshold."""

from __future__ import annotations

import itertools
import math
import re
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, fields

from registry.errors import PromotionError

LINE = re.compile(r"^(nv_inference_request_(?:success|failure|duration_us))\{([^}]*)\}\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Key = tuple[str, str]  # (model, version)


@dataclass
class Counters:
    success: float = 0.0
    failure: float = 0.0
    duration_us: float = 0.0

    @property
    def requests(self) -> float:
        return self.success + self.failure

    @property
    def failure_ratio(self) -> float:
        return self.failure / self.requests if self.requests else 0.0

    @property
    def mean_latency_us(self) -> float:
        return self.duration_us / self.requests if self.requests else 0.0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.success + other.success, self.failure + other.failure, self.duration_us + other.duration_us
        )

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.success - other.success, self.failure - other.failure, self.duration_us - other.duration_us
        )


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
        if name.endswith("success"):
            counters.success += value
        elif name.endswith("failure"):
            counters.failure += value
        else:
            counters.duration_us += value
    return found


def scrape(url: str, timeout: float = 5.0) -> Snapshot:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse(response.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError) as exc:
        raise PromotionError(
            f"cannot read Triton's metrics at {url}: {exc}",
            fix="start tritonserver with metrics on (--allow-metrics=true) and set metrics_port "
            "or metrics in the environment's mlreg.toml section",
        ) from exc
    except ValueError as exc:
        raise PromotionError(
            f"Triton's metrics at {url} are not counts: {exc}",
            fix=f"point metrics_port or metrics (environment's mlreg.toml section) at Triton's "
            f"metrics; {url} answers something else",
        ) from exc


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
        for name in (f.name for f in fields(Counters)):
            values = [getattr(s[key], name) for s in scrapes if key in s]
            metric = f'nv_inference_request_{name}{{model="{key[0]}",version="{key[1]}"}}'
            bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
            if bad:
                found.append(f"{metric} is {bad[0]}, not a count")
            elif drops := [(a, b) for a, b in itertools.pairwise(values) if b < a]:
                old, new = drops[0]
                found.append(
                    f"{metric} went down from {old:.0f} to {new:.0f} (a counter reset: the replica restarted)"
                )
    return found


def summary(found: list[str], most: int = 2) -> str:
    """``found`` once each, the first ``most`` of them, and how many more."""
    unique = list(dict.fromkeys(found))
    more = f" (and {len(unique) - most} more)" if len(unique) > most else ""
    return "; ".join(unique[:most]) + more
