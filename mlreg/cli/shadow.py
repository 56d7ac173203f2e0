"""``mlreg shadow``: capture of production requests for the shadow replay (switch on, show, purge)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.output import Output

if TYPE_CHECKING:
    from pipelines.promote.environments import Environment
    from registry.settings import Settings

app = typer.Typer(
    help="Capture of the requests production sends (Triton's trace), which every promotion's quality "
    "gate replays to the candidate: switch it on, show it, purge it. Tensors may hold personal data.",
    no_args_is_help=True,
)
Models = Annotated[list[str], typer.Argument(metavar="MODEL...", help="The models.")]
SomeModels = Annotated[
    list[str] | None, typer.Argument(metavar="[MODEL...]", help="The models (default: every model served).")
]


def _environment(settings: Settings, name: str) -> tuple[Environment, tuple[str, ...], Any]:
    from mlreg import service
    from pipelines.promote.environments import resolve_targets
    from pipelines.promote.replicas import triton_connector

    env = service.environment(settings, name)
    connect = triton_connector(settings, env.key(settings), env.load_deadline(settings))
    return env, resolve_targets(settings, env), connect


def _shadow_of(env: Environment) -> Any:
    from registry.errors import UsageError

    if env.shadow is None:
        raise UsageError(
            f"environment '{env.name}' captures no requests",
            fix=f"add an [environments.{env.name}.shadow] table to mlreg.toml (rate, count, captures)",
        )
    return env.shadow


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
    from pipelines.promote.capture import arm

    settings, out = settings_of(ctx), Output(as_json)
    environment, targets, connect = _environment(settings, env)
    shadow = _shadow_of(environment)
    wanted = [m for m in models if shadow.captures_model(m)]
    excluded = [m for m in models if m not in wanted]
    notes = [] if dry_run else arm(targets, connect, wanted, shadow)
    data = {
        "environment": env,
        "models": wanted,
        "excluded": excluded,
        "targets": list(targets),
        "settings": shadow.trace_settings(),
        "dry_run": dry_run,
        "failed": notes,
    }

    def human() -> None:
        verb = "would switch" if dry_run else "switched"
        out.line(f"{verb} capture on for {', '.join(wanted) or 'no model'} on {len(targets)} replica(s)")
        for model in excluded:
            out.line(f"  {model}: excluded by the environment (never captured)")
        for note in notes:
            out.note(f"note: {note}")

    out.result(data, human)
    if notes:
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
    from pipelines.promote.capture import Captures
    from registry.errors import MlregError

    settings, out = settings_of(ctx), Output(as_json)
    environment, targets, connect = _environment(settings, env)
    shadow = _shadow_of(environment)
    rows = []
    for url in targets:
        for model in models:
            try:
                with connect(url) as triton:
                    found = triton.trace_settings(model)
                level = ",".join(found.get("trace_level", []))
                rows.append(
                    {
                        "replica": url,
                        "model": model,
                        "level": level,
                        "rate": found.get("trace_rate", [""])[0],
                        "left": found.get("trace_count", [""])[0],
                    }
                )
            except MlregError as exc:
                rows.append({"replica": url, "model": model, "error": exc.message})
    files = Captures(shadow.captures).files() if shadow.captures else []
    data = {
        "environment": env,
        "captures": shadow.captures,
        "replicas": rows,
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "max_bytes": shadow.max_bytes,
    }

    def human() -> None:
        out.table(
            ["REPLICA", "MODEL", "CAPTURE", "RATE", "LEFT"],
            [
                [r["replica"], r["model"], r.get("error") or r["level"], r.get("rate", ""), r.get("left", "")]
                for r in rows
            ],
        )
        out.line(
            f"{len(files)} captured file(s), {data['bytes']:,} of {shadow.max_bytes:,} bytes under "
            f"{shadow.captures or '-'}"
        )

    out.result(data, human)


def purge_cmd(
    ctx: typer.Context,
    models: SomeModels = None,
    env: EnvName = "local",
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change nothing."),
    as_json: JsonFlag = False,
) -> None:
    """Switch capture off for MODELs (default: every model the replicas hold) and delete every
    captured file of the environment.

    Example: mlreg shadow purge --env production
    """
    from pipelines.promote.capture import Captures, disarm, purge
    from registry.errors import MlregError

    settings, out = settings_of(ctx), Output(as_json)
    environment, targets, connect = _environment(settings, env)
    shadow = _shadow_of(environment)
    names = list(models or [])
    if not names:  # every model any replica holds
        for url in targets:
            try:
                with connect(url) as triton:
                    names.extend(m for m in triton.model_states() if m not in names)
            except MlregError:
                continue
    files = Captures(shadow.captures).files() if shadow.captures else []
    failed = [] if dry_run else disarm(targets, connect, names)
    deleted = [f.name for f in files] if dry_run else purge(shadow.captures)
    data = {"environment": env, "models": names, "deleted": deleted, "dry_run": dry_run, "failed": failed}

    def human() -> None:
        verb = "would delete" if dry_run else "deleted"
        out.line(f"capture off for {', '.join(names) or 'no model'}; {verb} {len(deleted)} captured file(s)")
        for failure in failed:
            out.note(f"note: capture could not be switched off at {failure}")

    out.result(data, human)
    if failed:
        raise typer.Exit(1)


app.command("capture")(capture_cmd)
app.command("status")(status_cmd)
app.command("purge")(purge_cmd)
