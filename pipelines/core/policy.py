"""The fleet roll-out policy of an environment, and the pure rules over it: the waves a fleet
moves in and the verdict of a bake.  No I/O here (``pipelines/rollout/staged.py`` drives it).

An environment of ``mlreg.toml`` may declare a policy:

[environments.production]
store = "s3://models/production"
discover = "dns:triton-headless.models.svc.cluster.local:8001"   # or targets = [...]
canary = 1              # replicas (an integer) or a share ("10%")
waves = [50, 100]       # cumulative percent of the fleet after the canary
bake_seconds = 60       # after each wave but the last: the new version's metrics are judged
max_parallel = 4        # replicas changed at once within a wave
max_unavailable = 0     # unreachable replicas tolerated (skipped); more refuse the promotion
max_failure_ratio = 0.01  # new failure ratio may exceed the old one by at most this
max_latency_ratio = 2.0   # new mean latency at most this times the old one
min_requests = 10       # the new version must have answered this many requests in a bake
metrics_port = 8002     # Triton's metrics port on every replica (or metrics = {target = url})
probe_rate = 10         # mlreg's own requests per second to each side during a bake (0: none)

The bake's thresholds are a list of checks over the named metrics of ``metrics.DERIVED`` (Flagger's
metric checks are the model); the three flat keys above are read into the same list:

[environments.production.bake]
checks = [
  { metric = "requests", min = 10 },
  { metric = "failure_ratio", max = 0.01 },
  { metric = "latency_ratio", max = 2.0 },
  { metric = "queue_ratio", max = 3.0 },
]

A key neither the environment nor the policy reads is refused, naming the closest valid one (a typo
such as ``bake_second`` would otherwise silently remove the bake).  What depends on the resolved
fleet (the canary must leave a replica to compare with) is ``check_fleet``, called once the
targets are known.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from pipelines.triton import metrics
from registry.errors import UsageError

KEYS = {
    "canary",
    "waves",
    "bake_seconds",
    "max_parallel",
    "max_unavailable",
    "max_failure_ratio",
    "max_latency_ratio",
    "min_requests",
    "metrics_port",
    "metrics",
    "bake",
    "probe_rate",
}
FLAT_CHECKS = {  # the flat key -> (metric, bound): read into the same list as [bake] checks
    "min_requests": ("requests", "min"),
    "max_failure_ratio": ("failure_ratio", "max"),
    "max_latency_ratio": ("latency_ratio", "max"),
}
DAY = 86400  # the longest bake_seconds: a longer one is a typo, or a promotion nobody waits for


@dataclass(frozen=True)
class Check:
    """One threshold of a bake: ``metric`` (a name of ``metrics.DERIVED``) within [min, max]."""

    metric: str
    min: float | None = None
    max: float | None = None
    key: str = ""  # the flat mlreg.toml key it was read from (max_latency_ratio), for messages

    def describe(self) -> str:
        parts = [f"{self.metric} >= {self.min:g}"] if self.min is not None else []
        parts += [f"{self.metric} <= {self.max:g}"] if self.max is not None else []
        return " and ".join(parts)

    def bound(self) -> str:
        """The threshold as the user wrote it."""
        if self.key:
            value = self.min if self.min is not None else self.max
            return f"{self.key} = {value:g}"
        return self.describe()

    def passes(self, value: float) -> bool:
        return not (
            (self.min is not None and value < self.min) or (self.max is not None and value > self.max)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "min": self.min, "max": self.max}


DEFAULT_CHECKS = (
    Check("requests", min=10, key="min_requests"),
    Check("failure_ratio", max=0.01, key="max_failure_ratio"),
    Check("latency_ratio", max=2.0, key="max_latency_ratio"),
    Check("probe_failure_ratio", max=0.01),  # mlreg's own requests: what Triton's counters miss
)


@dataclass(frozen=True)
class Policy:
    canary: int | float = 1  # int: replicas; float: percent of the fleet
    waves: tuple[float, ...] = (100.0,)
    bake_seconds: float = 0.0
    max_parallel: int = 1
    max_unavailable: int = 0
    checks: tuple[Check, ...] = DEFAULT_CHECKS  # the bake's thresholds, judged in this order
    metrics_port: int = 8002
    metrics: tuple[tuple[str, str], ...] = ()  # target -> metrics URL
    probe_rate: float = 10.0  # mlreg's own requests per second to each side during a bake

    def metrics_url(self, target: str) -> str:
        explicit = dict(self.metrics).get(target)
        if explicit:
            return explicit
        host = target.rsplit(":", 1)[0]
        return f"http://{host}:{self.metrics_port}/metrics"


# -- parsing -----------------------------------------------------------------------------------


def parse_policy(where: str, raw: Mapping[str, Any]) -> Policy | None:
    """The rollout policy of one environment section (None when it declares none)."""
    if not KEYS & set(raw):
        return None
    fix = (
        "write e.g. canary = 1, waves = [25, 100], bake_seconds = 60, max_parallel = 4, "
        "max_unavailable = 0, max_failure_ratio = 0.01, max_latency_ratio = 2.0"
    )
    try:
        policy = Policy(
            canary=_canary(raw.get("canary", 1)),
            waves=tuple(_number(w, "waves") for w in _list(raw.get("waves", [100]), "waves")),
            bake_seconds=_number(raw.get("bake_seconds", 0), "bake_seconds"),
            max_parallel=_integer(raw.get("max_parallel", 1), "max_parallel", 1),
            max_unavailable=_integer(raw.get("max_unavailable", 0), "max_unavailable", 0),
            checks=_checks(raw),
            metrics_port=_port(raw.get("metrics_port", 8002)),
            metrics=tuple(sorted(_table(raw.get("metrics", {})).items())),
            probe_rate=_number(raw.get("probe_rate", 10), "probe_rate"),
        )
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", fix=fix) from exc
    _check(policy, where, fix)
    return policy


def _check(policy: Policy, where: str, fix: str) -> None:
    waves = list(policy.waves)
    if not waves or waves != sorted(set(waves)) or waves[0] <= 0 or waves[-1] != 100:
        raise UsageError(
            f"{where}: waves = {waves}: percents must rise strictly and end at 100",
            fix="e.g. waves = [25, 100]",
        )
    for check in policy.checks:
        _check_bound(check, where, fix)
    if isinstance(policy.canary, float) and not 0 < policy.canary <= 100:
        raise UsageError(f"{where}: canary percent must be within 0..100", fix=fix)
    if not math.isfinite(policy.bake_seconds) or policy.bake_seconds > DAY:
        raise UsageError(
            f"{where}: bake_seconds = {policy.bake_seconds:g} must be finite and at most a day ({DAY})",
            fix="e.g. bake_seconds = 60 (seconds the new version serves before the next wave)",
        )


def _check_bound(check: Check, where: str, fix: str) -> None:
    """A failure ratio's max within 0..1; any other ratio's at least 1."""
    name = check.key or f"the {check.metric} check's max"
    failures = check.metric.endswith("failure_ratio")
    if failures and check.max is not None and not 0 <= check.max <= 1:
        raise UsageError(f"{where}: {name} must be within 0..1", fix=fix)
    if check.metric.endswith("_ratio") and not failures and (check.max or 1) < 1:
        raise UsageError(f"{where}: {name} must be >= 1 (1.5 = 50% slower allowed)", fix=fix)


def check_keys(where: str, raw: Mapping[str, Any], environment_keys: Collection[str]) -> None:
    """Refuse a key of an environment section that neither the environment (``environment_keys``)
    nor the roll-out policy reads, naming the closest valid key."""
    if not isinstance(raw, Mapping):
        return  # not a table: the environment's own reading says so
    valid = sorted(KEYS | set(environment_keys))
    unknown = [str(key) for key in raw if key not in valid]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, valid, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise UsageError(
        f"{where}: unknown key(s) {', '.join(hints)}",
        fix=f"rename or remove them; the valid keys are: {', '.join(valid)}",
    )


def check_fleet(policy: Policy, replicas: int, where: str) -> None:
    """The rules a policy can break only against the resolved fleet of ``replicas`` targets: the
    canary must leave a replica to compare with, and ``max_unavailable`` must not exceed the fleet."""
    if replicas < 1:
        raise UsageError(f"{where}: the fleet has no replica", fix="add targets, or check discover")
    if policy.max_unavailable > replicas:
        raise UsageError(
            f"{where}: max_unavailable = {policy.max_unavailable} is more than the fleet's "
            f"{replicas} replica(s)",
            fix=f"set max_unavailable = {replicas - 1} or less: at least one replica must serve",
        )
    canary = max(1, canary_count(policy, replicas))
    if canary >= replicas:
        share = f'"{policy.canary:g}%"' if isinstance(policy.canary, float) else str(policy.canary)
        raise UsageError(
            f"{where}: canary = {share} takes {canary} of the fleet's {replicas} replica(s): "
            "no replica left to compare with",
            fix="set canary = 1 (or a smaller share)"
            if replicas > 1
            else "add replicas, or remove the roll-out policy keys to deploy all at once",
        )


def _checks(raw: Mapping[str, Any]) -> tuple[Check, ...]:
    """The bake's checks: ``[bake] checks``, or the defaults with the flat keys applied."""
    flat = [key for key in FLAT_CHECKS if key in raw]
    bake = raw.get("bake")
    if bake is None:
        checks = []
        for default in DEFAULT_CHECKS:
            if default.key in raw:
                value = raw[default.key]
                number = (
                    float(_integer(value, default.key, 0))
                    if default.min is not None
                    else _number(value, default.key)
                )
                bound = "min" if default.min is not None else "max"
                checks.append(Check(default.metric, key=default.key, **{bound: number}))
            else:
                checks.append(default)
        return tuple(checks)
    if not isinstance(bake, Mapping) or set(bake) - {"checks"}:
        raise ValueError(
            f"bake must be a table holding only checks = [...], not {bake!r}"
            if not isinstance(bake, Mapping)
            else f"bake: unknown key(s) {', '.join(sorted(map(repr, set(bake) - {'checks'})))}; "
            "it holds only checks = [...]"
        )
    if flat:
        raise ValueError(f"{', '.join(flat)} and [bake] checks both set the bake's thresholds: keep one")
    return tuple(_check_entry(entry) for entry in _list(bake.get("checks", []), "bake.checks"))


