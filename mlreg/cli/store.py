"""``mlreg store``: versioned Triton repository folders in a local folder or S3."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import EnvName, JsonFlag, settings_of
from mlreg.cli.output import Output, emit_json, handle_errors
from mlreg.cli.progress import byte_progress, waiting
from registry.errors import StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pipelines.promote.retention import RetentionReport
    from pipelines.storage.base import RepositoryStore
    from pipelines.storage.verify import Verification

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

    A stored version is written once: a version the store holds with other bytes is refused
    (exit 5, naming each file; register and push a new version instead), the same bytes are a
    no-op.  Each model's lock is held while it is pushed, as a promotion holds it.

    Example: mlreg store push .mlreg/model_repository --store s3://127.0.0.1:9000/models/prod
    """
    from pipelines.storage.push import push_path

    target = _store(store)
    with byte_progress(f"pushing to {target.uri}", quiet=as_json) as progress:
        results = push_path(target, path, progress, lease=Settings.from_env().lock_lease)
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
    match), corrupt manifest (its manifest cannot be read: 'mlreg store repair' restores it from the
    registry), incomplete (no manifest: an upload did not finish).  Nothing is hashed by 'ls'.

    A version numbered below a stored one that is neither live nor archived is named (JSON:
    "missing"): mlreg moves a version out of the store only into its archive, so if this store
    held it, its archived copy was deleted; an archive that cannot be listed is said so.

    On S3 a request the store does not answer within seconds is given up (as 'mlreg status'
    does); stderr says meanwhile what it waits for.
    """
    from pipelines.promote.status import STORE_READ_TIMEOUT_S, STORE_RETRIES, status_store

    settings = Settings.from_env()
    target = status_store(store or settings.local_repository, digest_cache=settings.digest_cache)
    deadline = f"gives up on a request after {1 + STORE_RETRIES} tries of {STORE_READ_TIMEOUT_S:g} s"
    with (
        waiting(f"mlreg store ls: reading {target.uri}", deadline, quiet=as_json),
        _answering(target, deadline),
    ):
        _ls(target, as_json)


@contextmanager
def _answering(target: RepositoryStore, deadline: str) -> Iterator[None]:
    """A remote store that failed a read (it did not answer in time, or refused) ends `store ls`
    with one error naming it and the fix."""
    try:
        yield
    except StorageError as exc:
        if not target.uri.startswith("s3://"):
            raise  # a local folder's error says which file and why
        raise StorageError(
            f"{exc.message} ('mlreg store ls' {deadline})",
            fix=f"check that {target.uri} answers (endpoint up, credentials valid), then rerun "
            "'mlreg store ls'; 'mlreg status' says what each replica serves meanwhile",
        ) from exc


def _ls(target: RepositoryStore, as_json: bool) -> None:
    archive = _archive(target)
    archived, archive_error = _archived(archive)
    rows = []
    for model in target.list_models():
        for version in target.list_versions(model) or [""]:
            check = target.check_version(model, version, hashing="none") if version else None
            rows.append(
                {
                    "model": model,
                    "version": version,
                    "location": "live",
                    "state": check.status if check else "no versions",
                    "files": check.files if check else 0,
                    "problems": [p.line() for p in check.problems] if check else [],
                }
            )
    for model, version in archived:
        assert archive is not None
        check = archive.check_version(model, version, hashing="none")
        rows.append(
            {
                "model": model,
                "version": version,
                "location": "archived",
                "state": check.status,
                "files": check.files,
                "problems": [p.line() for p in check.problems],
            }
        )
    locks = target.locks()
    missing = _missing(rows)
    if as_json:
        emit_json(
            {
                "store": target.uri,
                "archive": archive.uri if archive else None,
                "versions": rows,
                "missing": missing,
                "archive_error": archive_error,
                "locks": [lock.to_dict() for lock in locks],
            }
        )
        return
    typer.echo(f"{'MODEL':<30} {'VERSION':>7}  {'STATE':<16}  FILES")
    for row in rows:
        state = str(row["state"]) if row["location"] == "live" else _archived_state(str(row["state"]))
        typer.echo(f"{row['model']:<30} {row['version']:>7}  {state:<16}  {row['files']}")
    for model, versions in missing.items():
        where = f"from the archive {archive.uri}" if archive is not None else "from this store"
        typer.echo(
            f"missing: {model} v{', v'.join(versions)}: neither live nor archived (if this store held "
            f"any, it was deleted {where}; a promotion to one uploads the registry's copy again)"
        )
    if archive_error:
        typer.echo(f"archive not listed: {archive_error}; archived versions are not shown")
    for lock in locks:
        typer.echo(f"locked: {lock.model} by {lock.describe()}" + (" (stale)" if lock.stale else ""))


def _archived(archive: RepositoryStore | None) -> tuple[list[tuple[str, str]], str]:
    """(model, version) of every archived copy, and why the archive could not be listed ("")."""
    if archive is None:
        return [], ""
    try:
        return [(m, v) for m in archive.list_models() for v in archive.list_versions(m)], ""
    except StorageError as exc:
        return [], exc.message


def _missing(rows: list[dict[str, object]]) -> dict[str, list[str]]:
    """model -> the versions below its newest stored one (live or archived) that are in neither:
    a version leaves the store only for its archive, so such a gap is an archived copy deleted --
    or a version this store never held (registered but promoted elsewhere only)."""
    held: dict[str, set[int]] = {}
    for row in rows:
        version = str(row["version"])
        held.setdefault(str(row["model"]), set()).update({int(version)} if version.isdigit() else set())
    return {
        model: [str(v) for v in range(1, max(versions)) if v not in versions]
        for model, versions in sorted(held.items())
        if versions and len(versions) < max(versions)
    }


def _archived_state(state: str) -> str:
    """An archived version whose copy is whole reads ``archived``; else ``archived:<state>``."""
    return "archived" if state in {"verified", "unverified"} else f"archived:{state}"


def _archive(target: RepositoryStore) -> RepositoryStore | None:
    """The archive beside ``target`` (pipelines/storage/archive.py); None where it can have none."""
    try:
        return target.archive()
    except StorageError:
        return None


def _selected(
    target: RepositoryStore, model: str | None, version: str | None, archive: RepositoryStore | None
) -> list[tuple[str, str, str]]:
    """(location, model, version) of every copy to check: live first, then archived."""
    if version is not None and model is None:
        raise UsageError("a version needs its model", fix="mlreg store verify MODEL VERSION")
    models = [model] if model else target.list_models()
    if archive is not None and not model:
        models = sorted(set(models) | set(archive.list_models()))
    pairs: list[tuple[str, str, str]] = []
    for name in models:
        live = target.list_versions(name)
        archived = archive.list_versions(name) if archive is not None else []
        versions = sorted(set(live) | set(archived), key=int)
        if version is not None and version not in versions:
            raise StorageError(
                f"{target.uri}: {name} has no version '{version}' in the store "
                f"(stored: {', '.join(versions) or 'none'})",
                fix="see 'mlreg store ls'",
            )
        if model and not versions:
            raise StorageError(f"{target.uri}: no version of '{name}' is stored", fix="see 'mlreg store ls'")
        pairs.extend(("live", name, v) for v in live if version is None or v == version)
        pairs.extend(("archived", name, v) for v in archived if version is None or v == version)
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
    signatures: bool = typer.Option(
        False, "--signatures", help="Also check each version's signature (beside its manifest)."
    ),
    trusted_keys: list[Path] = typer.Option(
        [], "--trusted-key", help="With --signatures: a trusted PEM public key or CA certificate (repeat)."
    ),
    registered: bool = typer.Option(
        False,
        "--registered",
        help="Also compare each version's manifest and signature with what MLflow registered: "
        "flags one changed after it was written.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Re-hash every file of the stored versions and compare with their manifests.

    Exit 0 when every version matches; 5 naming each bad file otherwise.  Reads only.
    With --registered, a manifest whose digest is not the version's artifact_digest in MLflow, or
    a signature beside it other than the one MLflow holds, was changed after it was written.

    Example: mlreg store verify table_data_model 1 --store s3://127.0.0.1:9000/models/prod
    """
    target = _store(store)
    if digest and not version:
        raise UsageError(
            "--digest needs MODEL and VERSION", fix="mlreg store verify MODEL VERSION --digest SHA"
        )
    if digest and registered:
        raise UsageError("--digest and --registered name the digest twice", fix="pass one of them")
    archive = _archive(target)
    pairs = _selected(target, model, version, archive)
    stores = {"live": target, "archived": archive or target}
    check = _registered_check() if registered else None
    checks = [
        (
            where,
            check(stores[where], m, v) if check else stores[where].check_version(m, v, digest, hashing="all"),
        )
        for where, m, v in pairs
    ]
    bad = [c for _, c in checks if not c.ok]
    signed = _signatures([(stores[w], m, v) for w, m, v in pairs], trusted_keys) if signatures else {}
    if as_json:
        versions = [
            {**c.to_dict(), "location": where, **_signature_of(signed, c.model, c.version)}
            for where, c in checks
        ]
        emit_json({"store": target.uri, "ok": not bad, "versions": versions})
    else:
        for where, c in checks:
            label = "" if where == "live" else " (archived)"
            hashed = f"{c.files} file(s), {c.hashed_bytes:,} bytes hashed"
            typer.echo(f"{c.model}/{c.version}{label}: {c.status} ({hashed})")
            for problem in c.problems:
                typer.echo(f"  {problem.line()}")
            if c.note:
                typer.echo(f"  note: {c.note}")
            if signed:
                typer.echo(f"  signature: {signed[(c.model, c.version)]}")
    if bad:
        files = [f"{c.model}/{c.version}/{p.file}" for c in bad for p in c.problems]
        raise StorageError(
            f"{target.uri}: {len(bad)} of {len(checks)} version(s) do not match their manifest: "
            + ", ".join(files[:10])
            + (f" and {len(files) - 10} more" if len(files) > 10 else ""),
            fix="put the registered bytes back ('mlreg store repair MODEL VERSION'; a promotion re-uploads "
            "what differs too), then verify again",
        )
    unsigned = [f"{m}/{v}" for (m, v), line in signed.items() if not line.startswith("signed by")]
    if unsigned:
        raise StorageError(
            f"{target.uri}: {len(unsigned)} version(s) not signed by a trusted key: {', '.join(unsigned)}",
            fix="sign them ('mlreg sign MODEL VERSION --sign-key KEY'), or pass the signer's --trusted-key",
        )


