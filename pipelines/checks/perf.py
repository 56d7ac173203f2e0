"""The performance check on the canary, before any traffic: the candidate against the serving
version, on the same server, on the same golden requests.

Requests go **interleaved** -- serving, candidate, serving, candidate ... (each worker alternates
which of the pair goes first) -- from ``concurrency`` workers at once, so a busy machine weighs on
both versions alike.  The verdict compares the p95 latencies: the candidate fails when

    p95(candidate) / p95(serving) > max(min_ratio, 1 + spread_factor x spread)
    and p95(candidate) - p95(serving) > min_ms

where ``spread`` is the run-to-run spread of the serving version's own p95 in this same run (its
requests cut into blocks in the order they were sent: the relative standard deviation of the
blocks' p95s).  A noisy run thus widens its own threshold rather than refusing a good candidate.
A first deployment (nothing serving to compare with) records the candidate's figures and passes
(a shorter run: 16 requests or half a second, as nothing is judged).

A failed verdict is measured once more before it refuses anything (:func:`check`): a slow burst
of a busy machine seldom hits two runs, a slower candidate fails both.  The report keeps the
first run's figures beside the second's.

An environment's section of ``mlreg.toml`` may tune it (defaults shown)::

    perf_concurrency = 2     # requests in flight at once
    perf_requests = 40       # per version (after 3 warm-up requests each)
    perf_seconds = 2.0       # at most this long: fewer requests on a slow model
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.checks.golden import golden_inputs, output_names
from pipelines.core.check import Phase, Place, Trial, Verdict
from pipelines.triton import metrics
from registry.errors import MlregError, UsageError

if TYPE_CHECKING:
    import numpy as np  # at run time imported where used: the settings loader imports this module

log = logging.getLogger(__name__)

PERF_KEYS = frozenset({"perf_concurrency", "perf_requests", "perf_seconds"})
BLOCKS = 4  # the serving version's requests, cut in this many blocks for its spread
WARM_UP = 3  # requests per version before measuring (a python stub's first call is slow)
FLOOR_REQUESTS = 8  # per version: fewer cannot judge a p95 (the time cap gives way to this)
RECORD_ONLY = (16, 0.5)  # requests, seconds: a first deployment's figures are recorded, not judged


class Answers(Protocol):
    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PerfSettings:
    concurrency: int = 2
    requests: int = 40
    seconds: float = 2.0
    min_ratio: float = 1.25
    spread_factor: float = 3.0
    min_ms: float = 2.0


def parse_perf(where: str, raw: Mapping[str, Any]) -> PerfSettings:
    """The check's settings from an environment section (the defaults where it says nothing)."""

    def integer(key: str, default: int) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(
                f"{where}: {key} must be an integer >= 1, not {value!r}", fix=f"e.g. {key} = {default}"
            )
        return value

    seconds = raw.get("perf_seconds", 2.0)
    if isinstance(seconds, float) and seconds != seconds:  # TOML's nan
        raise UsageError(f"{where}: perf_seconds = nan is not a number", fix="e.g. perf_seconds = 2.0")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 600:
        raise UsageError(
            f"{where}: perf_seconds must be a number of seconds within (0, 600], not {seconds!r}",
            fix="e.g. perf_seconds = 2.0",
        )
    return PerfSettings(integer("perf_concurrency", 2), integer("perf_requests", 40), float(seconds))


@dataclass
class Side:
    """One version's latencies (ms), in the order they were sent."""

    version: str
    latencies: list[float] = field(default_factory=list)
    busy_s: float = 0.0  # the sum of its requests' wall times

    def p(self, q: float) -> float:
        import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

        return float(np.percentile(self.latencies, q)) if self.latencies else math.nan

    @property
    def throughput(self) -> float:
        """Requests per second of this version's own time in flight."""
        return len(self.latencies) / self.busy_s if self.busy_s else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "requests": len(self.latencies),
            "p50_ms": round(self.p(50), 3),
            "p95_ms": round(self.p(95), 3),
            "throughput_rps": round(self.throughput, 1),
        }


