"""``mlreg validate`` and ``mlreg diff``: the offline contract checks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlreg.cli.common import JsonFlag
from mlreg.cli.sink import Output

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


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
    from registry.contracts.validate import validate_path  # lazy: ~9 ms, this command only
    from registry.errors import UsageError  # lazy: with the line above

    if not path.exists():
        raise UsageError(f"'{path}' does not exist", fix="pass a model repository or model folder")
    report = validate_path(path, gpus=gpus)
    out = Output(as_json)

    def human() -> None:
        for finding in report.findings:
            out.line(f"{finding.severity}: {finding.line()}")
        out.line(report.summary())

    out.result(report.to_dict(), human)
    if report.errors:
        raise typer.Exit(1)


def _config_of(path: Path) -> ModelConfig:
    from registry.contracts.config import CONFIG_NAME, load_config  # lazy: ~9 ms, this command only
    from registry.errors import UsageError  # lazy: with the line above

    file = path / CONFIG_NAME if path.is_dir() else path
    if not file.is_file():
        raise UsageError(
            f"'{path}' is neither a config.pbtxt nor a model folder holding one",
            fix="pass two model folders (or two config.pbtxt files)",
        )
    return load_config(file)


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
    from registry.contracts.diff import diff_model  # lazy: ~9 ms, this command only
    from registry.contracts.repository import read_repository  # lazy: with the line above

    repo = read_repository(repository) if repository else None
    result = diff_model(_config_of(old), _config_of(new), repo)
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
