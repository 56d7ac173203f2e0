"""The shadow replay: the candidate answers the requests production really sent (captured by
Triton's trace, ``pipelines/checks/capture.py``), compared with what the serving version answered
then, before the candidate takes any traffic.

The serving version answers the same requests again: **the noise floor**.  A model that is not
deterministic disagrees with itself, and the candidate is held only to diverging *more* than that.
Requests that fail on the serving version are not held against the candidate.

Per output, the measure its type calls for (``kind_of``):

- **exact** (integers, booleans): every element equal;
- **classification** (a float ``[N, K]`` score tensor, or an output with a ``label_filename``): the
  top-1 class of every row; top-1 and top-k agreement, and each disagreement by its direction
  (serving's class -> the candidate's: "3->5" and "5->3" are counted apart);
- **regression** (other floats): ``|candidate - serving| <= tolerance x (1 + |serving|)`` element-wise,
  and the two-sample Kolmogorov-Smirnov statistic of the candidate's values against the serving ones.

The verdict: with ``n`` requests judged, ``c`` the candidate's divergent (or failed) ones and ``f``
the floor's, the candidate is refused when ``c - f > max_divergence x n + Z x sqrt(2f)`` (the
second term: the spread two draws of a noisy model show at that floor, 99.9 % one-sided), or when the
floor itself is over ``max_floor`` (the serving version disagrees with itself too often for any
comparison to mean something: raise the tolerance, or skip the check).  Triton writes float data
with six significant digits: the tolerance must stay above that (1e-3 by default).

Each distinct input is judged once (``N captures, D distinct`` in the result's line: one client
repeating a request cannot fill the sample).  Fewer requests judged than the environment's
``min_captures`` -- none captured, the captures
forged, the canary gone mid-replay so that neither side answered -- is **inconclusive**: refused,
never a pass (``--skip-shadow`` says, in the report, that the check was not run).  Forged trace
records (``traces.py``) are never judged and always named in the result's line.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pipelines.checks.capture import Shadow
from pipelines.checks.traces import Captured
from registry.contracts.config import data_type_name, parse_config
from registry.errors import MlregError

if TYPE_CHECKING:
    import numpy as np  # at run time imported where used: the settings loader imports this module

Z = 3.0  # one-sided 99.9 %: the spread of two noisy draws that is not held against a candidate
FLOATS = {"FP16", "FP32", "FP64", "BF16"}
FIRST = 5  # divergent requests shown in the report
SHOWN = 8  # values of a tensor shown
Answer = Callable[[Mapping[str, "np.ndarray"]], dict[str, "np.ndarray"]]


def kind_of(config_text: str) -> dict[str, str]:
    """Each output's measure: "exact", "classification" or "regression"."""
    config = parse_config(config_text)
    kinds = {}
    for tensor in config.output:
        dtype = data_type_name(tensor.data_type)
        rank = len(tensor.dims) + (1 if config.max_batch_size > 0 else 0)
        last = int(tensor.dims[-1]) if tensor.dims else 0
        if dtype not in FLOATS:
            kinds[tensor.name] = "exact"
        elif tensor.label_filename or (rank == 2 and last >= 2):
            kinds[tensor.name] = "classification"
        else:
            kinds[tensor.name] = "regression"
    return kinds