@dataclass
class PerfResult:
    model: str
    candidate: Side
    serving: Side | None
    spread: float = math.nan
    threshold: float = math.nan
    ok: bool = True
    verdict: str = ""
    seconds: float = 0.0
    triton: dict[str, Any] = field(default_factory=dict)  # load time, queue and compute per request
    first_run: str = ""  # a failed first run's line, when this is the run that confirmed or cleared it

    @property
    def ratio(self) -> float:
        if self.serving is None:
            return math.nan
        return self.candidate.p(95) / max(self.serving.p(95), 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "candidate": self.candidate.to_dict(),
            "serving": self.serving.to_dict() if self.serving else None,
            "p95_ratio": None if self.serving is None else round(self.ratio, 3),
            "spread": None if math.isnan(self.spread) else round(self.spread, 3),
            "threshold": None if math.isnan(self.threshold) else round(self.threshold, 3),
            "ok": self.ok,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 2),
            "triton": self.triton,
            "first_run": self.first_run or None,
        }

    def line(self) -> str:
        """One line for people: ``image_model v3 p95 12.1 ms vs v2 11.8 ms (x1.03, limit x1.25): ok``."""
        new = f"{self.model} v{self.candidate.version} p95 {self.candidate.p(95):.1f} ms"
        if self.serving is None:
            return f"{new}, {self.candidate.throughput:.0f} req/s ({self.verdict})"
        return (
            f"{new} vs v{self.serving.version} {self.serving.p(95):.1f} ms (x{self.ratio:.2f}, "
            f"limit x{self.threshold:.2f}): {self.verdict}"
        )


def spread_of(latencies: list[float], blocks: int = BLOCKS) -> float:
    """The relative standard deviation of the p95s of ``blocks`` consecutive blocks."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    size = len(latencies) // blocks
    if size < 2:
        return math.nan
    p95s = [float(np.percentile(latencies[i * size : (i + 1) * size], 95)) for i in range(blocks)]
    mean = statistics.fmean(p95s)
    return statistics.pstdev(p95s) / mean if mean > 0 else math.nan


def judge(result: PerfResult, settings: PerfSettings) -> PerfResult:
    """The verdict on ``result`` (a first deployment passes, recorded)."""
    if result.serving is None:
        result.ok, result.verdict = True, "first deployment: recorded, not judged"
        return result
    spread = spread_of(result.serving.latencies)
    result.spread = spread
    result.threshold = max(
        settings.min_ratio, 1 + settings.spread_factor * (0 if math.isnan(spread) else spread)
    )
    slower_ms = result.candidate.p(95) - result.serving.p(95)
    result.ok = not (result.ratio > result.threshold and slower_ms > settings.min_ms)
    result.verdict = "ok" if result.ok else f"slower by {slower_ms:.1f} ms at p95"
    return result


def measure(
    connect: Callable[[], Answers],
    model: str,
    candidate: tuple[str, str],
    serving: str,
    inputs: Mapping[str, np.ndarray],
    outputs: list[str],
    settings: PerfSettings,
) -> PerfResult:
    """The candidate (``(name it is loaded as, version)``) and, when ``serving`` names a version,
    the serving version of ``model``: warmed up, then interleaved from ``settings.concurrency``
    workers, each on its own connection."""
    began = time.perf_counter()
    name, version = candidate
    pair = [(name, version)] + ([(model, serving)] if serving else [])
    sides = {v: Side(v) for _, v in pair}
    lock = threading.Lock()
    errors: list[BaseException] = []
    requests, seconds = (settings.requests, settings.seconds) if serving else RECORD_ONLY
    per_worker = max(1, math.ceil(min(requests, settings.requests) / settings.concurrency))
    warm = connect()
    try:
        for _ in range(WARM_UP):
            for loaded, v in pair:
                warm.infer(loaded, inputs, outputs, version=v)
    finally:
        warm.close()
    deadline = time.perf_counter() + min(seconds, settings.seconds)

    def worker(index: int) -> None:
        client = connect()
        try:
            for i in range(per_worker):
                if time.perf_counter() > deadline and i * settings.concurrency >= FLOOR_REQUESTS:
                    return
                order = pair if (i + index) % 2 == 0 else pair[::-1]
                for loaded, v in order:
                    t0 = time.perf_counter()
                    client.infer(loaded, inputs, outputs, version=v)
                    elapsed = time.perf_counter() - t0
                    with lock:
                        sides[v].latencies.append(elapsed * 1000)
                        sides[v].busy_s += elapsed
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(settings.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    result = PerfResult(model, sides[version], sides.get(serving) if serving else None)
    result.seconds = time.perf_counter() - began
    return judge(result, settings)


def check(run: Callable[[], PerfResult]) -> PerfResult:
    """``run`` (one :func:`measure`), and once more when it failed: the second run's verdict stands,
    the first one's line kept beside it."""
    first = run()
    if first.ok:
        return first
    second = run()
    second.first_run = first.line()
    second.verdict = (
        f"{second.verdict} (measured twice)"
        if not second.ok
        else f"ok on a second run (first: {first.verdict})"
    )
    return second


# -- the seam (pipelines/core/check.py): the check as the canary gate runs it -----------------------


