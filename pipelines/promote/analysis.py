"""The bake's verdict asked from outside a promotion: what an Argo Rollouts ``web`` metric, an Argo
Rollouts or Kargo ``job`` metric (a verification) or a person asks of one environment's replicas.

It judges with the bake's own parts, never a copy of them: Triton's counters scraped from each
replica (``metrics.scrape``/``window``/``faults``), the environment's checks
(``policy.Policy.checks``, the defaults when it declares no roll-out policy), each check's metric
from ``metrics.DERIVED`` and the verdict from ``policy.judge``.  What the bake compares, a version
against the one it replaces, is read from what the replicas report: ``version`` (the candidate;
default the newest version any replica reports for the model) against every other version of
the model they report.  With one version serving, the checks that compare with an old version
(``latency_ratio``, ``queue_ratio``) cannot be judged and are passed over, as the bake does.

``window`` 0 judges the counters as they stand (each version's since it was loaded: Triton starts
a version's counters at its load); ``window`` N scrapes twice N seconds apart and judges what
happened in between (a counter that went down, a restart, fails the verdict as in the bake).
Nothing here changes anything: it only reads ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.promote import metrics
from pipelines.promote.environments import Environment
from pipelines.promote.policy import Check, Policy, judge
from registry.errors import MlregError, PromotionError, UsageError
from registry.settings import redact_uri

MAX_WINDOW_S = 300.0  # longer than any web metric's timeout: a window that long is a typo
Scrape = Callable[[str], metrics.Snapshot]


class NotServed(PromotionError):
    """No replica reports the model (or the version asked): nothing to judge (HTTP 404)."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    value: float | None  # None: cannot be judged now (no old version's request to compare with)
    min: float | None
    max: float | None
    threshold: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "min": self.min,
            "max": self.max,
            "threshold": self.threshold,
            "judged": self.value is not None,
            "ok": self.ok,
            "detail": self.detail,
        }


@dataclass
class Analysis:
    """One verdict: ``ok`` is ``policy.judge``'s; ``checks`` each of the environment's checks."""

    environment: str
    model: str
    version: str
    compared_with: list[str]
    replicas: list[str]
    window_s: float
    ok: bool
    failed_check: str
    detail: str
    checks: list[CheckResult] = field(default_factory=list)
    new: metrics.Counters = field(default_factory=metrics.Counters)

    def to_dict(self) -> dict[str, Any]:
        """Flat, ``successCondition``-friendly fields (``result.ok == true``,
        ``result.failure_ratio <= 0.01``) beside the per-check list."""
        return {
            "kind": "analysis",
            "environment": self.environment,
            "model": self.model,
            "version": self.version,
            "compared_with": self.compared_with,
            "ok": self.ok,
            "failed_check": self.failed_check,
            "detail": self.detail,
            "requests": self.new.requests,
            "failures": self.new.failure,
            "failure_ratio": self.new.failure_ratio,
            "mean_latency_ms": self.new.mean_latency_us / 1000,
            "mean_queue_ms": self.new.mean_queue_us / 1000,
            "checks": [c.to_dict() for c in self.checks],
            "window_seconds": self.window_s,
            "replicas": [redact_uri(r) for r in self.replicas],
        }


def check_window(window: float) -> float:
    if not 0 <= window <= MAX_WINDOW_S:
        raise UsageError(
            f"window {window:g} s is outside 0..{MAX_WINDOW_S:g} s",
            fix="pass 0 (the counters as they stand) or a few seconds (what happens meanwhile)",
        )
    return window


