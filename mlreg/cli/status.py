"""`mlreg status` and `mlreg history`: parse, call the verb (``mlreg.ops``), render."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.sink import Output
from registry.errors import UsageError

if TYPE_CHECKING:
    from mlreg.ops.status_rows import ModelRow


def status_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="One model (default: every model in the store)."),
    env: EnvName = "local",
    as_json: JsonFlag = False,
) -> None:
    """Registry alias vs the store's desired state vs what each Triton serves (drift: exit 1)."""
    from mlreg.ops.status import status  # lazy: the verb imports the promotion package

    out = Output(as_json)
    report = status(settings_of(ctx), env, model)
    out.result(report.to_dict(), lambda: status_table(out, report.models))
    for lock in report.locks:
        stale = " (stale: 'mlreg store unlock' may remove it)" if lock["stale"] else ""
        lease = (
            f"lease ran out at {lock['lease_until']}"
            if lock["stale"]
            else f"lease until {lock['lease_until']}"
        )
        out.line(f"locked: {lock['model']} by {lock['owner']}, {lease}{stale}")
    if report.store_error and not as_json:
        out.line(f"store unreachable: {report.store_error} (fix: {report.store_fix})")
    if report.readiness and not as_json:
        out.line(report.readiness)
    if not as_json and not report.models:  # no row names them: a replica that cannot say is said here
        for url, why in report.unreachable.items():
            out.line(f"{url}: {why}")
    if not as_json:
        from pipelines.fleet.replicas import OPEN_CONTROL  # lazy: tritonclient, loaded by the status

        for url in report.open_control:
            out.line("warning: " + OPEN_CONTROL.format(url=url))
    if report.drift:
        raise typer.Exit(1)


def status_table(out: Output, rows: list[ModelRow]) -> None:
    """MLflow versions in every column, the Triton folder in brackets where it differs (``2 [1]``)."""
    out.table(
        ["MODEL", "ALIAS", "DESIRED", "SERVING"],
        [
            [
                r.model,
                r.alias,
                r.desired_label(),
                "; ".join(f"{u}: {v}" for u, v in r.serving_labels().items()),
            ]
            for r in rows
        ],
        right=["ALIAS", "DESIRED"],
    )
    for r in rows:
        if r.pins is not None:
            out.line(f"{r.model} pins: " + ", ".join(f"{m} v{v}" for m, v in sorted(r.pins.items())))
        for line in r.drift:
            out.line(f"{r.model} drift: {line}")


def history_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="Registered model name."),
    env: str = typer.Option(None, "--env", "-e", help="Only this environment."),
    replica: str = typer.Option(
        None, "--replica", help="From the ledger: what this replica served --at TIME."
    ),
    at: str = typer.Option(None, "--at", metavar="TIME", help="With --replica: an ISO 8601 time."),
    ledger_model: str = typer.Option(
        None, "--model", help="From the ledger: every replica's spans of MODEL."
    ),
    as_json: JsonFlag = False,
) -> None:
    """Every promotion of MODEL: when, where, from → to, result, who.  With --replica R --at TIME or
    --model M: what served where, when, from the environment's deployment ledger."""
    from mlreg.ops.history import history  # lazy: when run

    if replica or at or ledger_model:
        from mlreg.cli.ledger import ledger_history  # lazy: the ledger's answers, when asked

        return ledger_history(ctx, env or "local", replica, at, ledger_model or model, as_json)
    if model is None:
        raise UsageError(
            "mlreg history needs MODEL (or --replica R --at TIME, or --model M)",
            fix="e.g. mlreg history scorer",
        )
    out = Output(as_json)
    rows = history(settings_of(ctx), model, env)
    out.result(
        {"model": model, "promotions": rows},
        lambda: out.table(
            ["WHEN", "ENV", "FROM", "TO", "RESULT", "USER", "RUN"],
            [
                [
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["when"] / 1000)),
                    h["environment"],
                    h["from"] or "-",  # a member's arrival: its ensemble's run names no member "from"
                    h["to"],
                    h["result"],
                    h["user"],
                    h["run_id"],
                ]
                for h in rows
            ],
        ),
    )
    if not rows:
        out.line(f"no promotion of {model} yet")
