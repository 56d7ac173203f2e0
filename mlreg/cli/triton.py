"""``mlreg triton``: what Triton servers report."""

from __future__ import annotations

import typer

from mlreg.cli.output import emit_json, handle_errors
from registry.settings import Settings

app = typer.Typer(help="Inspect Triton servers through the model-control API.", no_args_is_help=True)


@app.command("status")
@handle_errors
def status_cmd(
    url: list[str] = typer.Option(
        None, "--url", "-u", help="gRPC URL host:port (repeatable; default: the local stack)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Server version and the models and versions each server has loaded.

    Example: mlreg triton status --url triton-0:8001 --url triton-1:8001
    """
    from pipelines.triton import server_report
    from registry.errors import UsageError

    settings = Settings.from_env()
    urls = list(url or [])
    if not urls:
        from pipelines.stack import running_server

        info = running_server(settings)
        if info is None:
            raise UsageError(
                "no --url given and the local stack is not running",
                fix="pass --url host:port or start it with 'mlreg stack up'",
            )
        urls = [info.grpc_url]
    reports = [server_report(u, timeout=settings.triton_timeout) for u in urls]
    if as_json:
        emit_json({"servers": reports})
    for report in [] if as_json else reports:
        if "error" in report:
            typer.echo(f"{report['url']}: unreachable: {report['error']}")
            continue
        typer.echo(f"{report['url']}: Triton {report['version']}")
        for model, versions in sorted(report["models"].items()):
            shown = ", ".join(f"{v or '-'}:{s}" for v, s in sorted(versions.items()))
            typer.echo(f"  {model:<30} {shown}")
    if any("error" in r for r in reports):
        raise typer.Exit(6)