def _check_entry(entry: object) -> Check:
    valid = ", ".join(sorted(metrics.DERIVED))
    if not isinstance(entry, Mapping) or set(entry) - {"metric", "min", "max"}:
        raise ValueError(f'a check is {{ metric = "NAME", min = X, max = Y }}, not {entry!r}')
    metric = entry.get("metric")
    if metric not in metrics.DERIVED:
        raise ValueError(f"unknown metric {metric!r} in a bake check; the metrics are: {valid}")
    if "min" not in entry and "max" not in entry:
        raise ValueError(f"the {metric} check needs min or max")
    low = _number(entry["min"], f"{metric} min") if "min" in entry else None
    high = _number(entry["max"], f"{metric} max") if "max" in entry else None
    if low is not None and high is not None and low > high:
        raise ValueError(
            f"the {metric} check's min = {low:g} is above its max = {high:g}: no value passes it"
        )
    return Check(str(metric), low, high)


def _canary(raw: object) -> int | float:
    if isinstance(raw, str) and raw.strip().endswith("%"):
        return _number(raw.strip()[:-1], "canary")
    return _integer(raw, 'canary (a count, or a percent such as "10%")', 1)


def _number(raw: object, name: str) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"{name} must be a number, not {raw!r}")
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {raw!r}") from None
    if math.isnan(value):  # TOML's nan: every comparison with it is false, so no check would fail
        raise ValueError(f"{name} = {raw!r} is not a number")
    if value < 0:
        raise ValueError(f"{name} must not be negative, not {raw!r}")
    return value


