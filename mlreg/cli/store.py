"""``mlreg store``: versioned Triton repository folders in a local folder or S3."""

from __future__ import annotations

from pathlib import Path

import typer

from mlreg.cli.output import emit_json, handle_errors
from mlreg.cli.progress import byte_progress
from registry.settings import Settings

app = typer.Typer(
    help="Push and list versioned model folders in a store (local folder or S3).", no_args_is_help=True
)
STORE_HELP = (
    "Store URI: a folder, s3://bucket/prefix or s3://host:port/bucket/prefix "
    "(default: .mlreg/model_repository)."
)


def _store(uri: str | None):
    from pipelines.storage import open_store

    settings = Settings.from_env()
    return open_store(uri or settings.local_repository, digest_cache=settings.digest_cache)


@app.command("push")
@handle_errors
def push_cmd(
    path: Path = typer.Argument(..., help="A model folder or a whole repository."),
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Upload every version folder with a sha256 manifest; unchanged files are not sent again.

    Example: mlreg store push .mlreg/model_repository --store s3://127.0.0.1:9000/models/prod
    """
    from pipelines.storage.push import push_path

    target = _store(store)
    with byte_progress(f"pushing to {target.uri}", quiet=as_json) as progress:
        results = push_path(target, path, progress)
    if as_json:
        emit_json({"store": target.uri, "versions": [r.to_dict() for r in results]})
        return
    for r in results:
        typer.echo(
            f"{r.model}/{r.version}: sent {len(r.sent)} file(s) ({r.bytes_sent:,} bytes), "
            f"skipped {len(r.skipped)} unchanged"
        )
    total = sum(r.bytes_sent for r in results)
    typer.echo(f"pushed {len(results)} version(s) to {target.uri}: {total:,} bytes sent")


@app.command("ls")
@handle_errors
def ls_cmd(
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List models, their versions and whether each version's manifest is complete."""
    target = _store(store)
    rows = []
    for model in target.list_models():
        for version in target.list_versions(model) or [""]:
            manifest = target.read_manifest(model, version) if version else None
            rows.append(
                {
                    "model": model,
                    "version": version,
                    "manifest": "complete" if manifest else "missing",
                    "files": len(manifest.files) if manifest else 0,
                }
            )
    if as_json:
        emit_json({"store": target.uri, "versions": rows})
        return
    typer.echo(f"{'MODEL':<30} {'VERSION':>7}  MANIFEST  FILES")
    for row in rows:
        typer.echo(f"{row['model']:<30} {row['version']:>7}  {row['manifest']:<8}  {row['files']}")
