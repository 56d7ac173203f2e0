"""``mlreg validate``: the offline contract check."""

from __future__ import annotations

from pathlib import Path

import typer

from registry.cli.output import emit_json, handle_errors


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
