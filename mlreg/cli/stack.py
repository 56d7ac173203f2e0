"""``mlreg stack``: the local stack (a real tritonserver on CPU, explicit model control)."""

from __future__ import annotations

import typer

from mlreg.cli.output import emit_json, handle_errors
from registry.settings import Settings

app = typer.Typer(help="Start, inspect and stop the local Triton stack.", no_args_is_help=True)


def _describe(data: dict[str, object]) -> None:
    for key in ("grpc_url", "http_url", "metrics_url", "pid", "repository", "log_path", "mlflow_url"):
        if key in data:
            typer.echo(f"  {key:<12} {data[key]}")


@app.command("up")
@handle_errors
def up_cmd(
    repository: str = typer.Option(
        None, "--repository", "-r", help="Model repository (default: .mlreg/model_repository)."
    ),
    load: list[str] = typer.Option(None, "--load", "-l", help="Load this model (repeatable)."),
    s3: bool = typer.Option(
        False,
        "--s3",
        help="Serve from a local S3 server (moto_server): the "
        "repository is pushed there and Triton reads s3://127.0.0.1:PORT/...",
    ),
    ui: bool = typer.Option(True, "--ui/--no-ui", help="Also start the MLflow UI on the local registry."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Start tritonserver (CPU, explicit model control) unless the project's one already runs.

    Example: mlreg stack up --repository .mlreg/model_repository --load ensemble_multi_modal_model
    """
    from pipelines.stack import stack_up

    status = stack_up(Settings.from_env(), repository=repository, load=load or (), s3=s3, ui=ui)
    if as_json:
        emit_json(status.to_dict() | {"already_running": status.already_running})
        return
    data = status.to_dict()
    typer.echo("tritonserver already running" if status.already_running else "tritonserver started")
    _describe(data)
    if status.loaded:
        typer.echo(f"  loaded       {', '.join(status.loaded)}")


@app.command("status")
@handle_errors
def status_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show the local stack: URLs, pid, repository and loaded models (exit 1 when not running)."""
    from pipelines.stack import stack_status

    status = stack_status(Settings.from_env())
    if as_json:
        emit_json(status.to_dict())
    elif not status.running:
        typer.echo("the local stack is not running (start it with 'mlreg stack up')")
    else:
        typer.echo("tritonserver running")
        _describe(status.to_dict())
        typer.echo(f"  loaded       {', '.join(status.loaded) or '(none)'}")
    if not status.running:
        raise typer.Exit(1)


@app.command("down")
@handle_errors
def down_cmd() -> None:
    """Stop the local stack (SIGTERM, then SIGKILL after a bound) and clean its shared memory."""
    from pipelines.stack import stack_down

    info = stack_down(Settings.from_env())
    typer.echo(
        "the local stack was not running" if info is None else f"stopped tritonserver (pid {info.pid})"
    )
