"""``mlreg template``: the seed's multimodal ensemble as a working Triton repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlreg.cli.common import JsonFlag, settings_of
from mlreg.cli.sink import Output

app = typer.Typer(
    help="The model repository template (the seed's multimodal ensemble).", no_args_is_help=True
)


@app.command("build")
def build_cmd(
    ctx: typer.Context,
    out_dir: Annotated[Path, typer.Argument(metavar="OUT", help="Folder to write the repository to.")],
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Build only this model (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the exported weights.")] = 0,
    device: Annotated[
        str,
        typer.Option(
            help="auto | cpu | gpu: KIND_GPU groups become KIND_CPU for cpu (auto: when no GPU is visible)."
        ),
    ] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Overwrite models already in OUT.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Write the complete, loadable repository (configs, python models, exported artifacts).

    Example: mlreg template build .mlreg/model_repository --force
    """
    from registry import template  # lazy: the template builder loads only when this command runs

    settings = settings_of(ctx, state=False)
    out = Output(as_json)
    result = template.build(
        settings.template_dir,
        out_dir.resolve(),
        models=model or None,
        seed=seed,
        device=device,
        force=force,
        on_model=lambda name: out.note(f"  {name}"),
    )
    document = {
        "out": str(result.out),
        "models": result.models,
        "exported": result.exported,
        "cpu_rewritten": result.cpu_rewritten,
    }

    def human() -> None:
        out.line(f"built {len(result.models)} models into {result.out}")
        if result.cpu_rewritten:
            out.line(f"KIND_GPU -> KIND_CPU (no GPU here): {', '.join(result.cpu_rewritten)}")

    out.result(document, human)
