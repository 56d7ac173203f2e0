"""``mlreg ledger verify`` and the ledger's answers of ``mlreg history --replica/--model``: parse,
call the verb (``mlreg.ops.ledger``), render."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.sink import Output
from registry.errors import UsageError

app = typer.Typer(
    help="The deployment ledger: every load, unload and config update sent to a replica, "
    "hash-chained beside the environment's store.",
    no_args_is_help=True,
)
ReceiptKey = Annotated[
    Path | None,
    typer.Option(
        "--receipt-key", metavar="PUB", help="Also check every receipt against this public key (PEM)."
    ),
]


@app.command("verify")
def verify_cmd(
    ctx: typer.Context, env: EnvName = "local", receipt_key: ReceiptKey = None, as_json: JsonFlag = False
) -> None:
    """Read every event of ENV's ledger and check the chain: any edited, removed or reordered event
    is named (position, time, replica) and the exit code is 1.

    Example: mlreg ledger verify --env production --receipt-key keys/receipts.pub
    """
    from mlreg.ops.ledger import verify  # lazy: the ledger, when run

    out = Output(as_json)
    result = verify(settings_of(ctx), env, receipt_key)

    def human() -> None:
        receipts = f", {result.receipts} receipts verified" if receipt_key is not None else ""
        verdict = "verifies" if result.ok else "DOES NOT VERIFY"
        out.line(f"{result.ledger}: {result.events} events{receipts}: {verdict}")
        for line in result.lines():
            out.line(line)

    out.result(result.to_dict(), human)
    if not result.ok:
        raise typer.Exit(1)


def ledger_history(
    ctx: typer.Context, env: str, replica: str | None, at: str | None, model: str | None, as_json: bool
) -> None:
    """``mlreg history --replica R --at TIME`` (what R served then) or ``--model M [--env E]``
    (every span a replica served M), answered from the ledger."""
    out = Output(as_json)
    if replica is not None:
        if at is None:
            raise UsageError(
                "--replica needs --at TIME",
                fix="e.g. mlreg history --replica triton-0:8001 --at 2026-12-06T08:00:00Z",
            )
        _served(out, ctx, env, replica, at)
        return
    if model is None:
        raise UsageError("--at needs --replica R", fix="pass --replica R --at TIME, or --model M")
    _spans(out, ctx, env, model)


def _served(out: Output, ctx: typer.Context, env: str, replica: str, at: str) -> None:
    from mlreg.ops.ledger import served_at  # lazy: the ledger, when run

    data = served_at(settings_of(ctx), env, replica, at)
    out.result(
        data,
        lambda: out.table(["MODEL", "VERSIONS"], [[m, ",".join(v)] for m, v in data["serving"].items()]),
    )
    if not data["serving"]:
        out.line(f"{replica} served nothing mlreg loaded at {data['at']}")
    _unverified(out, data, env)


def _spans(out: Output, ctx: typer.Context, env: str, model: str) -> None:
    from mlreg.ops.ledger import model_history  # lazy: the ledger, when run

    data = model_history(settings_of(ctx), env, model)
    rows = [
        [s["replica"], ",".join(s["versions"]), s["since"], s["until"] or "now", s["event"]]
        for s in data["served"]
    ]
    out.result(data, lambda: out.table(["REPLICA", "VERSIONS", "SINCE", "UNTIL", "EVENT"], rows))
    if not data["served"]:
        out.line(f"no replica of '{env}' served {model} (by the ledger)")
    _unverified(out, data, env)


def _unverified(out: Output, data: dict[str, Any], env: str) -> None:
    if not data["verified"]:
        out.note(f"the ledger of '{env}' does not verify: run 'mlreg ledger verify --env {env}'")
