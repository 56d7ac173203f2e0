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
    from mlreg.ops.template import build_template  # lazy: the template builder, when this command runs

    settings = settings_of(ctx, state=False)
    out = Output(as_json)
    document = build_template(
        settings,
        out_dir,
        model,
        seed=seed,
        device=device,
        force=force,
        on_model=lambda name: out.note(f"  {name}"),
    )

    def human() -> None:
        out.line(f"built {len(document['models'])} models into {document['out']}")
        if document["cpu_rewritten"]:
            out.line(f"KIND_GPU -> KIND_CPU (no GPU here): {', '.join(document['cpu_rewritten'])}")

    out.result(document, human)
