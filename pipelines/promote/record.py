"""The promotion as an MLflow run: who, when, from -> to, targets, store, the stage reports."""

from __future__ import annotations

import getpass
import json
import logging
import tempfile
from pathlib import Path

from pipelines.promote.environments import Environment
from pipelines.promote.ports import Registry
from pipelines.promote.reports import PromotionResult
from registry.errors import MlregError

log = logging.getLogger(__name__)


def record_promotion(registry: Registry, result: PromotionResult, env: Environment, experiment: str) -> None:
    """Log ``result`` as a run of ``experiment``; a registry that cannot be written is a warning
    (the promotion's outcome does not depend on its record)."""
    plan = result.plan
    try:
        previous = ",".join(plan.step(plan.model).previous_versions) or "none"
    except StopIteration:
        previous = "unknown"
    try:
        run_id = registry.start_run(
            experiment,
            f"{plan.model}-v{plan.version}-{env.name}",
            {
                "mlreg_model": plan.model,
                "mlreg_version": plan.version,
                "environment": env.name,
                "result": result.outcome,
                "user": getpass.getuser(),
            },
        )
        registry.log(
            run_id,
            {
                "from_version": previous,
                "to_version": plan.version,
                "targets": ",".join(plan.targets),
                "store": env.store,
            },
            {f"{s.stage}_seconds": s.seconds for s in result.stages} | perf_metrics(result),
        )
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "report.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
            registry.log_artifacts(run_id, Path(tmp))
        registry.finish_run(run_id, ok=not result.error)
        result.run_id = run_id
        if not result.error:  # version tags, run link, the model's environments
            registry.record_deployment(plan.model, plan.version, env.name, run_id, plan.targets)
    except MlregError as exc:
        log.warning("could not record the promotion in MLflow: %s", exc)


def perf_metrics(result: PromotionResult) -> dict[str, float]:
    """The quality gate's performance figures as run metrics (``perf_<model>_candidate_p95_ms`` ...),
    so MLflow charts them across promotions."""
    found: dict[str, float] = {}
    for stage in result.stages:
        for perf in getattr(stage.report, "perf", None) or []:
            prefix = f"perf_{perf['model']}"
            for side in ("candidate", "serving"):
                figures = perf.get(side) or {}
                for key in ("p50_ms", "p95_ms", "throughput_rps"):
                    if isinstance(figures.get(key), int | float) and figures[key] == figures[key]:
                        found[f"{prefix}_{side}_{key}"] = float(figures[key])
            for key in ("p95_ratio", "threshold", "spread"):
                if isinstance(perf.get(key), int | float):
                    found[f"{prefix}_{key}"] = float(perf[key])
            load = (perf.get("triton") or {}).get("load_seconds")
            if isinstance(load, int | float):
                found[f"{prefix}_load_seconds"] = float(load)
    return found
