"""Registry commands: export, register, versions, show, alias."""

from __future__ import annotations

from pathlib import Path

import typer

from mlreg.cli.output import emit_json, handle_errors
from registry.settings import Settings

alias_app = typer.Typer(help="Set or remove a registered model's aliases.", no_args_is_help=True)


def _print_results(results: list, as_json: bool) -> None:  # type: ignore[type-arg]
    if as_json:
        emit_json({"versions": [r.to_dict() for r in results]})
        return
    for r in results:
        verb = "registered" if r.created else "unchanged, matches"
        typer.echo(f"{r.model}: {verb} version {r.version} (validation {r.validation})")
        for line in r.findings:
            typer.echo(f"  error: {line}")


@handle_errors
def export_cmd(
    models: list[str] = typer.Argument(None, help="Template models to export (default: all)."),
    seed: int = typer.Option(0, help="Random seed of the exported weights (another seed, another version)."),
    force: bool = typer.Option(False, "--force", help="Register even when identical bytes are registered."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Run the template's exporters and register every result as an MLflow model version.

    Example: mlreg export image_model --seed 7
    """
    from registry.export import export_models
    from registry.mlflow_registry import MlflowRegistry

    settings = Settings.from_env()
    results = export_models(settings, MlflowRegistry(settings), models or None, seed=seed, force=force)
    _print_results(results, as_json)


@handle_errors
def register_cmd(
    model: str = typer.Argument(..., help="The registered model's name."),
    path: Path = typer.Argument(
        ...,
        help="A Triton model folder (config.pbtxt + one version folder) or a version folder with --config.",
    ),
    config: Path = typer.Option(None, "--config", help="config.pbtxt, when PATH is a version folder."),
    force: bool = typer.Option(False, "--force", help="Register even when identical bytes are registered."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Register a version exported elsewhere (validated; a failing contract is tagged validation=failed).

    Example: mlreg register image_model build/image_model
    """
    from registry.errors import UsageError
    from registry.mlflow_registry import MlflowRegistry
    from registry.register import find_candidate, register

    candidate = find_candidate(path, config)
    if candidate.name != model:
        raise UsageError(
            f"'{path}' holds model '{candidate.name}', not '{model}'",
            fix=f"run 'mlreg register {candidate.name} {path}' or fix the config's name",
        )
    result = register(MlflowRegistry(Settings.from_env()), candidate, force=force)
    _print_results([result], as_json)


@handle_errors
def versions_cmd(
    model: str = typer.Argument(..., help="The registered model's name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List a model's versions: created, aliases, validation status, where promoted."""
    from registry.queries import list_versions

    rows = list_versions(Settings.from_env(), model)
    if as_json:
        emit_json({"model": model, "versions": rows})
        return
    if not rows:
        typer.echo(f"{model}: no versions registered")
        return
    typer.echo(f"{'VERSION':>7}  {'CREATED (UTC)':<19}  {'VALIDATION':<10}  {'ALIASES':<20}  PROMOTED")
    for r in rows:
        typer.echo(
            f"{r['version']:>7}  {r['created']:<19}  {r['validation']:<10}  "
            f"{','.join(r['aliases']) or '-':<20}  {','.join(r['promoted']) or '-'}"
        )


@handle_errors
def show_cmd(
    model: str = typer.Argument(..., help="The registered model's name."),
    version: str = typer.Option(..., "--version", "-V", help="The version to show."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show one version: lineage, contract and files."""
    from registry.queries import show_version

    data = show_version(Settings.from_env(), model, version)
    if as_json:
        emit_json(data)
        return
    typer.echo(
        f"{model} version {data['version']} (created {data['created']} UTC, aliases: "
        f"{', '.join(data['aliases']) or '-'})"
    )
    typer.echo("lineage:")
    for key, value in data["lineage"].items():
        typer.echo(f"  {key:<16} {value}")
    for member, mv in sorted(data["members"].items()):
        typer.echo(f"  member           {member} version {mv}")
    contract = data["contract"]
    typer.echo(f"contract: {contract['platform']}, max_batch_size {contract['max_batch_size']}")
    for io in ("inputs", "outputs"):
        for t in contract[io]:
            typer.echo(f"  {io[:-1]:<6} {t['name']:<28} {t['dtype']:<6} {t['shape']}")
    typer.echo(f"files ({len(data['files'])}):")
    for rel, meta in sorted(data["files"].items()):
        typer.echo(f"  {rel:<50} {meta['size']:>10,}  {meta['sha256'][:12]}")


@alias_app.command("set")
@handle_errors
def alias_set(model: str, alias: str, version: str) -> None:
    """Point ALIAS of MODEL at VERSION.  Example: mlreg alias set image_model staging 2"""
    from registry.mlflow_registry import MlflowRegistry

    MlflowRegistry(Settings.from_env()).set_alias(model, alias, version)
    typer.echo(f"{model}@{alias} -> version {version}")


@alias_app.command("rm")
@handle_errors
def alias_rm(model: str, alias: str) -> None:
    """Remove ALIAS from MODEL.  Example: mlreg alias rm image_model staging"""
    from registry.mlflow_registry import MlflowRegistry

    MlflowRegistry(Settings.from_env()).delete_alias(model, alias)
    typer.echo(f"{model}@{alias} removed")
