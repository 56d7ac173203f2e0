"""`mlreg promote`, `rollback`, `status`, `history`: thin wrappers over pipelines.promote."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from mlreg.cli.output import emit_json, handle_errors
from registry.settings import Settings


def _context(env_name: str):
    from pipelines.promote.environments import environment
    from registry.mlflow_registry import MlflowRegistry

    settings = Settings.from_env()
    return settings, environment(settings, env_name), MlflowRegistry(settings)


def _on_stage(quiet: bool):
    def report(stage: str, status: str, seconds: float, detail: str) -> None:
        if not quiet:
            mark = "✓" if status == "ok" else "✗"
            typer.echo(f"{mark} {stage:<9} {seconds:6.2f}s  {detail}", err=True)

    return report


def _run(model: str, version: str, env: str, as_json: bool, **options: object) -> None:
    from pipelines.promote.runner import Options, Promotion
    from registry.errors import PromotionError

    settings, environment, registry = _context(env)
    promotion = Promotion(settings, environment, registry, Options(on_stage=_on_stage(as_json), **options))  # type: ignore[arg-type]
    try:
        result = promotion.run(model, version)
    except PromotionError as exc:
        if as_json and "result" in exc.context:
            emit_json(exc.context["result"].to_dict())  # type: ignore[attr-defined]
        raise
    if as_json:
        emit_json(result.to_dict())
        return
    plan = result.plan
    if options.get("dry_run"):
        typer.echo(f"plan (dry run) for {model} v{version} in '{env}' ({environment.store}):")
        for step in plan.steps:
            typer.echo(
                f"  {step.role:<8} {step.model} v{step.version}: "
                f"{'upload, ' if step.upload else ''}config "
                f"{'changes' if step.previous_config != step.config_text else 'unchanged'}, "
                f"serving v{','.join(step.previous_versions) or 'nothing'} -> v{step.version}"
            )
        typer.echo(f"  load on: {', '.join(plan.targets)} (first = canary)")
    elif result.stages and result.stages[-1]["stage"] == "noop":
        typer.echo(f"{model} version {version} already serves in '{env}': nothing to do")
    else:
        typer.echo(
            f"promoted {model} version {version} to '{env}' "
            f"(alias '{environment.alias}'); MLflow run {result.run_id}"
        )


@handle_errors
def promote_cmd(
    model: str = typer.Argument(None, help="Registered model name."),
    version: str = typer.Option(None, "--version", "-V", help="Registered version to promote."),
    env: str = typer.Option("local", "--env", "-e", help="Environment (mlreg.toml); default local."),
    from_alias: str = typer.Option(
        None, "--from-alias", help="Promote every version this alias holds that --env lacks (CI)."
    ),
    from_file: Path = typer.Option(
        None, "--from-file", help="Promote the versions an 'mlreg export --changed --json' listed (CI)."
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
    as_json: bool = typer.Option(False, "--json", help="One JSON document for CI."),
) -> None:
    """Promote a registered version: validate, quality gate, upload, swap with no failed request.

    Example: mlreg promote image_model --version 2
    """
    from registry.errors import UsageError

    if serve_as not in {"auto", "native", "onnx"}:
        raise UsageError(f"unknown --serve-as '{serve_as}'", fix="use auto, native or onnx")
    options = dict(
        dry_run=dry_run, allow_breaking=allow_breaking, skip_quality=skip_quality, serve_as=serve_as
    )
    if from_alias or from_file:  # several versions, members first: mlreg/cli/report.py
        from mlreg.cli.report import promote_many_cmd

        return promote_many_cmd(env, from_alias, from_file, as_json, **options)
    if not model or not version:
        raise UsageError(
            "no version to promote", fix="pass MODEL --version N (or --from-alias / --from-file)"
        )
    _run(
        model,
        version,
        env,
        as_json,
        dry_run=dry_run,
        allow_breaking=allow_breaking,
        skip_quality=skip_quality,
        serve_as=serve_as,
    )


@handle_errors
def rollback_cmd(
    model: str = typer.Argument(..., help="Registered model name."),
    to_version: str = typer.Option(
        None, "--to-version", help="Version to return to (default: the one promoted before the current)."
    ),
    env: str = typer.Option("local", "--env", "-e", help="Environment; default local."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document for CI."),
) -> None:
    """Serve an earlier version again (a promotion without the quality gate).

    Example: mlreg rollback image_model --to-version 1
    """
    from pipelines.promote.status import previous_version
    from registry.errors import UsageError

    if to_version is None:
        to_version = previous_version(_context(env)[2], model, env)
        if to_version is None:
            raise UsageError(
                f"no earlier promotion of {model} in '{env}' to return to", fix="pass --to-version N"
            )
    _run(model, to_version, env, as_json, allow_breaking=True, skip_quality=True)


@handle_errors
def status_cmd(
    model: str = typer.Argument(None, help="One model (default: every model in the store)."),
    env: str = typer.Option("local", "--env", "-e", help="Environment; default local."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Registry alias vs the store's desired state vs what each Triton serves (drift flagged)."""
    from pipelines.promote.status import model_status

    settings, environment, registry = _context(env)
    rows = model_status(settings, environment, registry, [model] if model else None)
    if as_json:
        emit_json({"environment": env, "models": rows})
    else:
        typer.echo(f"{'MODEL':<30} {'ALIAS':>6} {'DESIRED':>8}  SERVING")
        for r in rows:
            serving = (
                "; ".join(
                    f"{u}: {','.join(v) if isinstance(v, list) else v}" for u, v in r["serving"].items()
                )
                or "-"
            )
            typer.echo(
                f"{r['model']:<30} {r['alias'] or '-':>6} {','.join(r['desired']) or '-':>8}  {serving}"
            )
            if "pins" in r:
                typer.echo("  pins: " + ", ".join(f"{m} v{v}" for m, v in sorted(r["pins"].items())))
            for line in r["drift"]:
                typer.echo(f"  drift: {line}")
    if any(r["drift"] for r in rows):
        raise typer.Exit(1)


@handle_errors
def history_cmd(
    model: str = typer.Argument(..., help="Registered model name."),
    env: str = typer.Option(None, "--env", "-e", help="Only this environment."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Every promotion of MODEL: when, where, from → to, result, who."""
    from pipelines.promote.status import history

    _, _, registry = _context(env or "local")
    rows = history(registry, model, env)
    if as_json:
        emit_json({"model": model, "promotions": rows})
        return
    for h in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["when"] / 1000))
        typer.echo(
            f"{when}  {h['environment']:<10} v{h['from']} -> v{h['to']}  {h['result']:<12} "
            f"{h['user']}  run {h['run_id']}"
        )
