"""``mlreg promote --from-alias A | --from-file F``: several versions, one promotion each.

Each (model, version) goes through the promote verb (:mod:`mlreg.ops.promote`), members before
ensembles (or ensembles first when copying another environment's alias).  The result is one
document: per version the promotion report (plan + stages), the contract diff against what the
environment serves, and the error with its fix; ``mlreg report`` renders it as the job summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import context, environment
from mlreg.ops.promote import promote
from pipelines.core.options import Options
from registry.errors import MlregError, RegistryError, UsageError
from registry.register import check_model_name
from registry.settings import Settings, redact_uri

if TYPE_CHECKING:
    from pipelines.core.ports import Registry
    from registry.export import PlannedVersion
    from registry.ports import RegistryReader


@dataclass
class BatchResult:
    environment: str
    alias: str
    dry_run: bool
    mlflow: str
    promotions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p["ok"] for p in self.promotions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "promotions",
            "ok": self.ok,
            "environment": self.environment,
            "alias": self.alias,
            "dry_run": self.dry_run,
            "mlflow": self.mlflow,
            "promotions": self.promotions,
        }


def versions_from_export(path: Path) -> list[tuple[str, str]]:
    """The (model, version) pairs an ``mlreg export --json`` document lists, in its order."""
    return [(model, version) for model, version, _ in _export_entries(path)]


def planned_from_export(path: Path) -> list[PlannedVersion] | None:
    """The versions an ``mlreg export --dry-run --json`` document lists as planned (not registered:
    their files and tags), for a plan's ``PlanRegistry``; None for an export that registered."""
    from registry.export import PlannedVersion  # lazy: MLflow entities, only for a plan of an export

    try:
        if json.loads(path.read_text()).get("dry_run") is not True:
            return None
    except (OSError, ValueError, AttributeError) as exc:
        raise _not_an_export(path, exc) from exc
    try:
        return [
            PlannedVersion.from_dict(model, version, planned)
            for model, version, planned in _export_entries(path)
            if planned is not None
        ]
    except (KeyError, TypeError) as exc:
        raise _not_an_export(path, exc) from exc


