"""``mlreg triton``: what Triton servers report."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mlreg.cli.common import JsonFlag, settings_of
from mlreg.cli.sink import Output

app = typer.Typer(help="Inspect Triton servers through the model-control API.", no_args_is_help=True)


def _human(out: Output, reports: list[dict[str, Any]]) -> None:
    for report in reports:
        if "error" in report:
            out.line(f"{report['url']}: unreachable: {report['error']}")
            continue
        out.line(f"{report['url']}: Triton {report['version']}")
        rows = [
            [model, ", ".join(f"{v or '-'}:{s}" for v, s in sorted(versions.items()))]
            for model, versions in sorted(report["models"].items())
        ]
        out.table(["MODEL", "VERSION:STATE"], rows)


@app.command("status")
def status_cmd(
    ctx: typer.Context,
    url: Annotated[
        list[str] | None,
        typer.Option("--url", "-u", help="gRPC URL host:port (repeatable; default: the local stack)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Server version and the models and versions each server has loaded (exit 6 if one is unreachable).

    Example: mlreg triton status --url triton-0:8001 --url triton-1:8001
    """
    from mlreg.ops.triton import triton_status  # lazy: grpc ~60 ms, this command only
    from registry.errors import TritonError  # lazy: with the line above

    reports = triton_status(settings_of(ctx, state=False), list(url or []))
    out = Output(as_json)
    out.result({"servers": reports}, lambda: _human(out, reports))
    if any("error" in r for r in reports):
        raise typer.Exit(TritonError.exit_code)
