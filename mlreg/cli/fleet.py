"""``mlreg fleet``: an environment's desired versions as a file in git (``fleet/<env>.toml``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlreg.cli.common import JsonFlag, settings_of
from mlreg.cli.promote_render import batch_stage, failure_lines
from mlreg.cli.sink import Output

if TYPE_CHECKING:
    from mlreg.ops.fleet_pins import PinResult, SyncResult

app = typer.Typer(
    help="An environment's desired versions as a file in git (fleet/<env>.toml): pin them (the plan "
    "job's pull request), sync them (what a GitOps engine runs once the pull request is merged).",
    no_args_is_help=True,
)
FleetPath = Annotated[
    Path, typer.Argument(metavar="FILE", help="The desired-versions file, e.g. fleet/production.toml.")
]


def _pin_lines(out: Output, result: PinResult) -> None:
    path = result.fleet.path
    if not result.changes:
        out.line(f"{path}: already pins that: nothing to change")
    for change in result.changes:
        out.line(f"{path}: {change['model']} {change['from'] or '(new)'} -> {change['to']}")


def pin_cmd(
    ctx: typer.Context,
    file: FleetPath,
    pins: Annotated[
        list[str] | None, typer.Argument(metavar="[MODEL=VERSION]...", help="Versions to pin.")
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="The environment the file is for (a new file).")
    ] = None,
    from_alias: Annotated[
        str | None,
        typer.Option("--from-alias", help="Pin every version this MLflow alias holds (e.g. staging)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write versions into FILE (created when missing); each must be registered in MLflow.

    Example: mlreg fleet pin fleet/production.toml image_model=3

    Example: mlreg fleet pin fleet/production.toml --from-alias staging (what staging serves)
    """
    from mlreg.ops.fleet_pins import parse_pins, pin  # lazy: the registry and the promotion, when run

    settings = settings_of(ctx)
    result = pin(settings, file, parse_pins(pins or []), env, from_alias)
    out = Output(as_json)
    out.result(result.to_dict(), lambda: _pin_lines(out, result))


def _sync_lines(out: Output, result: SyncResult) -> None:
    where = f"'{result.environment}'"
    for entry in result.to_dict()["promotions"]:
        state = (
            "held"
            if entry.get("held")
            else "skipped"
            if entry.get("skipped")
            else "ok"
            if entry["ok"]
            else "FAILED"
        )
        out.line(f"{entry['model']} v{entry['version']}: {state}")
    if result.failed:
        return
    if result.dry_run:
        moved = ", ".join(f"{m} v{v}" for m, v in result.moved) or "nothing"
        out.line(f"plan for {where}: would promote {moved}")
        return
    drifting = [row for row in result.health if not row["ok"]]
    for row in drifting:
        out.line(f"{row['model']} (pinned v{row['pinned']}): {'; '.join(row['drift'])}")
    if not drifting:
        out.line(
            f"{where} serves every version {result.fleet.path} pins "
            f"({len(result.moved)} promoted, {len(result.health) - len(result.moved)} already served)"
        )


def sync_cmd(
    ctx: typer.Context,
    file: FleetPath,
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default: the file's 'environment').")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan the promotions, change nothing.")] = False,
    skip_quality: Annotated[bool, typer.Option("--skip-quality", help="Skip the quality gate.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Promote what FILE pins that the environment does not serve; exit 0 when it serves all of it.

    Ensembles go first (they bring the member versions they pin); a version already served is a
    no-op.  A pinned version MLflow does not hold is refused before any change (exit 4).  Exit
    codes: 0 healthy; the promotion's code when one fails (it restored what it changed); 1 when
    the promotions ran but 'mlreg status' still finds drift.

    Example: mlreg fleet sync fleet/production.toml --env production --json (the PostSync hook Job)
    """
    from mlreg.ops.fleet_pins import sync  # lazy: the registry and the promotion, when run
    from pipelines.core.options import Options  # lazy: with the verb

    settings = settings_of(ctx)
    out = Output(as_json)
    options = Options(dry_run=dry_run, on_stage=batch_stage, skip_quality=skip_quality)
    result = sync(settings, file, env, options)
    out.result(result.to_dict(), lambda: _sync_lines(out, result))
    failure_lines(result.failed)
    if result.exit_code:
        if not result.failed:
            typer.echo(f"error: '{result.environment}' does not serve what {file} pins (drift)", err=True)
        raise typer.Exit(result.exit_code)


app.command("pin")(pin_cmd)
app.command("sync")(sync_cmd)
