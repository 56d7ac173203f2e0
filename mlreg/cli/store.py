"""``mlreg store``: versioned Triton repository folders in a local folder or S3.

Each command parses its options, calls its verb in :mod:`mlreg.ops` and renders the result
(``verify``/``repair``: :mod:`mlreg.cli.store_check`; ``gc``: :mod:`mlreg.cli.store_gc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import JsonFlag, StoreUri, settings_of
from mlreg.cli.progress import byte_progress, waiting
from mlreg.cli.sink import Output
from mlreg.cli.store_check import repair_cmd, verify_cmd
from mlreg.cli.store_gc import gc_cmd

if TYPE_CHECKING:
    from mlreg.ops.store_ls import StoreListing
    from mlreg.ops.store_push import PushReport

app = typer.Typer(
    help="Push and list versioned model folders in a store (local folder or S3).", no_args_is_help=True
)


@app.command("push")
def push_cmd(
    path: Path = typer.Argument(..., help="A model folder or a whole repository."),
    store: StoreUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Upload every version folder with a sha256 manifest; unchanged files are not sent again.

    A stored version is written once: a version the store holds with other bytes is refused
    (exit 5, naming each file; register and push a new version instead), the same bytes are a
    no-op.  Each model's lock is held while it is pushed, as a promotion holds it.

    Example: mlreg store push .mlreg/model_repository --store s3://127.0.0.1:9000/models/prod
    """
    from mlreg.ops.store_push import push_target, store_push  # lazy: the storage package, when run

    target = push_target(store)
    with byte_progress(f"pushing to {target.uri}", quiet=as_json) as progress:
        report = store_push(target, path, progress)
    out = Output(as_json)
    out.result(report.to_dict(), lambda: _render_push(out, report))


def _render_push(out: Output, report: PushReport) -> None:
    for r in report.versions:
        out.line(
            f"{r.model}/{r.version}: sent {len(r.sent)} file(s) ({r.bytes_sent:,} bytes), "
            f"skipped {len(r.skipped)} unchanged"
        )
    out.line(f"pushed {len(report.versions)} version(s) to {report.store}: {report.bytes_sent:,} bytes sent")


@app.command("ls")
def ls_cmd(store: StoreUri = None, as_json: JsonFlag = False) -> None:
    """List models, their versions and the state of each version's bytes.

    STATE: verified (every file matches the manifest: sizes checked now, digests proven by the
    digest cache), unverified (sizes match but some file was not hashed on this machine since it
    changed or was uploaded: run 'mlreg store verify'), corrupt (a file or the manifest does not
    match), corrupt manifest (its manifest cannot be read: 'mlreg store repair' restores it from the
    registry), incomplete (no manifest: an upload did not finish).  Nothing is hashed by 'ls'.

    A version numbered below a stored one that is neither live nor archived is named (JSON:
    "missing"): mlreg moves a version out of the store only into its archive, so if this store
    held it, its archived copy was deleted; an archive that cannot be listed is said so.

    On S3 a request the store does not answer within seconds is given up (as 'mlreg status'
    does); stderr says meanwhile what it waits for.
    """
    from mlreg.ops.store_ls import answering, deadline, open_listed, store_ls  # lazy: the storage package

    target = open_listed(store)
    with (
        waiting(f"mlreg store ls: reading {target.uri}", deadline(), quiet=as_json),
        answering(target.objects),
    ):
        listing = store_ls(target)
    out = Output(as_json)
    out.result(listing.to_dict(), lambda: _render_ls(out, listing))


def _render_ls(out: Output, listing: StoreListing) -> None:
    out.line(f"{'MODEL':<30} {'VERSION':>7}  {'STATE':<16}  FILES")
    for row in listing.versions:
        state = str(row["state"]) if row["location"] == "live" else _archived_state(str(row["state"]))
        out.line(f"{row['model']:<30} {row['version']:>7}  {state:<16}  {row['files']}")
    where = f"from the archive {listing.archive}" if listing.archive is not None else "from this store"
    for model, versions in listing.missing.items():
        out.line(
            f"missing: {model} v{', v'.join(versions)}: neither live nor archived (if this store held "
            f"any, it was deleted {where}; a promotion to one uploads the registry's copy again)"
        )
    if listing.archive_error:
        out.line(f"archive not listed: {listing.archive_error}; archived versions are not shown")
    for lock in listing.locks:
        out.line(f"locked: {lock.model} by {lock.describe()}" + (" (stale)" if lock.stale else ""))


def _archived_state(state: str) -> str:
    """An archived version whose copy is whole reads ``archived``; else ``archived:<state>``."""
    return "archived" if state in {"verified", "unverified"} else f"archived:{state}"


app.command("verify")(verify_cmd)
app.command("repair")(repair_cmd)


@app.command("init")
def init_cmd(store: StoreUri = None, as_json: JsonFlag = False) -> None:
    """Make the store a repository Triton can start on: write the root marker file.

    Triton refuses to start on an S3 prefix that holds no object; a file at the root is never
    taken for a model.  Run it once for a new environment (compose/Kubernetes run it before Triton).

    Example: mlreg store init --store s3://127.0.0.1:9000/models/staging
    """
    from mlreg.ops.store_init import store_init  # lazy: the storage package, when run

    report = store_init(store)
    state = "written" if report.created else "already there"
    out = Output(as_json)
    out.result(
        report.to_dict(),
        lambda: out.line(
            f"{report.store}: root marker {report.marker} {state}; Triton can start on this repository"
        ),
    )


@app.command("unlock")
def unlock_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="The model whose lock to remove."),
    env: str = typer.Option(None, "--env", "-e", help="The environment's store (mlreg.toml)."),
    store: StoreUri = None,
    force: str = typer.Option(
        None,
        "--force",
        metavar="HOLDER",
        help="Remove it though its lease looks alive (a lock written by a clock ahead), naming the "
        "holder the lock names (as the refusal and 'mlreg store ls' show it): another's lock stays.",
    ),
    as_json: JsonFlag = False,
) -> None:
    """Remove a lock its holder left (a crashed or cut-off promotion); refused while the holder's
    lease is alive (judged by the store's clock: the lock's LastModified plus its lease), unless
    --force names its holder.

    Example: mlreg store unlock scorer --env staging
    """
    from mlreg.ops.store_unlock import store_unlock  # lazy: the storage package, when run

    out = Output(as_json)
    report = store_unlock(settings_of(ctx), model, store, env, force or "")
    out.result(report.to_dict(), lambda: out.line(report.line()))


app.command("gc")(gc_cmd)
