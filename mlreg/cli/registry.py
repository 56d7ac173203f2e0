"""Registry commands: export, register, sign, versions, show, alias."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mlreg.cli.common import EnvName, JsonFlag, ModelName, ModelVersion, VersionArg, settings_of
from mlreg.cli.output import Output

if TYPE_CHECKING:
    from registry.export import PlannedVersion, PlanRegistry
    from registry.register import RegisterResult
    from registry.settings import Settings
    from registry.signing import SigningKey

alias_app = typer.Typer(help="Set or remove a registered model's aliases.", no_args_is_help=True)
Force = Annotated[bool, typer.Option("--force", help="Register even when identical bytes are registered.")]
SignKey = Annotated[
    str | None,
    typer.Option(
        "--sign-key",
        envvar="MLREG_SIGNING_KEY",
        metavar="PATH",
        help="Sign the version (OpenSSF model signing): an EC private key in PEM, or 'sigstore' for "
        "keyless signing with the ambient OIDC identity (GitHub Actions).",
    ),
]
SignCert = Annotated[
    str | None,
    typer.Option(
        "--sign-cert",
        envvar="MLREG_SIGNING_CERT",
        metavar="PATH",
        help="With --sign-key: the key's certificate (PEM), to sign with a certificate.",
    ),
]
SignChain = Annotated[
    str | None,
    typer.Option(
        "--sign-chain",
        envvar="MLREG_SIGNING_CHAIN",
        metavar="PATH",
        help="With --sign-cert: the certificates up to the root (PEM).",
    ),
]


def _signer(key: str | None, cert: str | None, chain: str | None) -> SigningKey | None:
    if not key:
        return None
    from registry.signing import SigningKey

    return SigningKey.of(key, cert, chain)


def _print_results(out: Output, results: list[RegisterResult], plan: PlanRegistry | None = None) -> None:
    """The versions registered (or, for a plan, that would be: their files and tags listed)."""

    def planned(r: RegisterResult) -> PlannedVersion | None:
        return plan.planned_version(r.model, r.version) if plan is not None else None

    def human() -> None:
        for r in results:
            verb = "would register" if planned(r) else "registered" if r.created else "unchanged, matches"
            signed = f", signed by {r.signed_by}" if r.signed_by else ""
            out.line(f"{r.model}: {verb} version {r.version} (validation {r.validation}{signed})")
            for line in r.findings:
                out.line(f"  error: {line}")
        if plan is not None:
            out.line("dry run: nothing was registered in MLflow")

    rows = []
    for r in results:
        row = r.to_dict()
        if (version := planned(r)) is not None:
            row["planned"] = version.to_dict()
        rows.append(row)
    doc: dict[str, Any] = {"versions": rows}
    if plan is not None:
        doc["dry_run"] = True
    out.result(doc, human)


def _registry(settings: Settings) -> Any:
    from registry.mlflow import MlflowRegistry

    return MlflowRegistry(settings)


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
    from registry.errors import UsageError
    from registry.export import PlanRegistry, export

    if against is not None and not changed:
        raise UsageError(
            "--against only applies with --changed",
            fix=f"pass --changed --against {against}, or drop --against",
        )
    settings = settings_of(ctx)
    registry = _registry(settings)
    plan = PlanRegistry(registry) if dry_run else None
    base = (against or "staging") if changed else None
    signer = None if dry_run else _signer(sign_key, sign_cert, sign_chain)
    results = export(
        settings, plan or registry, models or None, seed=seed, force=force, against=base, signer=signer
    )
    _print_results(Output(as_json), results, plan)


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
    sign_key: SignKey = None,
    sign_cert: SignCert = None,
    sign_chain: SignChain = None,
    as_json: JsonFlag = False,
) -> None:
    """Register a version exported elsewhere (validated; a failing contract is tagged validation=failed).

    Example: mlreg register image_model build/image_model
    """
    from pipelines.storage import check_model_name_fits
    from registry.errors import UsageError
    from registry.register import find_candidate, register

    check_model_name_fits(model)  # every store must be able to lock it: before anything is written
    settings = settings_of(ctx)
    candidate = find_candidate(path, config)
    if candidate.name != model:
        raise UsageError(
            f"'{path}' holds model '{candidate.name}', not '{model}'",
            fix=f"run 'mlreg register {candidate.name} {path}' or fix the config's name",
        )
    signer = _signer(sign_key, sign_cert, sign_chain)
    result = register(_registry(settings), candidate, force=force, signer=signer)
    _print_results(Output(as_json), [result])


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
    from registry.errors import UsageError
    from registry.register import sign_registered

    signer = _signer(sign_key, sign_cert, sign_chain)
    if signer is None:
        raise UsageError(
            "mlreg sign needs a key", fix="pass --sign-key PATH (or set MLREG_SIGNING_KEY), or 'sigstore'"
        )
    signed_by = sign_registered(_registry(settings_of(ctx)), model, version, signer)
    out = Output(as_json)
    out.result(
        {"model": model, "version": version, "signed_by": signed_by},
        lambda: out.line(f"{model}: version {version} signed by {signed_by}"),
    )


def versions_cmd(ctx: typer.Context, model: ModelName, as_json: JsonFlag = False) -> None:
    """List a model's versions: created, aliases, validation status, where promoted.

    Exit 4 when MODEL is not a registered model.
    """
    from registry.mlflow.queries import list_versions

    settings = settings_of(ctx)
    rows = list_versions(settings, model)
    if not rows:
        _registry(settings).require_model(model)
    out = Output(as_json)
    if out.json:
        out.document({"model": model, "versions": rows})
    elif not rows:
        out.line(f"{model}: no versions registered")
    else:
        out.table(
            ["VERSION", "CREATED (UTC)", "VALIDATION", "SIGNED BY", "ALIASES", "PROMOTED"],
            (
                [
                    r["version"],
                    r["created"],
                    r["validation"],
                    r.get("signed_by") or "unsigned",
                    ",".join(r["aliases"]),
                    ",".join(r["promoted"]),
                ]
                for r in rows
            ),
            right={"VERSION"},
        )


def _show_human(out: Output, model: str, data: dict[str, Any]) -> None:
    aliases = ", ".join(data["aliases"]) or "-"
    out.line(f"{model} version {data['version']} (created {data['created']} UTC, aliases: {aliases})")
    out.line(f"signature: signed by {data['signed_by']}" if data.get("signed_by") else "signature: unsigned")
    out.line("lineage:")
    members = {f"member {m}": f"version {v}" for m, v in sorted(data["members"].items())}
    out.fields({**data["lineage"], **members})
    contract = data["contract"]
    out.line(f"contract: {contract['platform']}, max_batch_size {contract['max_batch_size']}")
    tensors = [
        [io[:-1], t["name"], t["dtype"], str(t["shape"])]
        for io in ("inputs", "outputs")
        for t in contract[io]
    ]
    out.table(["", "TENSOR", "DTYPE", "SHAPE"], tensors)
    out.line(f"files ({len(data['files'])}):")
    files = [[rel, f"{meta['size']:,}", meta["sha256"][:12]] for rel, meta in sorted(data["files"].items())]
    out.table(["FILE", "BYTES", "SHA256"], files, right={"BYTES"})


def show_cmd(ctx: typer.Context, model: ModelName, version: ModelVersion, as_json: JsonFlag = False) -> None:
    """Show one version: lineage, contract and files."""
    from registry.mlflow.queries import show_version

    data = show_version(settings_of(ctx), model, version)
    data.setdefault("signed_by", "")
    out = Output(as_json)
    out.result(data, lambda: _show_human(out, model, data))


@alias_app.command("set")
def alias_set(ctx: typer.Context, model: ModelName, alias: str, version: VersionArg) -> None:
    """Point ALIAS of MODEL at VERSION.  Example: mlreg alias set image_model staging 2"""
    _registry(settings_of(ctx)).set_alias(model, alias, version)
    Output().line(f"{model}@{alias} -> version {version}")


@alias_app.command("rm")
def alias_rm(ctx: typer.Context, model: ModelName, alias: str) -> None:
    """Remove ALIAS from MODEL.  Example: mlreg alias rm image_model staging"""
    _registry(settings_of(ctx)).delete_alias(model, alias)
    Output().line(f"{model}@{alias} removed")


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
    import json

    from pipelines.promote.environments import environment
    from pipelines.promote.k8s_annotations import annotation_patch

    settings = settings_of(ctx)
    alias = environment(settings, env).alias
    patch = annotation_patch(_registry(settings), alias, models or [], env)
    text = json.dumps(patch, indent=1, sort_keys=True)
    if output is None:
        Output().line(text)
    else:
        output.write_text(text + "\n")
        Output().line(f"wrote {output}: {len(patch['metadata']['annotations'])} annotation(s)")