@dataclass
class OutputFigures:
    name: str
    kind: str
    diverged: int = 0  # requests on which the candidate's output diverged
    floor: int = 0  # ... on which the serving version's second answer did
    max_abs: float = 0.0  # the largest |candidate - serving| seen
    top1: float | None = None  # classification: share of rows with the same top-1 class
    topk: float | None = None  # ... with the candidate's top-1 among serving's top-k
    flips: dict[str, int] = field(default_factory=dict)  # "serving->candidate": rows
    ks: float | None = None  # regression: KS statistic, candidate vs serving
    ks_floor: float | None = None  # ... serving's second answer vs its first
    # the plot's distributions: bin edges (regression) or classes, serving's and the candidate's counts
    histogram: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class ShadowResult:
    model: str
    candidate: str
    serving: str
    ok: bool = True
    verdict: str = ""
    captured: int = 0  # requests read for this version
    judged: int = 0  # replayed and answered by the serving version
    serving_failed: int = 0  # not held against the candidate
    candidate_failed: int = 0  # counted as divergent
    diverged: int = 0
    floor: int = 0
    allowed: float = 0.0  # most divergent requests above the floor the verdict allowed
    outputs: list[OutputFigures] = field(default_factory=list)
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # side -> p50/p95
    first: list[dict[str, Any]] = field(default_factory=list)  # the first divergent requests
    skipped: dict[str, int] = field(default_factory=dict)  # captures not replayed, by why
    forged: int = 0  # records from request ids that broke Triton's trace format (never judged)
    forged_files: int = 0
    captures: int = 0  # honest captures read of the serving version...
    distinct: int = 0  # ...of which distinct inputs (each judged once)
    seconds: float = 0.0
    pairs_ms: list[list[float]] = field(default_factory=list)  # per request: [candidate, serving]

    @property
    def divergence(self) -> float:
        return self.diverged / self.judged if self.judged else 0.0

    @property
    def floor_rate(self) -> float:
        return self.floor / self.judged if self.judged else 0.0

    def line(self) -> str:
        forged = (
            f" ({self.forged} forged records from request ids that break Triton's trace format, in "
            f"{self.forged_files} file(s): not judged)"
            if self.forged
            else ""
        )
        read = f" ({self.captures} captures, {self.distinct} distinct)" if self.captures else ""
        if not self.judged:
            return f"{self.model}: shadow replay {self.verdict}{read}{forged}"
        return (
            f"{self.model} v{self.candidate} diverged from serving v{self.serving} on {self.diverged} of "
            f"{self.judged} captured requests ({self.divergence:.1%}){read}; noise floor {self.floor} "
            f"({self.floor_rate:.1%}): {self.verdict}{forged}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(divergence=self.divergence, floor_rate=self.floor_rate, line=self.line())
        return data


def skipped(model: str, candidate: str, serving: str, why: str) -> ShadowResult:
    return ShadowResult(model, candidate, serving, True, f"skipped: {why}")


def refused(model: str, candidate: str, serving: str, why: str) -> ShadowResult:
    """A replay that could not be run where the environment asks for one: fails closed."""
    return ShadowResult(model, candidate, serving, False, f"refused: {why}")


def inconclusive(result: ShadowResult, shadow: Shadow, found: int) -> ShadowResult:
    """Fewer honest requests than ``min_captures``: refused, unless the check is skipped."""
    result.ok = False
    result.verdict = (
        f"inconclusive: {found} captured request(s) of v{result.serving} could be judged, fewer than "
        f"min_captures {shadow.least}: let production send more (or promote with --skip-shadow, "
        "which the report names)"
    )
    return result


def replay(
    requests: Sequence[Captured],
    candidate: Answer,
    serving: Answer,
    kinds: Mapping[str, str],
    shadow: Shadow,
    result: ShadowResult,
) -> ShadowResult:
    """Each captured request to the candidate and again to the serving version (two streams, each
    in capture order, at the batch sizes they were sent with), then the comparison and the verdict."""
    began = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        theirs = pool.submit(_answers, serving, requests)
        ours = _answers(candidate, requests)
        again = theirs.result()
    result.captured = len(requests)
    compare(requests, ours, again, kinds, shadow, result)
    result.seconds = round(time.perf_counter() - began, 3)
    return result


Timed = tuple[dict[str, "np.ndarray"] | None, float]  # (outputs, or None when it failed; ms)


def _answers(answer: Answer, requests: Sequence[Captured]) -> list[Timed]:
    out: list[Timed] = []
    for request in requests:
        began = time.perf_counter()
        try:
            found: dict[str, np.ndarray] | None = answer(request.inputs)
        except MlregError:
            found = None
        out.append((found, (time.perf_counter() - began) * 1000))
    return out


class _Tally:
    """The comparison's running figures, per output."""

    def __init__(self, kinds: Mapping[str, str]) -> None:
        self.figures = {name: OutputFigures(name, kind) for name, kind in kinds.items()}
        self.rows: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in kinds}
        self.values: dict[str, list[list[np.ndarray]]] = {n: [[], [], []] for n in kinds}

    def request(
        self, request: Captured, ours: dict[str, np.ndarray], again: dict[str, np.ndarray], tolerance: float
    ) -> tuple[bool, bool]:
        """Whether the candidate's answer diverged, and whether the serving version's second did."""
        diverged = noisy = False
        for name, fig in self.figures.items():
            was = request.outputs.get(name)
            if was is None:
                continue
            now, second = ours.get(name), again.get(name)
            off = diverges(fig.kind, was, now, tolerance)
            floor = diverges(fig.kind, was, second, tolerance)
            fig.diverged += off
            fig.floor += floor
            diverged, noisy = diverged or off, noisy or floor
            if now is not None and now.shape == was.shape:
                fig.max_abs = max(fig.max_abs, _max_abs(was, now))
                if fig.kind == "classification":
                    self.rows[name].append((was, now))
                elif fig.kind == "regression":
                    same = second is not None and second.shape == was.shape
                    self.values[name][0].append(was.ravel())
                    self.values[name][1].append(now.ravel())
                    self.values[name][2] += [second.ravel()] if same and second is not None else []
        return diverged, noisy

    def finish(self, top_k: int) -> list[OutputFigures]:
        import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

        for name, fig in self.figures.items():
            if fig.kind == "classification":
                _classes(fig, self.rows[name], top_k)
            elif fig.kind == "regression" and self.values[name][0]:
                was, now, second = (
                    np.concatenate(v).astype(np.float64) if v else None for v in self.values[name]
                )
                assert was is not None
                assert now is not None
                fig.ks = round(ks_statistic(was, now), 4)
                fig.ks_floor = round(ks_statistic(was, second), 4) if second is not None else None
                fig.histogram = _histogram(was, now)
        return list(self.figures.values())


