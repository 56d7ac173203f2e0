"""What the registry knows about a model: its versions, one version's lineage, aliases."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from registry.contracts.config import parse_config
from registry.lineage import contract_of
from registry.mlflow import rest, sqlite
from registry.mlflow.locked import lock_wait
from registry.mlflow.reads import open_reads
from registry.mlflow.registry import MlflowRegistry
from registry.settings import Settings

LINEAGE_TAGS = (
    "git_commit",
    "git_dirty",
    "artifact_digest",
    "contract_digest",
    "framework",
    "platform",
    "exporter_sha256",
    "validation",
)


def _when(millis: Any) -> str:
    return datetime.fromtimestamp(int(millis) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _row(
    version: str, created: Any, tags: dict[str, str], by_version: dict[str, list[str]]
) -> dict[str, Any]:
    promoted = sorted(k.removeprefix("promoted_") for k in tags if k.startswith("promoted_"))
    serving = sorted(k.removeprefix("serving_") for k in tags if k.startswith("serving_"))
    return {
        "version": version,
        "created": _when(created),
        "aliases": by_version.get(version, []),
        "validation": tags.get("validation", "unknown"),
        "signed_by": tags.get("signed_by", ""),  # registry.signing.SIGNED_BY_TAG ("": unsigned)
        "promoted": promoted,
        "serving": serving,  # environments this version serves in now (MlflowDeployments.record_deployment)
    }


def list_versions(settings: Settings, model: str) -> list[dict[str, Any]]:
    """Every version of ``model``, newest first (over REST for an HTTP server: no MLflow import)."""
    uri, wait = settings.tracking_uri, lock_wait(settings)
    if uri.startswith(("http://", "https://")):
        raw = rest.search_versions(uri, model, settings.mlflow_timeout)
        alias_map = rest.aliases(uri, model, settings.mlflow_timeout) if raw else {}
        entries = [
            (
                str(v["version"]),
                v.get("creation_timestamp", 0),
                {t["key"]: t["value"] for t in v.get("tags", [])},
            )
            for v in raw
        ]
    elif (record := sqlite.registered_model(uri, model, wait)) is not None:  # the embedded registry
        alias_map, entries = record.aliases, record.versions
    elif sqlite.model_absent(uri, model, wait):
        alias_map, entries = {}, []
    else:
        registry = MlflowRegistry(settings).models
        found = registry.versions(model)
        alias_map = registry.aliases(model) if found else {}
        entries = [(str(v.version), v.creation_timestamp, dict(v.tags or {})) for v in found]
    by_version: dict[str, list[str]] = {}
    for alias, version in sorted(alias_map.items()):
        by_version.setdefault(version, []).append(alias)
    rows = [_row(v, created, tags, by_version) for v, created, tags in entries]
    return sorted(rows, key=lambda r: int(r["version"]), reverse=True)


def show_version(settings: Settings, model: str, version: str) -> dict[str, Any]:
    """One version's lineage, contract, validation and files (``registry.mlflow.reads``: the
    embedded registry's file, no MLflow import; a tracking server through MLflow's client)."""
    reads = open_reads(settings)
    mv = reads.version(model, version)
    aliases = [a for a, v in reads.require_model(model).items() if v == mv.version]
    config = parse_config(reads.artifact_text(mv.run_id, "config.pbtxt"), "config.pbtxt")
    manifest = json.loads(reads.artifact_text(mv.run_id, "manifest.json"))
    validation = json.loads(reads.artifact_text(mv.run_id, "validation.json"))
    tags = mv.tags
    return {
        "model": model,
        "version": mv.version,
        "created": _when(mv.created),
        "run_id": mv.run_id,
        "source": mv.source,
        "aliases": aliases,
        "lineage": {k: tags[k] for k in LINEAGE_TAGS if k in tags},
        "members": {k.removeprefix("member_"): v for k, v in tags.items() if k.startswith("member_")},
        "contract": contract_of(config),
        "validation": validation,
        "signed_by": tags.get("signed_by", ""),  # registry.signing.SIGNED_BY_TAG ("": unsigned)
        "files": manifest["files"],
    }
