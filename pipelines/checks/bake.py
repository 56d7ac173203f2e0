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
Only what serves is judged: the version judged must be READY on at least one replica (Triton's
readiness, open without the control key), else there is nothing to judge (``NotServed``) -- a
candidate whose load failed leaves counters behind, and its latency ratio of x0.00 is no verdict.
A replica whose metrics cannot be read (off, failing, closed, garbage: ``metrics.scrape`` names
the cause) is never silently left out: up to the policy's ``max_unavailable`` it is left out and
named in the verdict (``left_out``), one more refuses the judgement naming every one of them.
Nothing here changes anything: it only reads ``/metrics`` and readiness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.check import Verdict
from pipelines.core.environment import Environment
from pipelines.core.policy import Check, Policy, judge
from pipelines.triton import metrics
from registry.errors import MlregError, PromotionError, UsageError
from registry.settings import redact_uri

MAX_WINDOW_S = 300.0  # longer than any web metric's timeout: a window that long is a typo
READY_TIMEOUT_S = 5.0
Scrape = Callable[[str], metrics.Snapshot]
Ready = Callable[[str, str, str], "bool | None"]  # (target, model, version): READY, not, unknown


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
    left_out: dict[str, str] = field(default_factory=dict)  # replica -> why its metrics were not read
    ready_on: list[str] = field(default_factory=list)  # the replicas where the version judged is READY

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
            "ready_on": [redact_uri(r) for r in self.ready_on],
            "left_out": {redact_uri(r): why for r, why in self.left_out.items()},
            "verdicts": [v.to_dict() for v in self.verdicts()],
        }

    def verdicts(self) -> list[Verdict]:
        """Each of the bake's checks as a verdict (pipelines/core/check.py): its value from Triton's
        counters against its limit, over the window, on the replicas read; one that cannot be
        judged now (no old version's requests to compare with) is skipped, as the bake passes it over."""
        return [self._verdict(c) for c in self.checks]

    def _verdict(self, check: CheckResult) -> Verdict:
        judged = check.value is not None
        return Verdict(
            f"bake.{check.name}",
            ("pass" if check.ok else "fail") if judged else "skipped",
            f"{self.model} v{self.version}",
            f"{check.name} from Triton's counters (/metrics) of v{self.version}"
            + (f" against v{', v'.join(self.compared_with)}" if self.compared_with else ""),
            window=f"{self.window_s:g} s" if self.window_s else "the counters since each version's load",
            replicas=tuple(redact_uri(r) for r in self.replicas if r not in self.left_out),
            sample=int(self.new.requests),
            value=check.value,
            threshold=check.max if check.max is not None else check.min,
            why=check.detail,
            fix=""
            if check.ok or not judged
            else "the version judged should not take more traffic: roll it back",
            findings=() if check.ok else (f"{check.name}: {check.detail}",),
        )


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
    ready: Ready | None = None,
) -> Analysis:
    """The bake's checks for ``model`` on ``targets`` (the environment's replicas), now.
    ``ready``: whether a replica has a version READY (default: asked of Triton, ``version_ready``)."""
    check_window(window)
    if not targets:
        raise PromotionError(f"environment '{env.name}' has no replica to judge", fix="check its targets")
    allowed = env.policy.max_unavailable if env.policy is not None else 0
    scrapes, left_out = _read(env, targets, scrape, sleep, window, allowed)
    counted = {t: metrics.window(*read) if window else read[0] for t, read in scrapes.items()}
    seen = {v for snapshot in counted.values() for (m, v) in snapshot if m == model}
    new_versions, old_versions = _versions(env, model, version, seen)
    [candidate] = new_versions
    ready_on = _ready_on(env, targets, model, candidate, ready or version_ready)
    faults = [
        f"replica {t}: {fault}" for t, read in scrapes.items() for fault in metrics.faults(model, seen, *read)
    ]
    judged_on = _judged_on(env, model, candidate, ready_on, counted, left_out)
    new = metrics.total([counted[t] for t in judged_on], model, new_versions)
    old = metrics.total(list(counted.values()), model, old_versions)
    ok, failed, detail, checks = _judged(env, old, new)
    compared = sorted(old_versions, key=int)
    analysis = Analysis(
        env.name, model, candidate, compared, list(targets), window, ok, failed, detail, checks, new
    )
    analysis.left_out, analysis.ready_on = left_out, ready_on
    if faults:  # the bake cannot judge a counter that is not a count, or one that went down
        analysis.ok, analysis.failed_check, analysis.detail = False, "counters", metrics.summary(faults)
    if left_out:
        named = "; ".join(f"{t} ({why})" for t, why in left_out.items())
        analysis.detail += f" [left out under max_unavailable = {allowed}: {named}]"
    return analysis