def compare(
    requests: Sequence[Captured],
    ours: Sequence[Timed],
    again: Sequence[Timed],
    kinds: Mapping[str, str],
    shadow: Shadow,
    result: ShadowResult,
) -> ShadowResult:
    """The candidate's answers (``ours``) and the serving version's second ones (``again``) against
    what it answered in production; the verdict in ``result``."""
    tally = _Tally(kinds)
    for request, (candidate, _), (serving, _) in zip(requests, ours, again, strict=True):
        if serving is None:  # failed on the serving version: not held against the candidate
            result.serving_failed += 1
            continue
        result.judged += 1
        if candidate is None:
            diverged, noisy = True, False
            result.candidate_failed += 1
        else:
            diverged, noisy = tally.request(request, candidate, serving, shadow.tolerance)
        result.diverged += diverged
        result.floor += noisy
        if diverged:
            _note_first(result, request, candidate, shadow.record_tensors)
    result.outputs = tally.finish(shadow.top_k)
    result.latency_ms = _latency(requests, ours, again)
    result.pairs_ms = [
        [round(a, 3), round(b, 3)]
        for (x, a), (y, b) in zip(ours, again, strict=True)
        if x is not None and y is not None
    ]
    return judge(result, shadow)


def judge(result: ShadowResult, shadow: Shadow) -> ShadowResult:
    n, c, f = result.judged, result.diverged, result.floor
    if n < shadow.least:
        return inconclusive(result, shadow, n)
    result.allowed = round(shadow.max_divergence * n + Z * math.sqrt(2 * f), 2)
    if f / n > shadow.max_floor:
        result.ok = False
        result.verdict = (
            f"refused: the serving version disagrees with itself on {f / n:.1%} of the requests (the "
            f"noise floor) at tolerance {shadow.tolerance:g}, over max_floor {shadow.max_floor:.1%}: "
            "the replay cannot tell the candidate from the noise"
        )
    elif c - f > result.allowed:
        worst = max(result.outputs, key=lambda o: o.diverged - o.floor, default=None)
        named = f"; output {worst.name} ({worst.kind}): {_output_line(worst)}" if worst else ""
        failed = f", {result.candidate_failed} failed" if result.candidate_failed else ""
        result.ok = False
        result.verdict = (
            f"refused: {c - f} divergent request(s){failed} above the floor, more than the "
            f"{result.allowed:g} allowed (max_divergence {shadow.max_divergence:.1%} of {n} judged "
            f"request(s){' + the noise margin' if f else ''}){named}"
        )
    else:
        result.verdict = f"passed (within max_divergence {shadow.max_divergence:.1%} above the floor)"
    return result


def diverges(kind: str, was: np.ndarray, now: np.ndarray | None, tolerance: float) -> bool:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    if now is None or now.shape != was.shape:
        return True
    if kind == "exact":
        return not np.array_equal(was, now)
    if kind == "classification":
        return bool(
            np.any(
                np.argmax(was.reshape(-1, was.shape[-1]), -1) != np.argmax(now.reshape(-1, now.shape[-1]), -1)
            )
        )
    a, b = was.astype(np.float64), now.astype(np.float64)
    nan = np.isnan(a) != np.isnan(b)
    return bool(np.any(nan) or np.any(np.abs(b - a) > tolerance * (1 + np.abs(a))))


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    a, b = np.sort(a[np.isfinite(a)]), np.sort(b[np.isfinite(b)])
    if not len(a) or not len(b):
        return 0.0
    grid = np.concatenate([a, b])
    gaps = np.searchsorted(a, grid, side="right") / len(a) - np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(gaps)))


