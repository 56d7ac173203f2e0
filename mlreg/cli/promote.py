"""`mlreg promote` (one version, or several with --from-alias/--from-file) and `mlreg rollback`:
parse, call the verb (``mlreg.ops``), render (``mlreg.cli.promote_render``).  `mlreg status` and
`mlreg history` live in ``mlreg.cli.status``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import EnvName, JsonFlag, positive_version, settings_of
from mlreg.cli.progress import activity
from mlreg.cli.promote_render import batch_stage, failure_lines, promotion, render, stage_lines
from mlreg.cli.report import plain, render_batch
from mlreg.cli.sink import Output
from mlreg.cli.status import history_cmd, status_cmd
from registry.errors import UsageError

if TYPE_CHECKING:
    from pipelines.core.options import Options
    from registry.settings import Settings


def promote_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="Registered model name."),
    version: str = typer.Option(
        None, "--version", "-V", help="Registered version to promote.", callback=positive_version
    ),
    env: EnvName = "local",
    from_alias: str = typer.Option(
        None,
        "--from-alias",
        help="Promote every version this alias holds that --env lacks (CI); with MODEL, only MODEL's. "
        "An alias no version holds is an error (exit 4).",
    ),
    from_file: Path = typer.Option(
        None,
        "--from-file",
        help="Promote the versions an 'mlreg export --changed --json' listed (CI); takes no MODEL.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    allow_breaking: bool = typer.Option(False, "--allow-breaking", help="Allow a contract-breaking change."),
    serve_as: str = typer.Option(
        "auto",
        "--serve-as",
        help="auto | native | onnx: a SavedModel is "
        "converted to ONNX (tf2onnx, parity-checked, registered) for onnx, "
        "or for auto when a target's Triton has no TensorFlow backend.",
    ),
    skip: str = typer.Option(
        "",
        "--skip",
        metavar="NAME[,NAME]",
        help="Skip these registered checks (golden, shadow, perf, ...; quality: the whole gate before "
        "traffic); the report names each one skipped. An unknown name is refused, listing the "
        "registered ones. --skip-quality, --skip-perf and --skip-shadow are the same as --skip quality, "
        "perf, shadow.",
    ),
    skip_quality: bool = typer.Option(False, "--skip-quality", help="Skip the pre-flight quality gate."),
    skip_perf: bool = typer.Option(
        False,
        "--skip-perf",
        help="Skip the gate's performance check (the candidate's latency against the serving "
        "version's on the canary); the golden-input checks still run.",
    ),
    skip_shadow: bool = typer.Option(
        False,
        "--skip-shadow",
        help="Skip only the gate's shadow replay (the candidate answering the requests production "
        "sent, captured where the environment's [shadow] table says); every other check still runs.",
    ),
    no_way_back: bool = typer.Option(
        False,
        "--no-way-back",
        help="Promote although the serving version's bytes (or signature) no longer verify in the "
        "store nor the registry: an abort then leaves the model as it serves instead of loading "
        "unverified bytes. Without it such a promotion is refused before any change.",
    ),
    as_json: JsonFlag = False,
) -> None:
    """Promote a registered version: validate, quality gate, upload, swap with no failed request.

    Example: mlreg promote image_model --version 2

    Example: mlreg promote image_model --from-alias staging --env production (the version staging
    holds, only image_model's)
    """
    from mlreg.ops.promote import promote  # lazy: the verb imports the promotion package
    from pipelines.core.options import Options  # lazy: with the verb

    options = Options(  # the verb refuses a --serve-as or a --skip name it does not know
        dry_run=dry_run,
        allow_breaking=allow_breaking,
        serve_as=serve_as,
        no_way_back=no_way_back,
        skip=frozenset(n.strip() for n in skip.split(",") if n.strip()),
        skip_quality=skip_quality,  # the older flags: aliases of --skip quality, perf, shadow
        skip_perf=skip_perf,
        skip_shadow=skip_shadow,
    )
    if from_alias or from_file:  # several versions, members first
        if version:
            raise UsageError(
                "--version and --from-alias/--from-file exclude each other: the alias or file names it",
                fix="drop --version, or drop --from-alias/--from-file to promote MODEL --version N",
            )
        return promote_many_cmd(settings_of(ctx), env, from_alias, from_file, as_json, model, options)
    if not model or not version:
        raise UsageError(
            "no version to promote", fix="pass MODEL --version N (or --from-alias / --from-file)"
        )
    settings, out = settings_of(ctx), Output(as_json)
    with activity(quiet=as_json, settings=settings) as step:  # the running stage, on a terminal only
        on_start = None if step is None else partial(_running, step, f"{model} v{version}")
        told = replace(options, on_stage=stage_lines(out), on_start=on_start)
        result = promotion(out, partial(promote, settings, env, model, version, told))
    render(out, result, result.plan.env.alias)


def _running(step: Callable[[str], None], what: str, stage: str) -> None:
    step(f"{what}: {stage}")


def rollback_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Registered model name."),
    to_version: str = typer.Option(
        None,
        "--to-version",
        help="Version to return to (default: the one promoted before the current).",
        callback=positive_version,
    ),
    env: EnvName = "local",
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    as_json: JsonFlag = False,
) -> None:
    """Serve an earlier version again (a promotion without the quality gate).

    Example: mlreg rollback image_model --to-version 1
    """
    from mlreg.ops.rollback import rollback  # lazy: the verb imports the promotion package
    from pipelines.core.options import Options  # lazy: with the verb

    settings, out = settings_of(ctx), Output(as_json)
    with activity(quiet=as_json, settings=settings) as step:  # the running stage, on a terminal only
        on_start = None if step is None else partial(_running, step, f"rollback of {model}")
        options = Options(dry_run=dry_run, on_stage=stage_lines(out), on_start=on_start)
        result = promotion(out, partial(rollback, settings, env, model, to_version, options))
    render(out, result, result.plan.env.alias)


def promote_many_cmd(
    settings: Settings,
    env: str,
    from_alias: str | None,
    from_file: Path | None,
    as_json: bool,
    model: str | None,
    options: Options,
) -> None:
    """``mlreg promote [MODEL] --from-alias A | --from-file F --env E``: several versions, members
    first; MODEL limits --from-alias to that model and is refused with --from-file."""
    from mlreg.ops.promote_many import promote_listed  # lazy: the verb imports the promotion package

    batch = promote_listed(
        settings, env, from_alias, from_file, model, replace(options, on_stage=batch_stage)
    )
    doc, out = batch.to_dict(), Output(as_json)
    out.result(doc, lambda: out.line("\n".join(plain(render_batch(doc)))))
    failed = [p for p in batch.promotions if not p["ok"] and not p.get("skipped")]
    failure_lines(failed)
    if failed:
        raise typer.Exit(int(failed[0].get("exit_code", 1)))


__all__ = ["history_cmd", "promote_cmd", "promote_many_cmd", "rollback_cmd", "status_cmd"]