def analyse(
    env: Environment,
    targets: Sequence[str],
    model: str,
    version: str | None = None,
    window: float = 0.0,
    scrape: Scrape = metrics.scrape,
    sleep: Callable[[float], None] = time.sleep,
) -> Analysis:
    """The bake's checks for ``model`` on ``targets`` (the environment's replicas), now."""
    check_window(window)
    if not targets:
        raise PromotionError(f"environment '{env.name}' has no replica to judge", fix="check its targets")
    urls = {target: _metrics_url(env, target) for target in targets}
    before = _scrape_all(urls, scrape)
    scrapes: dict[str, tuple[metrics.Snapshot, ...]]
    if window:
        sleep(window)
        after = _scrape_all(urls, scrape)
        counted = {t: metrics.window(before[t], after[t]) for t in targets}
        scrapes = {t: (before[t], after[t]) for t in targets}
    else:
        counted = before
        scrapes = {t: (before[t],) for t in targets}
    seen = {v for snapshot in counted.values() for (m, v) in snapshot if m == model}
    new_versions, old_versions = _versions(env, model, version, seen)
    faults = [f"replica {t}: {fault}" for t in targets for fault in metrics.faults(model, seen, *scrapes[t])]
    new = metrics.total(list(counted.values()), model, new_versions)
    old = metrics.total(list(counted.values()), model, old_versions)
    ok, failed, detail, checks = _judged(env, old, new)
    [candidate] = new_versions
    compared = sorted(old_versions, key=int)
    analysis = Analysis(
        env.name, model, candidate, compared, list(targets), window, ok, failed, detail, checks, new
    )
    if faults:  # the bake cannot judge a counter that is not a count, or one that went down
        analysis.ok, analysis.failed_check, analysis.detail = False, "counters", metrics.summary(faults)
    return analysis


def _judged(
    env: Environment, old: metrics.Counters, new: metrics.Counters
) -> tuple[bool, str, str, list[CheckResult]]:
    policy = env.policy or Policy()
    verdict = judge(old, new, policy)
    checks = [_check(check, old, new) for check in policy.checks]
    return verdict.ok, verdict.metric, verdict.detail, checks


def _check(check: Check, old: metrics.Counters, new: metrics.Counters) -> CheckResult:
    derived = metrics.DERIVED[check.metric]
    value = derived.value(old, new)
    ok = value is None or check.passes(value)
    detail = derived.detail(old, new) if value is not None else f"not judged: {derived.about}, no old request"
    return CheckResult(check.metric, value, check.min, check.max, check.bound(), ok, detail)


def _versions(env: Environment, model: str, version: str | None, seen: set[str]) -> tuple[set[str], set[str]]:
    where = f"environment '{env.name}'"
    if not seen:
        raise NotServed(
            f"no replica of {where} reports model '{model}' in its metrics",
            fix=f"check the model's name and that it serves there ('mlreg status --env {env.name}')",
        )
    numbered = sorted((v for v in seen if v.isdigit()), key=int)
    candidate = version or (numbered[-1] if numbered else sorted(seen)[-1])
    if candidate not in seen:
        raise NotServed(
            f"no replica of {where} reports {model} version {candidate}; they report "
            f"{', '.join(sorted(seen))}",
            fix="pass a version the replicas serve, or leave version out (the newest)",
        )
    return {candidate}, seen - {candidate}


def _metrics_url(env: Environment, target: str) -> str:
    """Where the bake reads ``target``'s metrics: the environment's, else Triton's default port."""
    return env.metrics_url(target) or Policy().metrics_url(target)


def _scrape_all(urls: dict[str, str], scrape: Scrape) -> dict[str, metrics.Snapshot]:
    def one(url: str) -> metrics.Snapshot | MlregError:
        try:
            return scrape(url)
        except MlregError as exc:
            return exc

    with ThreadPoolExecutor(max(1, min(8, len(urls)))) as pool:
        found = dict(zip(urls, pool.map(one, urls.values()), strict=True))
    for target, snapshot in found.items():
        if isinstance(snapshot, MlregError):
            raise PromotionError(f"replica {target}: {snapshot.message}", fix=snapshot.fix)
    return {t: s for t, s in found.items() if not isinstance(s, MlregError)}