def _export_entries(path: Path) -> list[tuple[str, str, dict[str, Any] | None]]:
    try:
        data = json.loads(path.read_text())
        entries = [(str(v["model"]), str(v["version"]), v.get("planned")) for v in data["versions"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _not_an_export(path, exc) from exc
    for model, _, _ in entries:
        check_model_name(model)
    return entries


def _not_an_export(path: Path, exc: Exception) -> UsageError:
    return UsageError(
        f"{path}: not an 'mlreg export --json' document ({type(exc).__name__}: {exc})",
        fix="pass the file 'mlreg export --changed --json > FILE' wrote",
    )


def versions_from_alias(
    registry: RegistryReader, source: str, target: str, model: str | None = None
) -> list[tuple[str, str]]:
    """Every model whose ``source`` alias names a version the ``target`` alias does not (only
    ``model`` when given).  An alias no version holds is a RegistryError naming it: a typo must not
    read as "nothing to promote"."""
    if source == target:
        raise UsageError(
            f"--from-alias '{source}' is the alias of the environment promoted to: nothing to copy",
            fix="pass the alias of another environment, e.g. --from-alias staging --env production",
        )
    if model is not None:
        return _one_from_alias(registry, source, target, model)
    wanted = registry.alias_versions(source)
    if not wanted:
        raise RegistryError(
            f"alias '{source}' names no version of any registered model in MLflow "
            f"({redact_uri(registry.uri)})",
            fix="check the alias (each environment's alias is in mlreg.toml; 'mlreg versions MODEL' "
            "lists a model's aliases), or promote to that environment first",
        )
    held = registry.alias_versions(target)
    return [(name, version) for name, version in wanted.items() if held.get(name) != version]


def _one_from_alias(registry: RegistryReader, source: str, target: str, model: str) -> list[tuple[str, str]]:
    """``model``'s version under ``source``, unless ``target`` holds it already."""
    check_model_name(model)
    aliases = registry.require_model(model)
    if source not in aliases:
        held = ", ".join(sorted(aliases)) or "none"
        raise RegistryError(
            f"model '{model}' has no alias '{source}' in MLflow ({redact_uri(registry.uri)}); "
            f"its aliases: {held}",
            fix=f"pass one of its aliases, or see 'mlreg versions {model}'",
        )
    wanted = aliases[source]
    return [] if aliases.get(target) == wanted else [(model, wanted)]


def ordered(
    registry: RegistryReader, pairs: list[tuple[str, str]], ensembles_first: bool
) -> list[tuple[str, str]]:
    """Members before ensembles (a new export: an ensemble pins its members' versions), or
    ensembles first (another environment's alias: promoting the ensemble version brings the
    member versions it pins, so the target ends up holding exactly the source's versions)."""

    def is_ensemble(pair: tuple[str, str]) -> bool:
        tags = dict(registry.version(*pair).tags or {})
        return tags.get("platform") == "ensemble" or any(k.startswith("member_") for k in tags)

    flags = {pair: is_ensemble(pair) for pair in pairs}
    return sorted(pairs, key=lambda pair: flags[pair] != ensembles_first)


def contract_diff(result: Any) -> list[dict[str, Any]]:
    """The promoted model's contract changes against the config its environment serves now."""
    from registry.contracts.config import parse_config  # lazy: protobuf
    from registry.contracts.diff import diff_configs  # lazy: protobuf

    try:
        step = result.plan.step(result.plan.model)
    except StopIteration:
        return []
    if step.previous_config is None:
        return [
            {"kind": "first deployment", "tensor": None, "impact": "compatible", "old": None, "new": None}
        ]
    try:
        changes = diff_configs(parse_config(step.previous_config), parse_config(step.config_text))
    except MlregError as exc:
        return [{"kind": "unreadable", "tensor": None, "impact": "breaking", "old": None, "new": exc.message}]
    return [c.to_dict() for c in changes]


def _entry(model: str, version: str, result: Any, error: MlregError | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"model": model, "version": version, "ok": error is None}
    if result is not None:
        entry["report"] = result.to_dict()
        entry["contract_diff"] = contract_diff(result)
    if error is not None:
        entry["error"] = error.message
        entry["fix"] = error.fix or ""
        entry["exit_code"] = error.exit_code
    return entry


def promote_many(
    settings: Settings,
    env_name: str,
    pairs: list[tuple[str, str]],
    options: Options,
    ensembles_first: bool = False,
    planned: list[PlannedVersion] | None = None,
) -> BatchResult:
    """Promote each (model, version) in order, each as ``options`` say.  A real run stops at the
    first failure (an ensemble must not be promoted over a member that failed); a dry run plans
    every one.  A version the environment's alias holds by then (an ensemble's promotion brought
    it) is skipped.  ``planned``: versions an ``export --dry-run`` did not register, which only a
    dry run can plan (MLflow is then only read)."""
    from registry.export import PlanRegistry  # lazy: MLflow's entities

    dry_run = options.dry_run
    if planned and not dry_run:
        listed = ", ".join(f"{v.name} v{v.version}" for v in planned)
        raise UsageError(
            f"{listed}: planned by 'mlreg export --dry-run', not registered: only a plan can use them",
            fix="pass --dry-run, or run 'mlreg export --changed --json' (it registers) and promote its file",
        )
    ctx = context(settings, env_name)
    env = ctx.env
    plan = None if planned is None else PlanRegistry(ctx.registry, planned)
    registry: Registry = plan or ctx.registry
    batch = BatchResult(env.name, env.alias, dry_run, settings.tracking_uri)
    for model, version in ordered(registry.models, pairs, ensembles_first):
        if batch.promotions and not batch.ok and not dry_run:
            batch.promotions.append({"model": model, "version": version, "ok": False, "skipped": True})
            continue
        if batch.promotions and registry.models.aliases(model).get(env.alias) == version:
            batch.promotions.append({"model": model, "version": version, "ok": True, "held": True})
            continue
        try:
            result = promote(settings, env_name, model, version, options, registry=registry)
            batch.promotions.append(_entry(model, version, result, None))
        except MlregError as exc:
            batch.promotions.append(_entry(model, version, exc.context.get("result"), exc))
        if plan is not None:  # not in MLflow: the report links to no version page
            batch.promotions[-1]["registered"] = plan.models.planned_version(model, version) is None
    return batch


__all__ = [
    "BatchResult",
    "contract_diff",
    "ordered",
    "planned_from_export",
    "promote_listed",
    "promote_many",
    "versions_from_alias",
    "versions_from_export",
]


def promote_listed(
    settings: Settings,
    env_name: str,
    from_alias: str | None,
    from_file: Path | None,
    model: str | None = None,
    options: Options | None = None,
) -> BatchResult:
    """``mlreg promote [MODEL] --from-alias A | --from-file F --env E``: the versions another
    environment's alias holds (ensembles first: they bring the members they pin; only MODEL's
    when given) or those an ``mlreg export --json`` listed (members first; no MODEL)."""
    from registry.mlflow import MlflowRegistry  # lazy: ~1 s of MLflow a `--help` never pays

    if bool(from_alias) == bool(from_file):
        raise UsageError("--from-alias and --from-file exclude each other", fix="pass one of them")
    planned = None
    if from_file is not None:
        if model:
            raise UsageError(
                f"MODEL '{model}' and --from-file exclude each other: the file lists the versions",
                fix=f"drop MODEL, or promote it alone: mlreg promote {model} --version N --env {env_name}",
            )
        pairs = versions_from_export(from_file)
        planned = planned_from_export(from_file)
    else:
        target = environment(settings, env_name).alias
        pairs = versions_from_alias(MlflowRegistry(settings).models, str(from_alias), target, model or None)
    return promote_many(
        settings, env_name, pairs, options or Options(), ensembles_first=bool(from_alias), planned=planned
    )
