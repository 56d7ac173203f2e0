"""``mlreg stack``: the local stack (a real tritonserver on CPU, explicit model control)."""

from __future__ import annotations

from typing import Annotated

import typer

from mlreg.cli.common import JsonFlag, settings_of
from mlreg.cli.progress import activity
from mlreg.cli.sink import Output

app = typer.Typer(help="Start, inspect and stop the local Triton stack.", no_args_is_help=True)
SHOWN = (
    "grpc_url",
    "http_url",
    "metrics_url",
    "pid",
    "repository",
    "log_path",
    "mlflow_url",
    "loaded",
    "restored",
    "not_restored",
    "replicas",
)


def _describe(out: Output, data: dict[str, object]) -> None:
    shown = {key: data[key] for key in SHOWN if key in data}
    for key in ("restored", "not_restored"):  # a start on a store that says nothing should serve
        if not shown.get(key):
            shown.pop(key, None)
    for key in ("loaded", "restored"):
        if isinstance(shown.get(key), list):
            shown[key] = ", ".join(shown[key]) or "(none)"  # type: ignore[arg-type]
    if isinstance(shown.get("not_restored"), list):  # each with why
        shown["not_restored"] = "; ".join(shown["not_restored"])  # type: ignore[arg-type]
    servers = data.get("servers")
    if isinstance(servers, list) and len(servers) > 1:  # every replica's ports, not only replica 0's
        del shown["replicas"]
        shown.update({f"replica {s['replica']}": _ports(s) for s in servers})
    out.fields(shown)


def _ports(server: dict[str, object]) -> str:
    grpc, http, metrics = server["grpc_url"], server["http_url"], server["metrics_url"]
    return f"grpc {grpc}  http {http}  metrics {metrics}  (pid {server['pid']})"


@app.command("up")
def up_cmd(
    ctx: typer.Context,
    repository: Annotated[
        str | None,
        typer.Option(
            "--repository",
            "-r",
            help="Model repository (default: .mlreg/model_repository, created empty if missing).",
        ),
    ] = None,
    load: Annotated[
        list[str] | None, typer.Option("--load", "-l", help="Load this model (repeatable).")
    ] = None,
    s3: Annotated[
        bool,
        typer.Option(
            "--s3",
            help="Serve from a local S3 server (moto_server): the repository is copied there as "
            "stored, Triton reads s3://127.0.0.1:PORT/..., the local environment writes there, and "
            "'stack down' copies it back to .mlreg/model_repository (moto keeps it in memory only).",
        ),
    ] = False,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Also start the MLflow UI on the local registry.")
    ] = True,
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            min=1,
            help="Start N tritonservers on the same repository; the 'local' environment targets them all.",
        ),
    ] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Start tritonserver (CPU, explicit model control) unless the project's one already runs.

    With no --repository and nothing built yet, the server starts on an empty repository,
    ready for 'mlreg promote'.  A server it starts serves what the repository's configs say
    should serve (what was promoted), each version verified against MLflow's digest first.

    Example: mlreg stack up --repository .mlreg/model_repository --load ensemble_multi_modal_model
    """
    from mlreg.ops.stack import stack_up  # lazy: ~90 ms (grpc, psutil), this command only

    settings = settings_of(ctx)
    with activity(quiet=as_json, settings=settings) as step:  # a line on a terminal only
        status = stack_up(
            settings, repository=repository, load=load or (), s3=s3, ui=ui, replicas=replicas, step=step
        )
    out = Output(as_json)
    if out.json:
        out.document(status.to_dict() | {"already_running": status.already_running})
        return
    out.line("tritonserver already running" if status.already_running else "tritonserver started")
    _describe(out, status.to_dict())


@app.command("status")
def status_cmd(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show the local stack: URLs, pid, repository and loaded models (exit 1 when not running)."""
    from mlreg.ops.stack import stack_status  # lazy: ~90 ms (grpc, psutil), this command only

    status = stack_status(settings_of(ctx))
    out = Output(as_json)
    if out.json:
        out.document(status.to_dict())
    elif not status.running:
        out.line("the local stack is not running (start it with 'mlreg stack up')")
    else:
        out.line("tritonserver running")
        _describe(out, status.to_dict() | {"loaded": status.loaded})
    if not status.running:
        raise typer.Exit(1)


@app.command("down")
def down_cmd(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Stop the local stack: each replica's tritonserver and python stubs (SIGTERM, then SIGKILL to
    the process group after a bound) and its shared memory."""
    from mlreg.ops.stack import stack_down  # lazy: ~90 ms (grpc, psutil), this command only

    stopped = stack_down(settings_of(ctx))
    out = Output(as_json)

    def human() -> None:
        for line in [r.describe() for r in stopped.replicas] or ["the local stack was not running"]:
            out.line(line)
        for line in stopped.copied_back:
            out.line(line)

    out.result(stopped.to_dict(), human)