def _read(
    env: Environment,
    targets: Sequence[str],
    scrape: Scrape,
    sleep: Callable[[float], None],
    window: float,
    allowed: int,
) -> tuple[dict[str, tuple[metrics.Snapshot, ...]], dict[str, str]]:
    """Each readable replica's scrapes (one, or two ``window`` seconds apart), and the replicas
    left out because their metrics could not be read (at most ``allowed``)."""
    urls = {target: _metrics_url(env, target) for target in targets}
    before, left_out = _scrape_all(urls, scrape, {}, allowed)
    if not window:
        return {t: (before[t],) for t in targets if t in before}, left_out
    sleep(window)
    after, left_out = _scrape_all({t: u for t, u in urls.items() if t in before}, scrape, left_out, allowed)
    return {t: (before[t], after[t]) for t in targets if t in after}, left_out


def version_ready(target: str, model: str, version: str) -> bool | None:
    """Whether ``target`` (a Triton's gRPC address) has ``model`` ``version`` READY: Triton's
    readiness, which needs no control key; None when it cannot be asked."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient's gRPC stack, ~0.3 s
    from tritonclient.utils import InferenceServerException  # lazy: tritonclient, ~0.3 s

    client = grpcclient.InferenceServerClient(url=target)
    try:
        return bool(client.is_model_ready(model, version, client_timeout=READY_TIMEOUT_S))
    except InferenceServerException:
        return None
    finally:
        client.close()


def _ready_on(env: Environment, targets: Sequence[str], model: str, version: str, ready: Ready) -> list[str]:
    """The replicas where ``model`` ``version`` is READY; NotServed when there is none (a version
    whose load failed, or one unloaded since, left counters behind: they are no verdict)."""
    with ThreadPoolExecutor(max(1, min(8, len(targets)))) as pool:
        states = dict(zip(targets, pool.map(lambda t: ready(t, model, version), targets), strict=True))
    found = [t for t, state in states.items() if state]
    if not found:
        said = ", ".join(
            f"{t}: {'not READY' if s is False else 'readiness unknown'}" for t, s in states.items()
        )
        raise NotServed(
            f"{model} v{version} is not READY on any replica of environment '{env.name}' ({said}): "
            "nothing serves it, so there is nothing to judge (its metrics are what an earlier or a "
            "failed load left)",
            fix=f"'mlreg status --env {env.name}' shows what each replica serves; judge a version that "
            "serves (pass --version), or load it first",
        )
    return found


def _judged_on(
    env: Environment,
    model: str,
    version: str,
    ready_on: Sequence[str],
    counted: dict[str, metrics.Snapshot],
    left_out: dict[str, str],
) -> list[str]:
    """The replicas whose counters of ``model`` ``version`` are judged: READY there and read
    (issue 45 review, F6).  Another replica's counters of it are what an earlier or a failed load
    left; none left: NotServed, naming the replicas that serve it and why they were left out."""
    found = [t for t in ready_on if t in counted]
    if found:
        return found
    why = "; ".join(f"{t}: {left_out.get(t, 'its metrics not read')}" for t in ready_on)
    raise NotServed(
        f"{model} v{version} is READY only on replicas whose metrics could not be read ({why}): its "
        "counters elsewhere are what an earlier or a failed load left, so there is nothing to judge",
        fix="make those replicas' metrics readable (the reason is above), then run the check again",
    )


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


def _scrape_all(
    urls: dict[str, str], scrape: Scrape, left_out: dict[str, str], allowed: int
) -> tuple[dict[str, metrics.Snapshot], dict[str, str]]:
    """Each replica's metrics, and every replica whose metrics could not be read (``left_out``:
    the ones already left out, kept) -- named, never dropped silently: more than ``allowed`` of
    them refuses the judgement."""

    def one(url: str) -> metrics.Snapshot | MlregError:
        try:
            return scrape(url)
        except MlregError as exc:
            return exc

    with ThreadPoolExecutor(max(1, min(8, len(urls)))) as pool:
        found = dict(zip(urls, pool.map(one, urls.values()), strict=True))
    left = dict(left_out)
    left.update({t: s.message for t, s in found.items() if isinstance(s, MlregError)})
    if len(left) > allowed:
        errors = [s for s in found.values() if isinstance(s, MlregError)]
        fixes = "; ".join(dict.fromkeys(str(e.fix) for e in errors if e.fix)) or None
        named = "; ".join(f"replica {t}: {why}" for t, why in left.items())
        more = f" (more than max_unavailable = {allowed} replica(s))" if allowed else ""
        raise PromotionError(f"{named}{more}: the verdict cannot be judged", fix=fixes)
    return {t: s for t, s in found.items() if not isinstance(s, MlregError)}, left