def _classes(fig: OutputFigures, pairs: list[tuple[np.ndarray, np.ndarray]], k: int) -> None:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    if not pairs:
        return
    was = np.concatenate([p[0].reshape(-1, p[0].shape[-1]) for p in pairs])
    now = np.concatenate([p[1].reshape(-1, p[1].shape[-1]) for p in pairs])
    top_was, top_now = np.argmax(was, -1), np.argmax(now, -1)
    best = np.argsort(-was, axis=-1)[:, : max(1, k)]
    fig.top1 = round(float(np.mean(top_was == top_now)), 4)
    fig.topk = round(float(np.mean(np.any(best == top_now[:, None], axis=-1))), 4)
    classes = max(int(top_was.max(initial=0)), int(top_now.max(initial=0))) + 1
    fig.histogram = {
        "classes": [float(c) for c in range(classes)],
        "serving": np.bincount(top_was, minlength=classes).astype(float).tolist(),
        "candidate": np.bincount(top_now, minlength=classes).astype(float).tolist(),
    }
    fig.flips = dict(
        Counter(f"{a}->{b}" for a, b in zip(top_was, top_now, strict=True) if a != b).most_common(10)
    )


def _histogram(was: np.ndarray, now: np.ndarray, bins: int = 30) -> dict[str, list[float]]:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    both = np.concatenate([was[np.isfinite(was)], now[np.isfinite(now)]])
    if not both.size:
        return {}
    edges = np.histogram_bin_edges(both, bins=bins)
    return {
        "edges": [round(float(e), 6) for e in edges],
        "serving": np.histogram(was, bins=edges)[0].astype(float).tolist(),
        "candidate": np.histogram(now, bins=edges)[0].astype(float).tolist(),
    }


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    if a.dtype.kind not in "fiub" or not a.size:
        return 0.0
    gap = np.abs(b.astype(np.float64) - a.astype(np.float64))
    gap = gap[np.isfinite(gap)]
    return float(gap.max()) if gap.size else 0.0


def _output_line(fig: OutputFigures) -> str:
    parts = [f"{fig.diverged} diverged, floor {fig.floor}"]
    if fig.top1 is not None:
        parts.append(f"top-1 agreement {fig.top1:.1%}, top-k {fig.topk:.1%}")
    if fig.flips:
        parts.append("flips " + ", ".join(f"{k} x{v}" for k, v in list(fig.flips.items())[:3]))
    if fig.ks is not None:
        parts.append(f"KS {fig.ks:.3f} (floor {fig.ks_floor if fig.ks_floor is not None else '-'})")
    parts.append(f"max |Δ| {fig.max_abs:.3g}")
    return ", ".join(parts)


def _latency(
    requests: Sequence[Captured], ours: Sequence[Timed], again: Sequence[Timed]
) -> dict[str, dict[str, float]]:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    out = {}
    sides = {
        "candidate": [ms for found, ms in ours if found is not None],
        "serving": [ms for found, ms in again if found is not None],
        "production": [r.latency_us / 1000 for r in requests if r.latency_us],
    }
    for side, times in sides.items():
        if times:
            out[side] = {
                "p50": round(float(np.percentile(times, 50)), 3),
                "p95": round(float(np.percentile(times, 95)), 3),
            }
    return out


def _note_first(
    result: ShadowResult, request: Captured, candidate: dict[str, np.ndarray] | None, tensors: bool
) -> None:
    """One of the first divergent requests: where it was captured, and its tensors only where the
    environment lets them be recorded (``record_tensors``); otherwise their shapes alone."""
    if len(result.first) >= FIRST:
        return

    def shown(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
        return {n: _shown(a) if tensors else f"shape {list(a.shape)}" for n, a in arrays.items()}

    result.first.append(
        {
            "request_id": request.request_id,
            "source": request.source,
            "inputs": shown(request.inputs),
            "serving": shown(request.outputs),
            "candidate": shown(candidate) if candidate is not None else "failed",
        }
    )


def _shown(array: np.ndarray) -> str:
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    flat = array.ravel()
    head = ", ".join(f"{v:.4g}" if isinstance(v, float | np.floating) else str(v) for v in flat[:SHOWN])
    return f"[{head}{', ...' if flat.size > SHOWN else ''}] shape {list(array.shape)}"
