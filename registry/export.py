"""``mlreg export``: run the template's exporters, then register every result."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from registry import template
from registry.contracts.config import CONFIG_NAME, load_config
from registry.errors import UsageError
from registry.mlflow import MlflowRegistry
from registry.register import RegisterResult, find_candidate, register
from registry.settings import Settings


def _is_ensemble(model_dir: Path) -> bool:
    return load_config(model_dir / CONFIG_NAME).platform == "ensemble"


def member_versions(registry: MlflowRegistry, model_dir: Path) -> dict[str, str]:
    """For an ensemble: the registry version of each member it was built against."""
    config = load_config(model_dir / CONFIG_NAME)
    members = {}
    for step in config.ensemble_scheduling.step:
        if step.model_version > 0:
            members[step.model_name] = str(step.model_version)
        else:
            versions = registry.versions(step.model_name)
            members[step.model_name] = str(max((int(v.version) for v in versions), default=0))
    return members


def export_models(
    settings: Settings,
    registry: MlflowRegistry,
    models: list[str] | None = None,
    seed: int = 0,
    force: bool = False,
    on_model: Callable[[str], None] | None = None,
) -> list[RegisterResult]:
    staging = settings.home / "exports"
    if staging.exists():
        shutil.rmtree(staging)
    # registered configs are the template's own (KIND_GPU kept): devices are adapted at deploy
    built = template.build(
        settings.template_dir, staging, models=models, seed=seed, device="gpu", force=True, on_model=on_model
    )
    folders = sorted(
        (p for p in staging.iterdir() if (p / CONFIG_NAME).is_file()), key=lambda p: (_is_ensemble(p), p.name)
    )  # members before ensembles
    results = []
    for folder in folders:
        exporter = template.exporter_path(settings.template_dir / folder.name)
        members = member_versions(registry, folder) if _is_ensemble(folder) else None
        info = dict(built.exported.get(folder.name) or {})
        results.append(
            register(
                registry,
                find_candidate(folder),
                force=force,
                exporter=exporter,
                export_info=info,
                members=members,
            )
        )
    return results


def require_base(registry: MlflowRegistry, alias: str) -> None:
    """``mlreg export --changed`` compares with ``alias``: a UsageError, before anything is exported
    or registered, when no registered model holds it.  Then there is nothing to compare with (a
    fresh registry, e.g. MLREG_HOME outside the project, or a typo) and "changed" would silently
    mean every model."""
    if registry.alias_versions(alias):
        return
    raise UsageError(
        f"--changed lists the versions alias '{alias}' does not hold yet, but no registered model "
        f"in MLflow ({registry.uri}) holds '{alias}': there is nothing to compare with",
        fix="pass --against the alias of an environment promoted to, or point MLFLOW_TRACKING_URI "
        "at the project's registry; before the first promotion, drop --changed (every model is new)",
    )


def changed_versions(
    registry: MlflowRegistry, results: list[RegisterResult], alias: str
) -> list[RegisterResult]:
    """The results an environment owning ``alias`` does not have yet (``mlreg export --changed``):
    a version registered just now, or one newer than the version the alias holds (registered by
    an earlier export, e.g. a pull request's plan).  An ensemble re-pointed by a promotion holds a
    newer alias than its template's version, so it is not listed again."""
    changed = []
    for r in results:
        held = registry.aliases(r.model).get(alias)
        if r.created or held is None or int(r.version) > int(held):
            changed.append(r)
    return changed
