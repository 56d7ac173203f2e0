"""``mlreg validate``: the offline contract check."""

from __future__ import annotations

from pathlib import Path

import typer

from mlreg.cli.output import emit_json, handle_errors


@handle_errors
def validate_cmd(
    path: Path = typer.Argument(..., help="A model repository folder or one model folder."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Check config.pbtxt files, model signatures and ensemble wiring offline, with Triton's rules.

    Exit 0 when no error was found, 1 when any error finding, 2 for usage errors.

    Example: mlreg validate model_repository_template
    """
    from registry.contracts.validate import validate_path
    from registry.errors import UsageError

    if not path.exists():
        raise UsageError(f"'{path}' does not exist", fix="pass a model repository or model folder")
    report = validate_path(path)
    if as_json:
        emit_json(report.to_dict())
    else:
        for finding in report.findings:
            typer.echo(f"{finding.severity}: {finding.line()}")
        typer.echo(report.summary())
    if report.errors:
        raise typer.Exit(1)


def _config_of(path: Path):
    from registry.contracts.config import CONFIG_NAME, load_config
    from registry.errors import UsageError

    file = path / CONFIG_NAME if path.is_dir() else path
    if not file.is_file():
        raise UsageError(
            f"'{path}' is neither a config.pbtxt nor a model folder holding one",
            fix="pass two model folders (or two config.pbtxt files)",
        )
    return load_config(file)


@handle_errors
def diff_cmd(
    old: Path = typer.Argument(..., help="The serving version: model folder or config.pbtxt."),
    new: Path = typer.Argument(..., help="The candidate version: model folder or config.pbtxt."),
    repository: Path = typer.Option(
        None, "--repository", "-r", help="Check the new contract against this repository's ensembles."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Compare two versions' tensor contracts; exit 1 when the change is breaking.

    Example: mlreg diff serving/image_model candidate/image_model -r serving
    """
    from registry.contracts.diff import diff_model
    from registry.contracts.repository import read_repository

    repo = read_repository(repository) if repository else None
    result = diff_model(_config_of(old), _config_of(new), repo)
    if as_json:
        emit_json(result.to_dict())
    else:
        for change in result.changes:
            typer.echo(change.line())
        for finding in result.ensemble_findings:
            typer.echo(f"{finding.severity}: {finding.line()}")
        verdict = "breaking" if result.breaking else "compatible"
        typer.echo(f"{result.model}: {len(result.changes)} change(s), {verdict}")
    if result.breaking:
        raise typer.Exit(1)
