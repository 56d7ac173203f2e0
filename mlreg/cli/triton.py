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
    from pipelines.triton.control import server_report  # lazy: grpc ~60 ms, this command only
    from pipelines.triton.control_key import control_key  # lazy: grpc ~60 ms, this command only
    from registry.errors import TritonError, UsageError  # lazy: with the lines above

    settings = settings_of(ctx, state=False)
    urls = list(url or [])
    if not urls:
        from pipelines.devstack.stack import running_server  # lazy: ~90 ms, only without a URL

        info = running_server(settings)
        if info is None:
            raise UsageError(
                "no --url given and the local stack is not running",
                fix="pass --url host:port or start it with 'mlreg stack up'",
            )
        urls = [info.grpc_url]
    key = control_key(settings.home)
    reports = [server_report(u, timeout=settings.triton_timeout, key=key) for u in urls]
    out = Output(as_json)
    out.result({"servers": reports}, lambda: _human(out, reports))
    if any("error" in r for r in reports):
        raise typer.Exit(TritonError.exit_code)
