"""``mlreg analysis``: the bake's checks of an environment, for Argo Rollouts and Kargo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from mlreg.cli.common import JsonFlag, ModelName, positive_version, settings_of
from mlreg.cli.sink import Output

if TYPE_CHECKING:
    from pipelines.checks.bake import Analysis

app = typer.Typer(
    help="The bake's checks of an environment's replicas, judged now: for an Argo Rollouts web metric "
    "(serve) or a Kargo verification Job (check).",
    no_args_is_help=True,
)
Window = Annotated[
    float,
    typer.Option(
        "--window",
        help="Seconds to watch (scrape, wait, scrape); 0 judges the counters as they stand "
        "(each version's since it was loaded).",
    ),
]


def _human(out: Output, analysis: Analysis) -> None:
    verdict = "ok" if analysis.ok else f"FAILED ({analysis.failed_check})"
    compared = ", ".join(analysis.compared_with) or "no other version"
    out.line(
        f"{analysis.model} v{analysis.version} in '{analysis.environment}' against {compared}: "
        f"{verdict}: {analysis.detail}"
    )
    out.line(f"READY on: {', '.join(analysis.ready_on)}")
    for replica, why in analysis.left_out.items():  # counted against max_unavailable, never silent
        out.line(f"left out: {replica}: {why}")
    out.table(  # each check as the promotion's verdict records it (pipelines/core/check.py)
        ["CHECK", "MEASURED", "VALUE", "THRESHOLD", "SAMPLE", "RESULT", "FIX"],
        [
            [
                v.name,
                v.measured,
                "-" if v.value is None else f"{v.value:g}",
                "-" if v.threshold is None else f"{v.threshold:g}",
                "-" if v.sample is None else str(v.sample),
                v.result,
                v.fix or v.why,
            ]
            for v in analysis.verdicts()
        ],
    )


def check_cmd(
    ctx: typer.Context,
    model: ModelName,
    env: Annotated[str, typer.Option("--env", "-e", help="Environment (mlreg.toml).")] = "local",
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            "-V",
            help="The version to judge (default: the newest one the replicas report).",
            callback=positive_version,
        ),
    ] = None,
    window: Window = 0.0,
    as_json: JsonFlag = False,
) -> None:
    """Judge MODEL once with the environment's bake checks; exit 0 when they pass, 1 when one fails.

    Example: mlreg analysis check image_model --env production --json (a Kargo verification Job)

    Example: mlreg analysis check image_model --env staging --window 30
    """
    from mlreg.ops.analysis import check  # lazy: the registry and the promotion, when run

    settings = settings_of(ctx, state=False)
    analysis = check(settings, env, model, version, window)
    out = Output(as_json)
    out.result(analysis.to_dict(), lambda: _human(out, analysis))
    if not analysis.ok:
        raise typer.Exit(1)


def serve_cmd(
    ctx: typer.Context,
    env: Annotated[
        list[str],
        typer.Option("--env", "-e", help="Environment to answer for (mlreg.toml; repeatable)."),
    ],
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0 inside a pod, behind a Service).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on (0: any free port).")] = 8090,
) -> None:
    """Answer GET /v1/analysis/<env>/<model>[?version=N&window=S] with the bake's checks as JSON.

    The document's flat fields suit a successCondition: ok, failed_check, requests,
    failure_ratio, mean_latency_ms; 'checks' lists each check with value, threshold and ok.
    A verdict is HTTP 200 (passed or not); 404 nothing to judge; 400 a bad query; 503 a replica
    that cannot be read.  Runs until SIGTERM or Ctrl-C.

    Example: mlreg analysis serve --env production --host 0.0.0.0 --port 8090

    Example: curl http://127.0.0.1:8090/v1/analysis/production/image_model
    """
    from mlreg.ops.analysis import start  # lazy: as above

    settings = settings_of(ctx, state=False)
    server = start(settings, env, host, port)
    try:
        typer.echo(f"mlreg analysis: {server.url}/v1/analysis/<env>/<model> ({', '.join(env)})", err=True)
        server.serve_forever()
    finally:
        server.server_close()


app.command("check")(check_cmd)
app.command("serve")(serve_cmd)
