"""``mlreg store gc``: an environment's retention policy applied to its store
(:mod:`mlreg.ops.store_gc`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.sink import Output
from registry.errors import StorageError

if TYPE_CHECKING:
    from pipelines.promote.retention import RetentionReport


def gc_cmd(
    ctx: typer.Context,
    env: EnvName = "local",
    keep: int = typer.Option(
        None, "--keep", "-k", help="Versions per model to leave live (default: the environment's keep)."
    ),
    model: list[str] = typer.Option(None, "--model", "-m", help="Only this model (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would move; change nothing."),
    as_json: JsonFlag = False,
) -> None:
    """Apply the environment's retention policy to its store: versions beyond the window (keep =
    N in mlreg.toml, default 2: what serves and the one before it) move to the archive beside the
    store, never lost; nothing an ensemble pins or a target holds (every target is asked).

    Example: mlreg store gc --env staging --dry-run
    """
    from mlreg.ops.store_gc import store_gc  # lazy: the promotion package, when run

    out = Output(as_json)
    report = store_gc(settings_of(ctx), env, keep, dry_run=dry_run, models=model or None)
    out.result(report.to_dict(), lambda: _render_gc(out, report))
    if report.failed and not report.skipped:  # with --json too: CI reads the exit code
        raise StorageError(
            f"{len(report.failed)} move(s) did not finish: {report.failed[0]}",
            fix="rerun 'mlreg store gc': a version is live, or live and archived, until its move finishes",
        )


def _render_gc(out: Output, report: RetentionReport) -> None:
    if report.skipped:
        out.line(f"nothing to do: {report.skipped}")
        return
    verb = "would move" if report.dry_run else "moved"
    out.table(
        ["MODEL", "VERSION", "BYTES"],
        [[m.model, m.version, f"{m.bytes:,}"] for m in report.moves],
        title=f"keep {report.keep}: {verb} to the archive",
        right={"VERSION", "BYTES"},
    )
    for name, versions in sorted(report.protected.items()):
        for version, why in sorted(versions.items()):
            out.line(f"kept {name} v{version}: {why}")
    for failure in report.failed:
        out.line(f"not moved: {failure}")
    freed = "would free" if report.dry_run else "freed"
    out.line(
        f"{len(report.moves)} version(s), {freed} {report.bytes_freed:,} bytes under the prefix Triton reads"
    )
