"""`mlreg promote`, `rollback`, `status`, `history`: parse, call ``mlreg.service``, render."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from mlreg.cli.common import EnvName, JsonFlag, positive_version, settings_of
from mlreg.cli.output import Output, rollout_line

if TYPE_CHECKING:
    from pipelines.promote.reports import PromotionResult
    from pipelines.promote.runner import OnStage


def _stage_lines(out: Output) -> OnStage:
    def report(stage: str, status: str, seconds: float, detail: str) -> None:
        out.note(f"{'✓' if status == 'ok' else '✗'} {stage:<9} {seconds:6.2f}s  {detail}")

    return report


def _promotion(out: Output, call: Callable[[], PromotionResult]) -> PromotionResult:
    """Run ``call``; with --json a failed promotion still prints its report (then the error)."""
    from pipelines.promote.reports import PromotionFailed

    try:
        result = call()
    except PromotionFailed as exc:
        if out.json:
            out.document(exc.result.to_dict())
        raise
    return result


def _render(out: Output, result: PromotionResult, alias: str) -> None:
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


def promote_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="Registered model name."),
    version: str = typer.Option(
        None, "--version", "-V", help="Registered version to promote.", callback=positive_version
    ),
    env: EnvName = "local",
    from_alias: str = typer.Option(
        None,
        "--from-alias",
        help="Promote every version this alias holds that --env lacks (CI); with MODEL, only MODEL's. "
        "An alias no version holds is an error (exit 4).",
    ),
    from_file: Path = typer.Option(
        None,
        "--from-file",
        help="Promote the versions an 'mlreg export --changed --json' listed (CI); takes no MODEL.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    allow_breaking: bool = typer.Option(False, "--allow-breaking", help="Allow a contract-breaking change."),
    serve_as: str = typer.Option(
        "auto",
        "--serve-as",
        help="auto | native | onnx: a SavedModel is "
        "converted to ONNX (tf2onnx, parity-checked, registered) for onnx, "
        "or for auto when a target's Triton has no TensorFlow backend.",
    ),
    skip_quality: bool = typer.Option(False, "--skip-quality", help="Skip the pre-flight quality gate."),
    skip_perf: bool = typer.Option(
        False,
        "--skip-perf",
        help="Skip the gate's performance check (the candidate's latency against the serving "
        "version's on the canary); the golden-input checks still run.",
    ),
    skip_shadow: bool = typer.Option(
        False,
        "--skip-shadow",
        help="Skip only the gate's shadow replay (the candidate answering the requests production "
        "sent, captured where the environment's [shadow] table says); every other check still runs.",
    ),
    no_way_back: bool = typer.Option(
        False,
        "--no-way-back",
        help="Promote although the serving version's bytes (or signature) no longer verify in the "
        "store nor the registry: an abort then leaves the model as it serves instead of loading "
        "unverified bytes. Without it such a promotion is refused before any change.",
    ),
    as_json: JsonFlag = False,
) -> None:
    """Promote a registered version: validate, quality gate, upload, swap with no failed request.

    Example: mlreg promote image_model --version 2

    Example: mlreg promote image_model --from-alias staging --env production (the version staging
    holds, only image_model's)
    """
    from mlreg import service
    from registry.errors import UsageError

    options = dict(
        dry_run=dry_run,
        allow_breaking=allow_breaking,
        skip_quality=skip_quality,
        serve_as=serve_as,
        skip_perf=skip_perf,
        no_way_back=no_way_back,
        skip_shadow=skip_shadow,
    )
    if from_alias or from_file:  # several versions, members first: mlreg/cli/report.py
        from mlreg.cli.report import promote_many_cmd

        if version:
            raise UsageError(
                "--version and --from-alias/--from-file exclude each other: the alias or file names it",
                fix="drop --version, or drop --from-alias/--from-file to promote MODEL --version N",
            )
        settings = settings_of(ctx)
        return promote_many_cmd(settings, env, from_alias, from_file, as_json, model=model, **options)
    if not model or not version:
        raise UsageError(
            "no version to promote", fix="pass MODEL --version N (or --from-alias / --from-file)"
        )
    settings, out = settings_of(ctx), Output(as_json)
    result = _promotion(
        out,
        lambda: service.promote(
            settings,
            env,
            model,
            version,
            dry_run=dry_run,
            allow_breaking=allow_breaking,
            skip_quality=skip_quality,
            serve_as=serve_as,
            on_stage=_stage_lines(out),
            skip_perf=skip_perf,
            no_way_back=no_way_back,
            skip_shadow=skip_shadow,
        ),
    )
    _render(out, result, result.plan.env.alias)


def rollback_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Registered model name."),
    to_version: str = typer.Option(
        None,
        "--to-version",
        help="Version to return to (default: the one promoted before the current).",
        callback=positive_version,
    ),
    env: EnvName = "local",
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    as_json: JsonFlag = False,
) -> None:
    """Serve an earlier version again (a promotion without the quality gate).

    Example: mlreg rollback image_model --to-version 1
    """
    from mlreg import service

    settings, out = settings_of(ctx), Output(as_json)
    result = _promotion(
        out,
        lambda: service.rollback(
            settings, env, model, to_version, dry_run=dry_run, on_stage=_stage_lines(out)
        ),
    )
    _render(out, result, result.plan.env.alias)


def status_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="One model (default: every model in the store)."),
    env: EnvName = "local",
    as_json: JsonFlag = False,
) -> None:
    """Registry alias vs the store's desired state vs what each Triton serves (drift: exit 1)."""
    from mlreg import service

    out = Output(as_json)
    report = service.status(settings_of(ctx), env, model)
    out.result(report.to_dict(), lambda: _status_table(out, report.models))
    for lock in report.locks:
        stale = " (stale: 'mlreg store unlock' may remove it)" if lock["stale"] else ""
        lease = (
            f"lease ran out at {lock['lease_until']}"
            if lock["stale"]
            else f"lease until {lock['lease_until']}"
        )
        out.line(f"locked: {lock['model']} by {lock['owner']}, {lease}{stale}")
    if report.store_error and not as_json:
        out.line(f"store unreachable: {report.store_error} (fix: {report.store_fix})")
    if not as_json:
        from pipelines.promote.replicas import OPEN_CONTROL

        for url in report.open_control:
            out.line("warning: " + OPEN_CONTROL.format(url=url))
    if report.drift:
        raise typer.Exit(1)


def _status_table(out: Output, rows: list[dict[str, Any]]) -> None:
    """MLflow versions in every column, the Triton folder in brackets where it differs (``2 [1]``)."""
    from pipelines.promote.status import labels  # heavy (numpy): loaded by the status itself

    def serving(row: dict[str, Any]) -> str:
        found, folders = row["serving"], row["serving_folders"]
        return "; ".join(
            f"{u}: {labels(v, folders[u]) if isinstance(v, list) else v}" for u, v in found.items()
        )

    out.table(
        ["MODEL", "ALIAS", "DESIRED", "SERVING"],
        [[r["model"], r["alias"], labels(r["desired"], r["desired_folders"]), serving(r)] for r in rows],
        right=["ALIAS", "DESIRED"],
    )
    for r in rows:
        pins = r.get("pins")
        if isinstance(pins, dict):
            out.line(f"{r['model']} pins: " + ", ".join(f"{m} v{v}" for m, v in sorted(pins.items())))
        for line in r["drift"]:
            out.line(f"{r['model']} drift: {line}")


def history_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Registered model name."),
    env: str = typer.Option(None, "--env", "-e", help="Only this environment."),
    as_json: JsonFlag = False,
) -> None:
    """Every promotion of MODEL: when, where, from → to, result, who."""
    from mlreg import service

    out = Output(as_json)
    rows = service.history(settings_of(ctx), model, env)
    out.result(
        {"model": model, "promotions": rows},
        lambda: out.table(
            ["WHEN", "ENV", "FROM", "TO", "RESULT", "USER", "RUN"],
            [
                [
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["when"] / 1000)),
                    h["environment"],
                    h["from"],
                    h["to"],
                    h["result"],
                    h["user"],
                    h["run_id"],
                ]
                for h in rows
            ],
        ),
    )
    if not rows:
        out.line(f"no promotion of {model} yet")
