"""The application's operations on an environment: promote, rollback, status, history.

The CLI (``mlreg/cli/promote.py``) and the MLflow deployments plugin (``mlreg/deployments.py``)
both call these; each composes the registry (MLflow) with the pipelines (store, servers) and
returns a typed result that the caller renders.  Failures are ``MlregError``s; a failed promotion
is a ``PromotionFailed`` whose ``result`` holds the plan, the stage reports and what was undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.promote.environments import Environment
    from pipelines.promote.reports import PromotionResult
    from pipelines.promote.runner import OnStage
    from registry.mlflow_registry import MlflowRegistry

SERVE_AS = ("auto", "native", "onnx")


@dataclass
class Context:
    settings: Settings
    env: Environment
    registry: MlflowRegistry


def context(settings: Settings, env_name: str) -> Context:
    from pipelines.promote.environments import environment
    from registry.mlflow_registry import MlflowRegistry

    return Context(settings, environment(settings, env_name), MlflowRegistry(settings))


def promote(
    settings: Settings,
    env_name: str,
    model: str,
    version: str,
    *,
    dry_run: bool = False,
    allow_breaking: bool = False,
    skip_quality: bool = False,
    serve_as: str = "auto",
    on_stage: OnStage | None = None,
) -> PromotionResult:
    """Promote ``model`` ``version`` to the environment (a PromotionFailed when it cannot)."""
    from pipelines.promote.runner import Options, Promotion

    if serve_as not in SERVE_AS:
        raise UsageError(f"unknown --serve-as '{serve_as}'", fix=f"use {', '.join(SERVE_AS)}")
    if not version.isdigit():
        raise UsageError(f"version '{version}' is not a number", fix="pass --version N (1, 2, 3, ...)")
    ctx = context(settings, env_name)
    options = Options(dry_run, allow_breaking, skip_quality, serve_as, on_stage)
    return Promotion(settings, ctx.env, ctx.registry, options).run(model, version)


def rollback(
    settings: Settings,
    env_name: str,
    model: str,
    to_version: str | None = None,
    *,
    dry_run: bool = False,
    on_stage: OnStage | None = None,
) -> PromotionResult:
    """Serve an earlier version again: a promotion without the quality gate (breaking allowed)."""
    from pipelines.promote.status import previous_version

    if to_version is None:
        to_version = previous_version(context(settings, env_name).registry, model, env_name)
        if to_version is None:
            raise UsageError(
                f"no earlier promotion of {model} in '{env_name}' to return to",
                fix=f"pass --to-version N (see 'mlreg history {model}')",
            )
    return promote(
        settings,
        env_name,
        model,
        to_version,
        dry_run=dry_run,
        allow_breaking=True,
        skip_quality=True,
        on_stage=on_stage,
    )


@dataclass
class StatusReport:
    environment: str
    models: list[dict[str, Any]]

    @property
    def drift(self) -> bool:
        return any(row["drift"] for row in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "drift": self.drift, "models": self.models}


def status(settings: Settings, env_name: str, model: str | None = None) -> StatusReport:
    """The alias, the store's desired versions and what each target serves, per model; drift flagged."""
    from pipelines.promote.status import model_status

    ctx = context(settings, env_name)
    return StatusReport(env_name, model_status(settings, ctx.env, ctx.registry, [model] if model else None))


def history(settings: Settings, model: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (newest first); an unknown model is an error."""
    from pipelines.promote.status import history as promotions

    registry = context(settings, env_name or "local").registry
    rows = promotions(registry, model, env_name)
    if not rows:
        registry.require_model(model)
    return rows


__all__ = ["StatusReport", "history", "promote", "rollback", "status"]
