"""``mlreg validate`` and ``mlreg diff``: the offline contract checks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlreg.cli.common import JsonFlag
from mlreg.cli.sink import Output


def validate_cmd(
    path: Annotated[Path, typer.Argument(help="A model repository folder or one model folder.")],
    as_json: JsonFlag = False,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=0, help="GPUs of the serving machine (default: MLREG_GPUS; unknown)."),
    ] = None,
) -> None:
    """Check config.pbtxt files, model signatures and ensemble wiring offline, with Triton's rules.

    Findings Triton itself refuses use its wording; '[mlreg]' marks what mlreg adds beyond Triton
    (configs Triton loads that fail at inference, and policy).

    Exit 0 when no error was found, 1 when any error finding, 2 for usage errors.

    Example: mlreg validate model_repository_template
    """
    from mlreg.ops.validate import validate  # lazy: ~9 ms (the contracts), this command only

    report = validate(path, gpus=gpus)
    out = Output(as_json)

    def human() -> None:
        for finding in report.findings:
            out.line(f"{finding.severity}: {finding.line()}")
        out.line(report.summary())

    out.result(report.to_dict(), human)
    if report.errors:
        raise typer.Exit(1)


def diff_cmd(
    old: Annotated[Path, typer.Argument(help="The serving version: model folder or config.pbtxt.")],
    new: Annotated[Path, typer.Argument(help="The candidate version: model folder or config.pbtxt.")],
    repository: Annotated[
        Path | None,
        typer.Option(
            "--repository", "-r", help="Check the new contract against this repository's ensembles."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Compare two versions' tensor contracts; exit 1 when the change is breaking.

    Example: mlreg diff serving/image_model candidate/image_model -r serving
    """
    from mlreg.ops.validate import diff  # lazy: ~9 ms (the contracts), this command only

    result = diff(old, new, repository)
    out = Output(as_json)

    def human() -> None:
        for change in result.changes:
            out.line(change.line())
        for finding in result.ensemble_findings:
            out.line(f"{finding.severity}: {finding.line()}")
        verdict = "breaking" if result.breaking else "compatible"
        out.line(f"{result.model}: {len(result.changes)} change(s), {verdict}")

    out.result(result.to_dict(), human)
    if result.breaking:
        raise typer.Exit(1)