@dataclass(frozen=True)
class PerfCheck:
    """The candidate's latency against the serving version's, interleaved on the canary."""

    name: str = "perf"
    phase: Phase = "gate"
    where: frozenset[str] = frozenset({"canary"})
    owns: frozenset[str] = PERF_KEYS
    aliases: tuple[str, ...] = ("--skip-perf",)

    def parse(self, place: Place, raw: Mapping[str, Any]) -> PerfSettings:
        return parse_perf(place.where, raw)

    def judge(self, trial: Trial) -> list[Verdict]:
        if trial.skip:  # recorded as skipped; the report's perf list stays empty, as before
            return [Verdict(self.name, "skipped", trial.subject, MEASURED, why=trial.skip)]
        settings = trial.setting if isinstance(trial.setting, PerfSettings) else PerfSettings()
        result = perf_check(trial, settings)
        if trial.load_seconds is not None:
            result.triton = {**_load_time(trial.metrics_url, trial, trial.load_seconds), **result.triton}
        trial.report.perf.append({**result.to_dict(), "line": result.line()})
        return [verdict(self.name, result, trial)]


MEASURED = "p95 latency ratio candidate / serving, interleaved on the same server (mlreg's clock)"


def verdict(name: str, result: PerfResult, trial: Trial) -> Verdict:
    line = f"{trial.step.model}: performance check failed: {result.line()}"
    judged = result.serving is not None and not result.verdict.startswith("recorded")
    sample = len(result.candidate.latencies) + (len(result.serving.latencies) if result.serving else 0)
    return Verdict(
        name,
        ("pass" if result.ok else "fail") if judged else "skipped",
        trial.subject,
        MEASURED,
        window=f"before traffic, {result.seconds:.1f} s on {trial.report.where}",
        replicas=(trial.replica,) if trial.replica else (),
        sample=sample,
        value=result.ratio if judged else None,
        threshold=result.threshold if judged else None,
        noise_floor=result.spread if judged and not math.isnan(result.spread) else None,
        why=(line if not result.ok else result.verdict),
        fix="" if result.ok else "find what made the candidate slower (or promote with --skip perf)",
        findings=() if result.ok else (line,),
    )


def perf_check(trial: Trial, perf: PerfSettings) -> PerfResult:
    """The candidate against the serving version it was compared with (none: recorded only), on
    the golden inputs; Triton's own queue and compute time per request where its metrics are known."""

    step, report = trial.step, trial.report
    assert trial.connect is not None, "the performance check runs where new connections can be made"
    connect = trial.connect
    inputs = golden_inputs(trial.settings, step.model, step.config_text)
    names = output_names(step.config_text)
    serving = report.previous.get(step.model, "")  # the version that answered the same inputs
    before = _scrape(trial.metrics_url)
    loaded_as = trial.loaded_as or step.model
    result = check(
        lambda: measure(connect, step.model, (loaded_as, step.version), serving, inputs, names, perf)
    )
    after = _scrape(trial.metrics_url)
    if not serving and trial.reference:  # e.g. an allowed breaking change: the old one cannot answer
        result.verdict = f"recorded, not judged: serving v{trial.reference} did not answer the same inputs"
    if before is not None and after is not None:
        window = metrics.window(before, after)
        for side, name, version in (("candidate", loaded_as, step.version), ("serving", step.model, serving)):
            counters = window.get((name, version))
            if version and counters is not None and counters.requests:
                result.triton[side] = {
                    "queue_us_per_request": round(counters.mean_queue_us, 1),
                    "compute_us_per_request": round(counters.mean_compute_us, 1),
                }
    return result


def _scrape(url: str) -> metrics.Snapshot | None:
    if not url:
        return None
    try:
        return metrics.scrape(url)
    except MlregError as exc:  # the figures are a report, not a verdict
        log.warning("no Triton counters for the performance check: %s", exc.message)
        return None


LOAD_DURATION = re.compile(r"^nv_model_load_duration_secs\{([^}]*)\}\s+(\S+)", re.MULTILINE)


def _load_time(metrics_url: str, trial: Trial, measured: float) -> dict[str, Any]:
    """The candidate's load time: Triton's ``nv_model_load_duration_secs`` where the server exports
    it (newer releases; 2.51 does not), else the wall time mlreg measured around the load."""
    if metrics_url:
        try:
            with urllib.request.urlopen(metrics_url, timeout=5) as response:
                text = response.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        for labels, value in LOAD_DURATION.findall(text):
            found = dict(metrics.LABEL.findall(labels))
            if (
                found.get("model") == (trial.loaded_as or trial.step.model)
                and found.get("version") == trial.step.version
            ):
                return {"load_seconds": float(value), "load_seconds_from": "nv_model_load_duration_secs"}
    return {"load_seconds": round(measured, 3), "load_seconds_from": "mlreg's wall time around the load"}


CHECK = PerfCheck()
