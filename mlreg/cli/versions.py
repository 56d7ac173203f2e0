"""Reading the registry: ``mlreg versions``, ``mlreg show``; moving aliases: ``mlreg alias``."""

from __future__ import annotations

from typing import Any

import typer

from mlreg.cli.common import JsonFlag, ModelName, ModelVersion, VersionArg, settings_of
from mlreg.cli.sink import Output

alias_app = typer.Typer(help="List, set or remove a registered model's aliases.", no_args_is_help=True)


def versions_cmd(ctx: typer.Context, model: ModelName, as_json: JsonFlag = False) -> None:
    """List a model's versions: created, aliases, validation status, where promoted.

    Exit 4 when MODEL is not a registered model.
    """
    from mlreg.ops.versions import versions  # lazy: MLflow (~1 s), when run

    rows = versions(settings_of(ctx), model)
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
    from mlreg.ops.versions import show  # lazy: MLflow (~1 s), when run

    data = show(settings_of(ctx), model, version)
    out = Output(as_json)
    out.result(data, lambda: _show_human(out, model, data))


@alias_app.command("ls")
def alias_ls(ctx: typer.Context, model: ModelName, as_json: JsonFlag = False) -> None:
    """List MODEL's aliases and the versions they name.  Example: mlreg alias ls image_model"""
    from mlreg.ops.versions import aliases  # lazy: the embedded registry's file, no MLflow

    found = aliases(settings_of(ctx), model)
    out = Output(as_json)
    rows = [[alias, version] for alias, version in found.items()]
    out.result(
        {"model": model, "aliases": found},
        lambda: out.table(["ALIAS", "VERSION"], rows, right={"VERSION"})
        if rows
        else out.line(f"{model}: no aliases"),
    )


@alias_app.command("set")
def alias_set(ctx: typer.Context, model: ModelName, alias: str, version: VersionArg) -> None:
    """Point ALIAS of MODEL at VERSION.  Example: mlreg alias set image_model staging 2"""
    from mlreg.ops.versions import set_alias  # lazy: MLflow (~1 s), when run

    set_alias(settings_of(ctx), model, alias, version)
    Output().line(f"{model}@{alias} -> version {version}")


@alias_app.command("rm")
def alias_rm(ctx: typer.Context, model: ModelName, alias: str) -> None:
    """Remove ALIAS from MODEL.  Example: mlreg alias rm image_model staging"""
    from mlreg.ops.versions import remove_alias  # lazy: MLflow (~1 s), when run

    remove_alias(settings_of(ctx), model, alias)
    Output().line(f"{model}@{alias} removed")
