"""``mlreg store verify`` and ``mlreg store repair``: a stored version's bytes against its manifest
and what MLflow registered (:mod:`mlreg.ops.store_verify`, :mod:`mlreg.ops.store_repair`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlreg.cli.common import JsonFlag, StoreUri, settings_of
from mlreg.cli.sink import Output

if TYPE_CHECKING:
    from mlreg.ops.store_verify import StoreVerifyReport


def verify_cmd(
    model: str = typer.Argument(None, help="Only this model (default: every model)."),
    version: str = typer.Argument(None, help="Only this version of MODEL."),
    store: StoreUri = None,
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
    as_json: JsonFlag = False,
) -> None:
    """Re-hash every file of the stored versions and compare with their manifests.

    Exit 0 when every version matches; 5 naming each bad file otherwise.  Reads only.
    With --registered, a manifest whose digest is not the version's artifact_digest in MLflow, or
    a signature beside it other than the one MLflow holds, was changed after it was written.

    Example: mlreg store verify table_data_model 1 --store s3://127.0.0.1:9000/models/prod
    """
    from mlreg.ops.store_verify import store_verify  # lazy: the storage package (and MLflow), when run

    keys = trusted_keys if signatures else None
    report = store_verify(store, model, version, digest=digest, registered=registered, trusted_keys=keys)
    out = Output(as_json)
    out.result(report.to_dict(), lambda: _render_verify(out, report))
    failure = report.failure()
    if failure is not None:
        raise failure


def _render_verify(out: Output, report: StoreVerifyReport) -> None:
    for where, c in report.checks:
        label = "" if where == "live" else " (archived)"
        hashed = f"{c.files} file(s), {c.hashed_bytes:,} bytes hashed"
        out.line(f"{c.model}/{c.version}{label}: {c.status} ({hashed})")
        for problem in c.problems:
            out.line(f"  {problem.line()}")
        if c.note:
            out.line(f"  note: {c.note}")
        if report.signed:
            out.line(f"  signature: {report.signature(c.model, c.version)}")


def repair_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="The registered model."),
    version: str = typer.Argument(..., help="Its registered version, as stored."),
    env: str = typer.Option(None, "--env", "-e", help="The environment's store (mlreg.toml)."),
    store: StoreUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Put a stored version's registered bytes back, as a promotion does when it finds them changed.

    The registry's copy is checked against the digest MLflow registered, the files that differ
    are sent again and the version verified; a signed version's signature is kept (MLflow's put
    back where the store's differs).  Holds the model's lock.

    Example: mlreg store repair scorer 1 --env staging
    """
    from mlreg.ops.context import open_registry, store_of  # lazy: MLflow (~1.5 s), storage: when run
    from mlreg.ops.store_repair import store_repair  # lazy: as above

    out = Output(as_json)
    settings = settings_of(ctx)
    target = store_of(settings, store, env)
    report = store_repair(settings, model, version, open_registry(settings), target)
    out.result(report.to_dict(), lambda: out.line(report.line()))
