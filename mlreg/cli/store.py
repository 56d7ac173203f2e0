"""``mlreg store``: versioned Triton repository folders in a local folder or S3."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlreg.cli.output import emit_json, handle_errors
from mlreg.cli.progress import byte_progress
from registry.errors import StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.storage.base import RepositoryStore

app = typer.Typer(
    help="Push and list versioned model folders in a store (local folder or S3).", no_args_is_help=True
)
STORE_HELP = (
    "Store URI: a folder, s3://bucket/prefix or s3://host:port/bucket/prefix "
    "(default: .mlreg/model_repository)."
)


def _store(uri: str | None) -> RepositoryStore:
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
    """List models, their versions and the state of each version's bytes.

    STATE: verified (every file matches the manifest: sizes checked now, digests proven by the
    digest cache), unverified (sizes match but some file was not hashed on this machine since it
    changed or was uploaded: run 'mlreg store verify'), corrupt (a file or the manifest does not
    match), incomplete (no manifest: an upload did not finish).  Nothing is hashed by 'ls'.
    """
    target = _store(store)
    rows = []
    for model in target.list_models():
        for version in target.list_versions(model) or [""]:
            check = target.check_version(model, version, hashing="none") if version else None
            rows.append(
                {
                    "model": model,
                    "version": version,
                    "state": check.status if check else "no versions",
                    "files": check.files if check else 0,
                    "problems": [p.line() for p in check.problems] if check else [],
                }
            )
    if as_json:
        emit_json({"store": target.uri, "versions": rows})
        return
    typer.echo(f"{'MODEL':<30} {'VERSION':>7}  {'STATE':<11}  FILES")
    for row in rows:
        typer.echo(f"{row['model']:<30} {row['version']:>7}  {row['state']:<11}  {row['files']}")


def _selected(target: RepositoryStore, model: str | None, version: str | None) -> list[tuple[str, str]]:
    from registry.errors import UsageError

    if version is not None and model is None:
        raise UsageError("a version needs its model", fix="mlreg store verify MODEL VERSION")
    models = [model] if model else target.list_models()
    pairs: list[tuple[str, str]] = []
    for name in models:
        versions = target.list_versions(name)
        if version is not None and version not in versions:
            raise StorageError(
                f"{target.uri}: {name} has no version '{version}' in the store "
                f"(stored: {', '.join(versions) or 'none'})",
                fix="see 'mlreg store ls'",
            )
        if model and not versions:
            raise StorageError(f"{target.uri}: no version of '{name}' is stored", fix="see 'mlreg store ls'")
        pairs.extend((name, v) for v in versions if version is None or v == version)
    return pairs


@app.command("verify")
@handle_errors
def verify_cmd(
    model: str = typer.Argument(None, help="Only this model (default: every model)."),
    version: str = typer.Argument(None, help="Only this version of MODEL."),
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
    digest: str = typer.Option(
        None, "--digest", help="The digest the version must have (its artifact_digest in MLflow)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Re-hash every file of the stored versions and compare with their manifests.

    Exit 0 when every version matches; 5 naming each bad file otherwise.  Reads only.

    Example: mlreg store verify table_data_model 1 --store s3://127.0.0.1:9000/models/prod
    """
    target = _store(store)
    if digest and not version:
        raise UsageError(
            "--digest needs MODEL and VERSION", fix="mlreg store verify MODEL VERSION --digest SHA"
        )
    checks = [target.check_version(m, v, digest, hashing="all") for m, v in _selected(target, model, version)]
    bad = [c for c in checks if not c.ok]
    if as_json:
        emit_json({"store": target.uri, "ok": not bad, "versions": [c.to_dict() for c in checks]})
    else:
        for c in checks:
            typer.echo(
                f"{c.model}/{c.version}: {c.status} ({c.files} file(s), {c.hashed_bytes:,} bytes hashed)"
            )
            for problem in c.problems:
                typer.echo(f"  {problem.line()}")
    if bad:
        files = [f"{c.model}/{c.version}/{p.file}" for c in bad for p in c.problems]
        raise StorageError(
            f"{target.uri}: {len(bad)} of {len(checks)} version(s) do not match their manifest: "
            + ", ".join(files[:10])
            + (f" and {len(files) - 10} more" if len(files) > 10 else ""),
            fix="push the registered version again (a promotion re-uploads what differs), then verify again",
        )


@app.command("init")
@handle_errors
def init_cmd(
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Make the store a repository Triton can start on: write the root marker file.

    Triton refuses to start on an S3 prefix that holds no object; a file at the root is never
    taken for a model.  Run it once for a new environment (compose/Kubernetes run it before Triton).

    Example: mlreg store init --store s3://127.0.0.1:9000/models/staging
    """
    from pipelines.storage.base import ROOT_MARKER

    target = _store(store)
    created = target.init_root()
    if as_json:
        emit_json({"store": target.uri, "marker": ROOT_MARKER, "created": created})
        return
    state = "written" if created else "already there"
    typer.echo(f"{target.uri}: root marker {ROOT_MARKER} {state}; Triton can start on this repository")
