"""``mlreg init``: a project of your own (:mod:`mlreg.ops.init` does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlreg.cli.common import JsonFlag
from mlreg.cli.sink import Output


def init_cmd(
    path: Annotated[Path, typer.Argument(help="The project folder (default: here).")] = Path("."),
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="FILE",
            help="A model to start from: an ONNX file, a SavedModel folder or a python-backend model.py.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The model's name (default: from the file's name).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files that exist.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a commented mlreg.toml and, with --from, a model folder models/NAME (config.pbtxt
    completed as Triton would, version 1, golden inputs from its contract) that 'mlreg validate'
    passes.  Nothing that exists is overwritten without --force.

    Example: mlreg init . --from build/classifier.onnx --name classifier
    """
    from mlreg.ops.init import init_project  # lazy: the contracts and the registry's rules, when run

    report = init_project(path, source, name, force=force)
    out = Output(as_json)

    def human() -> None:
        for written in report.written:
            out.line(f"wrote {path / written}")
        for kept in report.kept:
            out.line(f"kept {path / kept} (it exists; --force rewrites it)")
        if report.model:
            out.line(f"next: mlreg validate {path / 'models' / report.model}")
            out.line(f"      mlreg register {report.model} {path / 'models' / report.model}")

    out.result(report.to_dict(), human)
