"""The quality gate as a strategy, chosen once when the plan is built (``choose_gate``):

- ``CanaryGate`` -- a real promotion: the candidates answer on the canary, after the upload and
  before any other replica or ensemble meets them (a live stage; its loads are in the undo log);
- ``ScratchGate`` -- a dry run or a plan job, or an environment with no target: a scratch
  tritonserver from the application's factory; nothing of the environment changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.checks.golden import GateFailed, QualityReport, preflight
from pipelines.core.check import Judging
from pipelines.core.context import Gate
from pipelines.core.reports import QualityStageReport
from pipelines.fleet.context import FleetContext
from pipelines.promote.canary_gate import canary_gate
from pipelines.promote.registered import GATE, gate_checks
from registry.errors import PromotionError


def judging(ctx: FleetContext, where: str) -> Judging:
    """The registered checks a gate runs (``where``: "canary" or "scratch"), what ``--skip`` and
    the environment's ``observe`` name, and each check's settings from the environment."""
    return Judging(tuple(gate_checks(where)), ctx.options.skip, frozenset(ctx.env.observe), ctx.env.setting)


def _passed(ctx: FleetContext, report: QualityReport) -> QualityStageReport:
    ctx.checked = report
    ctx.result.shadow = report.shadow  # in every report, refused or not
    ctx.result.verdicts.extend(v.to_dict() for v in report.verdicts)  # after the preflight's
    if report.failures:
        raise GateFailed(report)
    return QualityStageReport(
        report.checked,
        report.changes,
        report.perf,
        report.where,
        dict(report.previous),
        report.shadow,
        list(report.generated),
        [v.to_dict() for v in report.verdicts],
        list(report.observed),
    )


@dataclass(frozen=True)
class CanaryGate:
    name: str = "canary"
    live: bool = True

    def run(self, ctx: FleetContext) -> QualityStageReport:
        url = ctx.plan.targets[0]
        checks, metrics_url = judging(ctx, "canary"), ctx.env.metrics_url(url)
        report = canary_gate(ctx.plan, ctx.settings, ctx.fleet, ctx.env.gpu, checks, metrics_url)
        return _passed(ctx, report)


@dataclass(frozen=True)
class ScratchGate:
    name: str = "scratch server"
    live: bool = False

    def run(self, ctx: FleetContext) -> QualityStageReport:
        if ctx.scratch is None:
            raise PromotionError(
                "the quality gate of a dry run needs a scratch tritonserver, and none was provided",
                fix="pass --skip-quality, or run the promotion through the mlreg CLI",
            )
        plan = ctx.plan
        live = ctx.fleet.target(plan.targets[0]) if plan.targets else None
        checks = judging(ctx, "scratch")
        report = preflight(plan, ctx.store, ctx.settings, ctx.scratch, ctx.fleet.connect, live, checks)
        return _passed(ctx, report)


def choose_gate(ctx: FleetContext) -> Gate | None:
    if GATE in ctx.options.skip:
        return None
    if ctx.options.dry_run:
        return ScratchGate()
    if not ctx.plan.targets:  # never a scratch server in a live promotion: the canary, or nothing
        raise PromotionError(
            f"environment '{ctx.env.name}' has no reachable target to run the quality gate on",
            fix="bring a replica back (or pass --skip-quality to promote without the gate)",
        )
    return CanaryGate()
