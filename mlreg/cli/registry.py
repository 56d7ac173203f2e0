"""Registry commands that write: export, register, sign; and k8s-annotations, which reads it.

Each parses its options, calls its verb in :mod:`mlreg.ops` and renders the result.  The reading
commands (versions, show, alias) are :mod:`mlreg.cli.versions`, re-exported here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlreg.cli.common import (
    EnvName,
    Force,
    JsonFlag,
    ModelName,
    SignCert,
    SignChain,
    SignKey,
    VersionArg,
    settings_of,
)
from mlreg.cli.sink import Output

if TYPE_CHECKING:
    from mlreg.ops.register import RegisterReport


def _print_results(out: Output, report: RegisterReport) -> None:
    """The versions registered (or, for a plan, that would be: their files and tags listed)."""

    def human() -> None:
        for r in report.results:
            planned = report.planned_version(r) is not None
            verb = "would register" if planned else "registered" if r.created else "unchanged, matches"
            signed = f", signed by {r.signed_by}" if r.signed_by else ""
            out.line(f"{r.model}: {verb} version {r.version} (validation {r.validation}{signed})")
            for line in r.findings:
                out.line(f"  error: {line}")
        if report.dry_run:
            out.line("dry run: nothing was registered in MLflow")

    out.result(report.to_dict(), human)


def export_cmd(
    ctx: typer.Context,
    models: Annotated[
        list[str] | None, typer.Argument(help="Template models to export (default: all).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Random seed of the exported weights (another seed, another version).")
    ] = 0,
    force: Force = False,
    changed: Annotated[
        bool,
        typer.Option(
            "--changed",
            help="List only versions the --against alias does not hold yet (for CI). Needs a base: "
            "some registered model must hold that alias, else exit 2 before anything is registered.",
        ),
    ] = False,
    against: Annotated[
        str | None,
        typer.Option("--against", help="The alias --changed compares with (default: staging)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Register nothing (MLflow is only read): list what would be registered, for "
            "'mlreg promote --from-file F --dry-run' (a pull request's plan).",
        ),
    ] = False,
    sign_key: SignKey = None,
    sign_cert: SignCert = None,
    sign_chain: SignChain = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the template's exporters and register every result as an MLflow model version.

    Example: mlreg export image_model --seed 7
    """
    from mlreg.cli.progress import activity  # lazy: rich, on a terminal only
    from mlreg.ops.export import export_versions  # lazy: MLflow and the exporters, when run
    from mlreg.ops.sign import SignerSpec  # lazy: as above

    settings = settings_of(ctx)
    with activity(quiet=as_json, settings=settings) as step:  # "exporting image_model (2/4)"
        report = export_versions(
            settings,
            models,
            seed=seed,
            force=force,
            changed=changed,
            against=against,
            dry_run=dry_run,
            signing=SignerSpec(sign_key, sign_cert, sign_chain),
            on_step=step,
        )
    _print_results(Output(as_json), report)


def register_cmd(
    ctx: typer.Context,
    model: ModelName,
    path: Annotated[
        Path,
        typer.Argument(
            help="A Triton model folder (config.pbtxt + one version folder), "
            "or a version folder with --config."
        ),
    ],
    config: Annotated[
        Path | None, typer.Option("--config", help="config.pbtxt, when PATH is a version folder.")
    ] = None,
    force: Force = False,
    allow_invalid: Annotated[
        bool,
        typer.Option("--allow-invalid", help="Exit 0 even when the version fails validation (meant)."),
    ] = False,
    sign_key: SignKey = None,
    sign_cert: SignCert = None,
    sign_chain: SignChain = None,
    as_json: JsonFlag = False,
) -> None:
    """Register a version exported elsewhere.  It is validated: a failing contract is still
    recorded, tagged validation=failed (no promotion takes it), and exits 3 unless --allow-invalid.

    Example: mlreg register image_model build/image_model
    """
    from mlreg.ops.register import register_version  # lazy: MLflow, when run
    from mlreg.ops.sign import SignerSpec  # lazy: as above

    signing = SignerSpec(sign_key, sign_cert, sign_chain)
    report = register_version(settings_of(ctx), model, path, config, force=force, signing=signing)
    _print_results(Output(as_json), report)
    if not allow_invalid and (failed := report.failed_validation()) is not None:
        raise failed


def sign_cmd(
    ctx: typer.Context,
    model: ModelName,
    version: VersionArg,
    sign_key: SignKey = None,
    sign_cert: SignCert = None,
    sign_chain: SignChain = None,
    as_json: JsonFlag = False,
) -> None:
    """Sign a version registered earlier: its registered files are hashed, checked against the
    digest MLflow recorded, and signed; the signature is logged beside its manifest.

    Example: mlreg sign image_model 3 --sign-key release.pem
    """
    from mlreg.ops.sign import SignerSpec, sign_version  # lazy: MLflow, when run

    signer = SignerSpec(sign_key, sign_cert, sign_chain).required()
    report = sign_version(settings_of(ctx), model, version, signer)
    out = Output(as_json)
    out.result(report.to_dict(), lambda: out.line(report.line()))


def k8s_annotations_cmd(
    ctx: typer.Context,
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="[MODEL]...", help="The models the Deployment serves (default: all in ENV)."),
    ] = None,
    env: EnvName = "local",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the patch here (default: stdout).")
    ] = None,
) -> None:
    """A merge patch annotating a Triton Deployment (metadata only: no pod restarts) with what it
    serves: per model, the version ENV's alias holds, its digest and its signature reference
    (model.k8saibom.dev/* keys).

    Example: mlreg k8s-annotations image_model table_data_model -e staging -o patch.json &&
    kubectl patch deployment triton --type merge --patch-file patch.json
    """
    from mlreg.ops.k8s_annotations import k8s_annotations  # lazy: MLflow, when run

    patch = k8s_annotations(settings_of(ctx), env, models or [])
    text = json.dumps(patch, indent=1, sort_keys=True)
    if output is None:
        Output().line(text)
    else:
        output.write_text(text + "\n")
        Output().line(f"wrote {output}: {len(patch['metadata']['annotations'])} annotation(s)")