def _registered_check() -> Callable[[RepositoryStore, str, str], Verification]:
    """--registered: each version against what MLflow registered (the project's registry)."""
    from mlreg.store_ops import registry_of, verify_registered

    registry = registry_of(Settings.from_env())
    return lambda target, model, version: verify_registered(registry, target, model, version)


def _signatures(
    found: list[tuple[RepositoryStore, str, str]], keys: list[Path]
) -> dict[tuple[str, str], str]:
    """--signatures: (model, version) -> "signed by ..." or "NOT verified: why"."""
    from pipelines.promote.integrity import signature_status

    if not keys:
        raise UsageError("--signatures needs the keys to trust", fix="pass --trusted-key PATH (repeat)")
    return {(m, v): signature_status(store, m, v, keys) for store, m, v in found}


def _signature_of(signed: dict[tuple[str, str], str], model: str, version: str) -> dict[str, str]:
    return {"signature": signed[(model, version)]} if (model, version) in signed else {}


@app.command("repair")
def repair_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="The registered model."),
    version: str = typer.Argument(..., help="Its registered version, as stored."),
    env: str = typer.Option(None, "--env", "-e", help="The environment's store (mlreg.toml)."),
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
    as_json: JsonFlag = False,
) -> None:
    """Put a stored version's registered bytes back, as a promotion does when it finds them changed.

    The registry's copy is checked against the digest MLflow registered, the files that differ
    are sent again and the version verified; a signed version's signature is kept (MLflow's put
    back where the store's differs).  Holds the model's lock.

    Example: mlreg store repair scorer 1 --env staging
    """
    from mlreg import service
    from mlreg.store_ops import registry_of, store_repair

    out = Output(as_json)
    settings = settings_of(ctx)
    target = service.store_of(settings, store, env)
    report = store_repair(settings, model, version, registry_of(settings), target)
    out.result(report.to_dict(), lambda: out.line(report.line()))


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


@app.command("unlock")
def unlock_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="The model whose lock to remove."),
    env: str = typer.Option(None, "--env", "-e", help="The environment's store (mlreg.toml)."),
    store: str = typer.Option(None, "--store", "-s", help=STORE_HELP),
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
    from mlreg import service

    out = Output(as_json)
    target = service.store_of(settings_of(ctx), store, env)
    held = target.unlock(model, force or "")
    out.result(
        {"store": target.uri, "unlocked": held.to_dict(), "forced": bool(force)},
        lambda: out.line(f"{target.uri}: removed the lock of '{model}' held by {held.describe()}"),
    )


@app.command("gc")
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
    from mlreg import service

    out = Output(as_json)
    report = service.store_gc(settings_of(ctx), env, keep, dry_run=dry_run, models=model or None)
    out.result(report.to_dict(), lambda: _render_gc(out, report))


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
    if report.failed:
        raise StorageError(
            f"{len(report.failed)} move(s) did not finish: {report.failed[0]}",
            fix="rerun 'mlreg store gc': a version is live, or live and archived, until its move finishes",
        )
