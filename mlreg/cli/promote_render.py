"""What ``mlreg promote`` and ``mlreg rollback`` print: each stage as it ends (stderr), then the
promotion's report -- its JSON document, the plan of a dry run, or the one line of a promotion."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import typer

from mlreg.cli.output import rollout_line
from mlreg.cli.sink import Output
from registry.settings import redact_uri

if TYPE_CHECKING:
    from pipelines.core.options import OnStage
    from pipelines.core.reports import PromotionResult


def _stage_text(stage: str, status: str, seconds: float, detail: str) -> str:
    return f"{'✓' if status == 'ok' else '✗'} {stage:<9} {seconds:6.2f}s  {detail}"


def stage_lines(out: Output) -> OnStage:
    def report(stage: str, status: str, seconds: float, detail: str) -> None:
        out.note(_stage_text(stage, status, seconds, detail))

    return report


def batch_stage(stage: str, status: str, seconds: float, detail: str) -> None:
    """A batch's stage as it ends (``promote --from-*``, ``fleet sync``): on stderr even with --json."""
    typer.echo(redact_uri(_stage_text(stage, status, seconds, detail)), err=True)


def failure_lines(failed: Iterable[Mapping[str, Any]]) -> None:
    """``error:`` and ``fix:`` on stderr for each failed promotion of a batch, even with --json."""
    for entry in failed:
        typer.echo(redact_uri(f"error: {entry['model']} v{entry['version']}: {entry['error']}"), err=True)
        if entry.get("fix"):
            typer.echo(redact_uri(f"fix: {entry['fix']}"), err=True)


def promotion(out: Output, call: Callable[[], PromotionResult]) -> PromotionResult:
    """Run ``call``; with --json a failed promotion still prints its report (then the error)."""
    try:
        result = call()
    except Exception as exc:
        # a PromotionFailed exists only once its module is imported: a refusal before the
        # promotion package loads (an unknown model, from the registry alone) does not import it
        reports = sys.modules.get("pipelines.core.reports")
        if out.json and reports is not None and isinstance(exc, reports.PromotionFailed):
            out.document(exc.result.to_dict())
        raise
    return result


def render(out: Output, result: PromotionResult, alias: str) -> None:
    plan = result.plan
    if out.json:
        out.document(result.to_dict())
    elif result.noop:
        out.line(f"{plan.model} version {plan.version} already serves in '{plan.env.name}': nothing to do")
    elif "record" not in result.stage_names():
        out.line(f"plan (dry run) for {plan.model} v{plan.version} in '{plan.env.name}' ({plan.env.store}):")
        out.table(
            ["ROLE", "MODEL", "VERSION", "UPLOAD", "CONFIG", "SERVING NOW"],
            [
                [
                    s.role.value,
                    s.model,
                    s.version,
                    "yes" if s.upload else "no",
                    "changes" if s.previous_config != s.config_text else "unchanged",
                    ",".join(s.previous_versions) or "nothing",
                ]
                for s in plan.steps
            ],
        )
        rollout = plan.rollout()
        if rollout is None:
            out.line(f"load on: {', '.join(plan.targets)} (first = canary)")
        else:
            out.line(f"roll-out: {rollout_line(rollout)}")
    else:
        out.line(
            f"promoted {plan.model} version {plan.version} to '{plan.env.name}' "
            f"(alias '{alias}'); MLflow run {result.run_id}"
        )
    for note in result.notes:
        out.note(f"note: {note}")
