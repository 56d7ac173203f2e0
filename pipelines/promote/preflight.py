"""The preflight: the registered checks of phase "preflight" (pipelines/core/check.py), run ONCE per
promotion before the upload and any load -- after ``convert`` (a SavedModel served as ONNX is judged
as the ONNX it became) and ``validate``, before the scratch server's gate of a dry run (which runs
it too: it only reads).  One ``Trial`` holds every target (each replica's connection: its metadata
is read, nothing is loaded), the environment's store and the plan's steps.

``--skip NAME`` and the environment's ``observe = [NAME]`` name the checks as in the gates
(``run_checks``); ``--skip quality`` skips the gate, not the preflight.  Every verdict joins the
promotion's (``PromotionResult.verdicts``, on every exit); an enforced refusal raises before
anything was changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.check import Judging, Trial, Verdict, run_checks
from pipelines.fleet.context import FleetContext
from pipelines.promote.registered import preflight_checks
from registry.errors import PromotionError


@dataclass
class PreflightReport:
    """What the preflight's checks found (the seam's ``Record``): refusing lines, every verdict, and
    what observed checks would have refused."""

    failures: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)

    def detail(self) -> str:
        judged = [v for v in self.verdicts if v.result != "skipped"]
        text = f"{len(judged)} judgement(s) before any load"
        skipped = sorted({v.name for v in self.verdicts if v.result == "skipped"})
        if skipped:
            text += f", skipped: {', '.join(skipped)}"
        if self.observed:
            text += f", {len(self.observed)} observed: would have refused"
        return text


def preflight(ctx: FleetContext) -> PreflightReport:
    """Every preflight check on the whole promotion; its verdicts recorded; a refusal raised."""
    plan, report = ctx.plan, PreflightReport()
    judging = Judging(
        tuple(preflight_checks()), ctx.options.skip, frozenset(ctx.env.observe), ctx.env.setting
    )
    trial = Trial(
        plan.step(plan.model),
        ctx.settings,
        report,
        where="preflight",
        targets=tuple(ctx.fleet.target(url) for url in plan.targets),
        store=ctx.env.store,
        steps=tuple(plan.steps),
    )
    run_checks(judging, [trial], report)
    ctx.result.verdicts.extend(v.to_dict() for v in report.verdicts)
    if report.failures:
        first = next(v for v in report.verdicts if v.refuses)
        raise PromotionError(
            "refused before any load (preflight):\n  " + "\n  ".join(report.failures),
            fix=first.fix or "see the verdicts above",
        )
    return report
