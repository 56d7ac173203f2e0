"""``mlreg shadow``: capture of production requests for the shadow replay (switch on, show, purge).

Each command parses, calls its verb in :mod:`mlreg.ops.shadow` and renders the report.
"""

from __future__ import annotations

from typing import Annotated

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.sink import Output

app = typer.Typer(
    help="Capture of the requests production sends (Triton's trace), which every promotion's quality "
    "gate replays to the candidate: switch it on, show it, purge it. Tensors may hold personal data.",
    no_args_is_help=True,
)
Models = Annotated[list[str], typer.Argument(metavar="MODEL...", help="The models.")]
SomeModels = Annotated[
    list[str] | None, typer.Argument(metavar="[MODEL...]", help="The models (default: every model served).")
]


def capture_cmd(
    ctx: typer.Context,
    models: Models,
    env: EnvName = "local",
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be switched on; change nothing."),
    as_json: JsonFlag = False,
) -> None:
    """Switch capture on for MODELs on every replica (a promotion does it for what it moved).

    Example: mlreg shadow capture image_model --env production
    """
    from mlreg.ops.shadow import capture  # lazy: numpy and the promotion package, when run

    out = Output(as_json)
    report = capture(settings_of(ctx), env, models, dry_run)

    def human() -> None:
        verb = "would switch" if dry_run else "switched"
        wanted = ", ".join(report.models) or "no model"
        out.line(f"{verb} capture on for {wanted} on {len(report.targets)} replica(s)")
        for model in report.excluded:
            out.line(f"  {model}: excluded by the environment (never captured)")
        for note in report.failed:
            out.note(f"note: {note}")

    out.result(report.to_dict(), human)
    if report.failed:
        raise typer.Exit(1)


def status_cmd(
    ctx: typer.Context,
    models: Models,
    env: EnvName = "local",
    as_json: JsonFlag = False,
) -> None:
    """Capture per replica and model (Triton's trace settings), and the captured files.

    Example: mlreg shadow status image_model --env production
    """
    from mlreg.ops.shadow import capture_status  # lazy: numpy and the promotion package, when run

    out = Output(as_json)
    report = capture_status(settings_of(ctx), env, models)

    def human() -> None:
        out.table(
            ["REPLICA", "MODEL", "CAPTURE", "RATE", "LEFT"],
            [
                [r["replica"], r["model"], r.get("error") or r["level"], r.get("rate", ""), r.get("left", "")]
                for r in report.replicas
            ],
        )
        out.line(
            f"{report.files} captured file(s), {report.bytes:,} of {report.max_bytes:,} bytes under "
            f"{report.captures or '-'}"
        )

    out.result(report.to_dict(), human)


def purge_cmd(
    ctx: typer.Context,
    models: SomeModels = None,
    env: EnvName = "local",
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change nothing."),
    runs: list[str] = typer.Option(
        [],
        "--run",
        help="An MLflow promotion run whose report keeps captured tensors: scrub it (repeatable).",
    ),
    as_json: JsonFlag = False,
) -> None:
    """Switch capture off for MODELs (default: every model the replicas hold) and delete every
    trace file mlreg armed at the environment's captures locations (only those), and with --run
    the captured tensors in those MLflow runs; exit 1 when a replica, a location or a run could not
    be reached (each named).

    Example: mlreg shadow purge --env production
    """
    from mlreg.ops.shadow import capture_purge  # lazy: numpy and the promotion package, when run

    out = Output(as_json)
    report = capture_purge(settings_of(ctx), env, models, dry_run, runs)

    def human() -> None:
        verb = "would delete" if dry_run else "deleted"
        names = ", ".join(report.models) or "no model"
        out.line(f"capture off for {names}; {verb} {len(report.deleted)} captured file(s)")
        for failure in report.failed:
            out.note(f"note: capture could not be switched off at {failure}")
        for run in report.runs:
            out.line(f"captured tensors taken out of run {run}")
        for location in report.unreached:
            out.note(f"note: not reached (nothing deleted there): {location}")

    out.result(report.to_dict(), human)
    if report.failed or report.unreached:
        raise typer.Exit(1)


app.command("capture")(capture_cmd)
app.command("status")(status_cmd)
app.command("purge")(purge_cmd)
