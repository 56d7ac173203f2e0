"""``mlreg relay``: environments follow MLflow aliases (the webhook receiver, its set-up, its state)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mlreg.cli.common import JsonFlag, settings_of
from mlreg.cli.sink import Output

app = typer.Typer(
    help='Follow MLflow aliases: an environment with follows = "champion" in mlreg.toml serves what '
    "the alias names (MLflow webhook + reconcile).",
    no_args_is_help=True,
)


def serve_cmd(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (default: loopback only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port of POST /webhook.")] = 8086,
) -> None:
    """Receive MLflow's alias webhooks on POST /webhook, act from a durable queue, reconcile every interval.

    Example: MLREG_RELAY_SECRET=... mlreg relay serve --port 8086
    """
    from mlreg.relay.service import build, serve  # lazy: starlette, uvicorn

    relay = build(settings_of(ctx))
    typer.echo(
        f"relay: listening on http://{host}:{port}/webhook; following {_following(relay.config.follows)}",
        err=True,
    )
    serve(relay, host, port)


def _following(follows: dict[str, str]) -> str:
    return (
        ", ".join(f"{env} <- {alias}" for env, alias in sorted(follows.items()))
        or "nothing (no follows in mlreg.toml)"
    )


def register_cmd(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="The relay's public URL, e.g. https://relay.example/webhook.")],
    as_json: JsonFlag = False,
) -> None:
    """Create or update MLflow's webhook 'mlreg-relay' (URL, alias events, the relay's secret).

    Example: mlreg relay register https://relay.example/webhook
    """
    from mlreg.relay.admin import register  # lazy: MLflow

    result = register(settings_of(ctx), url)
    out = Output(as_json)
    out.result(
        result.to_dict(),
        lambda: out.line(
            f"webhook {result.webhook_id} {result.action}: {result.url} ({', '.join(result.events)})"
        ),
    )


def _status_lines(out: Output, doc: dict[str, Any]) -> None:
    for entry in doc["environments"]:
        out.line(f"{entry['environment']} follows '{entry['follows']}' ({entry['action']})")
        rows = [
            [
                row["model"],
                row["alias"],
                str(row.get("serving", "-")),
                str((row.get("recorded") or {}).get("previous", "")),
            ]
            for row in entry["models"]
        ]
        out.table(["MODEL", "ALIAS", "SERVING", "ROLLBACK TARGET"], rows)
    event = doc["last_event"]
    out.line(
        f"last event: {event['model']} {event['alias']} -> {event['version']}: {event['outcome']}"
        if event
        else "last event: none"
    )
    reconcile = doc["last_reconcile"]
    out.line(
        f"last reconcile: {len(reconcile['queued'])} queued, {len(reconcile['errors'])} errors"
        if reconcile
        else "last reconcile: never"
    )
    out.line("queue: " + (", ".join(f"{state} {n}" for state, n in sorted(doc["queue"].items())) or "empty"))


def status_cmd(
    ctx: typer.Context,
    no_serving: Annotated[
        bool, typer.Option("--no-serving", help="Do not ask the environments what they serve.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Each followed alias, what its environment serves, the rollback target, the last event and
    reconcile, the queue."""
    from mlreg.relay.admin import status  # lazy: the relay's parts
    from mlreg.relay.service import build  # lazy: starlette stays unimported (build does not use it)

    doc = status(build(settings_of(ctx), receive=False), read_serving=not no_serving)
    out = Output(as_json)
    out.result(doc, lambda: _status_lines(out, doc))


app.command("serve")(serve_cmd)
app.command("register")(register_cmd)
app.command("status")(status_cmd)