def _integer(raw: object, name: str, least: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {raw!r}")
    return raw


def _port(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
        raise ValueError(f"metrics_port must be a port within 1..65535, not {raw!r}")
    return raw


def _list(raw: object, name: str) -> list[object]:
    if not isinstance(raw, list):
        raise ValueError(f"{name} must be a list such as [25, 100], not {raw!r}")
    return raw


def _table(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError(f'metrics must be a table of target = "http://host:8002/metrics", not {raw!r}')
    return dict(raw)


# -- pure logic --------------------------------------------------------------------------------


def waves_of(targets: Sequence[str], policy: Policy) -> list[list[str]]:
    """The canary replicas, then each wave's newly moved replicas (cumulative percents)."""
    n = len(targets)
    if n == 0:
        return []
    bounds = [min(n, max(1, canary_count(policy, n)))]
    for percent in policy.waves:
        bound = min(n, math.ceil(n * percent / 100 - 1e-9))
        if bound > bounds[-1]:
            bounds.append(bound)
    if bounds[-1] != n:
        bounds.append(n)
    starts = [0, *bounds[:-1]]
    return [list(targets[a:b]) for a, b in zip(starts, bounds, strict=True)]


def canary_count(policy: Policy, replicas: int) -> int:
    """How many of ``replicas`` the canary asks for (a share rounds up)."""
    if isinstance(policy.canary, float):
        return math.ceil(replicas * policy.canary / 100)
    return policy.canary


@dataclass
class Verdict:
    ok: bool
    metric: str = ""
    detail: str = ""
    old: metrics.Counters = field(default_factory=metrics.Counters)
    new: metrics.Counters = field(default_factory=metrics.Counters)


def judge(old: metrics.Counters, new: metrics.Counters, policy: Policy) -> Verdict:
    """The new version against the one it replaces: each of the policy's checks in turn, the first
    that fails is the verdict (a check whose metric cannot be judged -- no old request to compare
    with -- is passed over)."""
    values = [getattr(c, f.name) for c in (old, new) for f in fields(c)]
    if not all(math.isfinite(v) and v >= 0 for v in values):  # NaN passes every comparison
        return Verdict(False, "counters", f"not counts: new {new}, old {old}", old, new)
    for check in policy.checks:
        derived = metrics.DERIVED[check.metric]
        value = derived.value(old, new)
        if value is not None and not check.passes(value):
            return Verdict(False, check.metric, f"{derived.detail(old, new)}; {check.bound()}", old, new)
    return Verdict(
        True, "", f"failure ratio {new.failure_ratio:.3f} over {new.requests:.0f} requests", old, new
    )
