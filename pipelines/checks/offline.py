"""Offline checks of a plan: contracts against the environment's repository, and the contract diff."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipelines.core.plan import Plan, serving_versions
from pipelines.storage.base import Repository
from registry.contracts.checks import check_artifacts
from registry.contracts.config import CONFIG_NAME, parse_config
from registry.contracts.diff import diff_configs
from registry.contracts.ensemble import check_ensembles
from registry.contracts.repository import read_repository
from registry.contracts.rules import check_model
from registry.errors import ContractError


def shadow_repository(plan: Plan, store: Repository, root: Path) -> Path:
    """The environment's repository as it will be: store configs + the plan's models and configs."""
    steps = {s.model: s for s in plan.steps}
    for model in set(store.list_models()) | set(steps):
        folder = root / model
        folder.mkdir(parents=True)
        step = steps.get(model)
        text = step.config_text if step else store.read_config(model)
        if text is None:
            continue
        (folder / CONFIG_NAME).write_text(text)
        versions = set(store.list_versions(model)) | set(serving_versions(text))
        for version in versions:
            (folder / version).mkdir(exist_ok=True)
        if step and step.folder is not None:
            (folder / step.version).rmdir()
            (folder / step.version).symlink_to((step.folder / step.version).resolve())
    return root


def contract_errors(plan: Plan, store: Repository) -> list[str]:
    """Errors of the plan's models and of every ensemble of the environment, as they will serve."""
    with tempfile.TemporaryDirectory(prefix="mlreg-shadow-") as tmp:
        repo = read_repository(shadow_repository(plan, store, Path(tmp)))
        findings = list(repo.findings)
        for step in plan.steps:
            entry = repo.models[step.model]
            if step.folder is not None:
                findings.extend(check_model(entry))
                findings.extend(check_artifacts(entry, [step.version]))
        involved = {s.model for s in plan.steps}
        findings.extend(f for f in check_ensembles(repo))
        return [
            f.line()
            for f in findings
            if f.is_error and (f.model in involved or f.rule.startswith("ensemble"))
        ]


def breaking_changes(plan: Plan) -> list[str]:
    """Breaking contract changes of the promoted model against the version serving now."""
    step = plan.step(plan.model)
    if step.previous_config is None:
        return []
    try:
        changes = diff_configs(parse_config(step.previous_config), parse_config(step.config_text))
    except ContractError as exc:
        return [exc.message]
    return [c.line() for c in changes if c.impact == "breaking"]
