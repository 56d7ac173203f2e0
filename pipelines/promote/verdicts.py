"""The promotion's verdict (issue 49): every check's and guard's record in the one shape of
``pipelines/core/check.py`` (``Verdict``), on every exit -- promoted, refused, aborted, signalled.

The gate's checks (runtime, golden, shadow, perf) return their verdicts themselves (the gates put
them in ``PromotionResult.verdicts``).  What does not return one yet is adapted here, in this one
place, from the report it already keeps:

- each bake of a staged roll-out (``policy.judge``'s judgement over the old and new version's
  counters, kept in ``PromotionResult.bakes``): one ``bake.<metric>`` verdict per check of the
  environment's policy, made by the same code ``mlreg analysis check`` uses (``bake.Analysis``);
- the memory headroom guard (``Headroom.to_dict()``'s rows): one ``headroom`` verdict per model
  for the loads it let through, one per refusal;
- the peak-batch request (``stages._peak``, in ``verify``): ``peak_batch`` (``peak_verdict``);
- an aborted promotion's time to safe (``failure.fail``): detection -> every replica's restore
  finished (``time_to_safe``).

``complete`` is called before the run is recorded (``record.record_promotion``: the record stage
and the failure path alike) and is idempotent: what it adapted before is replaced, never doubled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pipelines.checks import bake
from pipelines.core.check import Verdict
from pipelines.core.policy import Policy
from pipelines.core.policy import Verdict as Judgement
from pipelines.core.reports import PromotionResult
from registry.settings import redact_uri

HEADROOM = "headroom"
PEAK = "peak_batch"
TIME_TO_SAFE = "time_to_safe"
PROMOTION_FIX = "fix the model and register a new version, then promote again; the alias was not moved"


def complete(result: PromotionResult) -> None:
    """``result.verdicts``: the checks' own (as the gates and ``verify`` recorded them), then the
    guards' and the bakes' adapted here, then the time to safe of an aborted promotion."""
    kept = [v for v in result.verdicts if not any(v is a for a in result.adapted)]
    made = [*headroom_verdicts(result), *bake_verdicts(result)]
    if result.time_to_safe is not None:
        made.append(time_to_safe_verdict(result))
    result.adapted = [v.to_dict() for v in made]
    result.verdicts = kept + result.adapted


# -- the bakes ------------------------------------------------------------------------------------


def bake_verdicts(result: PromotionResult) -> list[Verdict]:
    """Each bake's judgement as one verdict per check of the policy (``bake.<metric>``), through
    ``bake.Analysis``: the same records ``mlreg analysis check`` prints."""
    env = result.plan.env
    policy = env.policy or Policy()
    found: list[Verdict] = []
    for index, judged in enumerate(result.bakes):
        analysis = bake_analysis(result, policy, judged)
        window = f"bake {index + 1} of the roll-out ({policy.bake_seconds:g} s)"
        for verdict in analysis.verdicts():
            fix = PROMOTION_FIX if verdict.result == "fail" else ""
            found.append(dataclasses.replace(verdict, window=window, fix=fix))
        if not judged.ok and judged.metric not in {c.name for c in analysis.checks}:
            found.append(  # not counts at all (a counter that went down, NaN): no check could judge
                Verdict(
                    f"bake.{judged.metric or 'counters'}",
                    "fail",
                    f"{result.plan.model} v{result.plan.version}",
                    "Triton's counters (/metrics) over the bake",
                    window=window,
                    replicas=tuple(redact_uri(t) for t in result.plan.targets),
                    sample=_count(judged.new.requests),
                    why=judged.detail,
                    fix="read the replicas' /metrics (a restart resets the counters); promote again",
                    findings=(judged.detail,),
                )
            )
    return found


def bake_analysis(result: PromotionResult, policy: Policy, judged: Judgement) -> bake.Analysis:
    plan = result.plan
    checks = [bake._check(check, judged.old, judged.new) for check in policy.checks]  # the analysis' own
    return bake.Analysis(
        plan.env.name,
        plan.model,
        plan.version,
        [],
        list(plan.targets),
        policy.bake_seconds,
        judged.ok,
        judged.metric,
        judged.detail,
        checks,
        judged.new,
    )


def _count(value: float) -> int:
    return int(value) if math.isfinite(value) and value >= 0 else 0


# -- memory headroom ------------------------------------------------------------------------------


def headroom_verdicts(result: PromotionResult) -> list[Verdict]:
    """Memory headroom before each load: per model, one verdict for the loads it let through (the
    tightest one's figures) and one per load it refused; where it could not check, skipped."""
    if result.headroom is None:
        return []
    found = result.headroom.to_dict()
    rows = [r for r in found.get("checks") or [] if isinstance(r, Mapping)]
    passed = [r for r in rows if r.get("ok")]
    verdicts = [
        _headroom_pass(model, [r for r in passed if r.get("model") == model])
        for model in sorted({str(r.get("model")) for r in passed})
    ]
    verdicts += _headroom_refusals(rows, found, result.plan.skipped)
    if not rows and found.get("notes"):
        verdicts.append(Verdict(HEADROOM, "skipped", why=str(found["notes"][0])))
    return verdicts


def _headroom_refusals(
    rows: list[Mapping[str, Any]], found: Mapping[str, Any], skipped: Mapping[str, str]
) -> list[Verdict]:
    """One verdict per (replica, model) the guard refused (a load over several devices: its first)."""
    refused = [str(m) for m in found.get("refused") or []]
    seen: set[tuple[str, str]] = set()
    verdicts = []
    for row in (r for r in rows if not r.get("ok")):
        key = (str(row.get("replica")), str(row.get("model")))
        if key not in seen:
            seen.add(key)
            verdicts.append(_headroom_refusal(row, found.get("margin"), refused, skipped))
    return verdicts


def _tightest(rows: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    return min(rows, key=lambda r: float(r.get("free_bytes", 0)) - float(r.get("needed_bytes", 0)))


def _headroom_pass(model: str, rows: list[Mapping[str, Any]]) -> Verdict:
    row = _tightest(rows)
    return Verdict(
        HEADROOM,
        "pass",
        f"{model} v{','.join(row.get('versions') or row.get('recreated') or [])}",
        f"free memory (bytes) before each load against footprint x memory_margin, from {row.get('source')}",
        window="before each load",
        replicas=tuple(sorted({redact_uri(str(r.get("replica"))) for r in rows})),
        sample=len(rows),
        value=float(row.get("free_bytes", 0)),
        threshold=float(row.get("needed_bytes", 0)),
        why=f"the tightest: {redact_uri(str(row.get('replica')))} {row.get('device')}",
    )


def _headroom_refusal(
    row: Mapping[str, Any], margin: object, refused: list[str], skipped: Mapping[str, str]
) -> Verdict:
    replica, model = str(row.get("replica")), str(row.get("model"))
    message = next((m for m in refused if m.startswith(replica) and f" {model} v" in m), "")
    left_out = replica in skipped
    return Verdict(
        HEADROOM,
        "skipped" if left_out else "fail",
        f"{model} v{','.join(row.get('versions') or row.get('recreated') or [])}",
        f"free memory (bytes) on {row.get('device')} before the load against footprint x memory_margin "
        f"{margin}, from {row.get('source')}",
        window="before the load",
        replicas=(redact_uri(replica),),
        sample=1,
        value=float(row.get("free_bytes", 0)),
        threshold=float(row.get("needed_bytes", 0)),
        why=("left out under max_unavailable: " if left_out else "") + redact_uri(message),
        fix=""
        if left_out
        else f"unload a model {redact_uri(replica)} does not need, or lower memory_margin (now {margin}) "
        "only if the recorded footprint is too high; then promote again",
        findings=() if left_out else (redact_uri(message),),
    )


# -- the peak-batch request -----------------------------------------------------------------------


def peak_verdict(result: PromotionResult, url: str, model: str, version: str, peak: int, error: str) -> None:
    """The peak-batch request's record (``stages._peak``): one per model, its replicas and
    requests counted as they are asked; a failure is its own record, with its fix."""
    subject, replica = f"{model} v{version}", redact_uri(url)
    if not error:
        for found in result.verdicts:
            if found.get("name") == PEAK and found.get("subject") == subject and found["result"] == "pass":
                found["replicas"].append(replica)
                found["sample"] += 1
                return
    verdict = Verdict(
        PEAK,
        "fail" if error else "pass",
        subject,
        f"rows answered of one request at max_batch_size (the golden row repeated {peak} times), by version",
        window="after the load, before traffic (verify)",
        replicas=(replica,),
        sample=1,
        value=0.0 if error else float(peak),
        threshold=float(peak),
        why=error,
        fix=f"fix the model for batches up to max_batch_size {peak} (or lower max_batch_size in its "
        "config.pbtxt), register it again and promote"
        if error
        else "",
        findings=(error,) if error else (),
    )
    result.verdicts.append(verdict.to_dict())


# -- time to safe ---------------------------------------------------------------------------------


def time_to_safe(detected: float, touched: list[str], restored: Mapping[str, float]) -> dict[str, Any]:
    """Detection (``detected``: when the failure reached the error hook, the failing check's
    decision having raised it) -> each touched replica's restore finished (``restored``: url ->
    time.time()); the p95 per replica and the whole fleet's."""
    back = {url: max(0.0, restored[url] - detected) for url in touched if restored.get(url, -1.0) >= detected}
    seconds = sorted(back.values())
    return {
        "detected_at": datetime.fromtimestamp(detected, UTC).isoformat(timespec="milliseconds"),
        "replicas": {redact_uri(url): round(s, 4) for url, s in back.items()},
        "not_back": [redact_uri(url) for url in touched if url not in back],
        "p95_replica_seconds": round(percentile(seconds, 95), 4) if seconds else None,
        "whole_fleet_seconds": round(seconds[-1], 4) if seconds and len(back) == len(touched) else None,
    }


def percentile(sorted_values: list[float], percent: float) -> float:
    """The nearest-rank percentile of ``sorted_values`` (non-empty, ascending)."""
    rank = max(1, math.ceil(len(sorted_values) * percent / 100))
    return sorted_values[rank - 1]


def time_to_safe_verdict(result: PromotionResult) -> Verdict:
    """The undo judged, not the candidate: never the promotion's reason (``reports.reason``)."""
    found = result.time_to_safe or {}
    back, not_back = found.get("replicas") or {}, found.get("not_back") or []
    whole = found.get("whole_fleet_seconds")
    return Verdict(
        TIME_TO_SAFE,
        "fail" if not_back else "pass",
        f"{result.plan.model} v{result.plan.version}",
        "seconds from detection to every touched replica's restore finished (the undo's loads)",
        window=f"detected at {found.get('detected_at')}",
        replicas=tuple(back),
        sample=len(back),
        value=whole,
        why=(
            f"p95 per replica {found.get('p95_replica_seconds')} s; every replica back in {whole} s"
            if not not_back
            else f"not back: {', '.join(not_back)}"
        ),
        fix="bring the replica back, then run 'mlreg status'" if not_back else "",
    )
