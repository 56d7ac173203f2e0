"""``mlreg template``: the seed's multimodal ensemble as a working Triton repository."""

from __future__ import annotations

from pathlib import Path

import typer

from mlreg.cli.output import emit_json, handle_errors
from registry.settings import Settings

app = typer.Typer(
    help="The model repository template (the seed's multimodal ensemble).", no_args_is_help=True
)


@app.command("build")
@handle_errors
def build_cmd(
    out: Path = typer.Argument(..., help="Folder to write the repository to."),
    model: list[str] = typer.Option(None, "--model", "-m", help="Build only this model (repeatable)."),
    seed: int = typer.Option(0, help="Random seed of the exported weights."),
    device: str = typer.Option(
        "auto",
        help="auto | cpu | gpu: KIND_GPU groups become KIND_CPU for cpu (auto: when no GPU is visible).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite models already in OUT."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Write the complete, loadable repository (configs, python models, exported artifacts).

    Example: mlreg template build .mlreg/model_repository --force
    """
    from registry import template

    settings = Settings.from_env()

    def progress(name: str) -> None:
        if not as_json:
            typer.echo(f"  {name}", err=True)

    result = template.build(
        settings.template_dir,
        out.resolve(),
        models=model or None,
        seed=seed,
        device=device,
        force=force,
        on_model=progress,
    )
    if as_json:
        emit_json(
            {
                "out": str(result.out),
                "models": result.models,
                "exported": result.exported,
                "cpu_rewritten": result.cpu_rewritten,
            }
        )
        return
    typer.echo(f"built {len(result.models)} models into {result.out}")
    if result.cpu_rewritten:
        typer.echo(f"KIND_GPU -> KIND_CPU (no GPU here): {', '.join(result.cpu_rewritten)}")
