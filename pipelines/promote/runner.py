"""Running a plan: resolve ▸ validate ▸ quality ▸ assemble ▸ deploy ▸ verify ▸ record, with rollback.

Nothing changes for live traffic before ``assemble``.  From the first change on, any failure
restores every changed config, reloads it on every target, checks the old versions serve, and
leaves the MLflow alias alone.  The version swap keeps the old version serving (the config
names both) until the new one is READY and verified on every target.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.promote import checks, quality
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.plan import (
    Plan,
    Step,
    build_plan,
    desired_config,
    ensemble_pins,
    serving_versions,
)
from pipelines.storage import open_store
from pipelines.storage.base import RepositoryStore
from pipelines.triton import TritonControl
from registry.errors import MlregError, PromotionError
from registry.mlflow_registry import MlflowRegistry
from registry.settings import Settings

log = logging.getLogger(__name__)
OnStage = Callable[[str, str, float, str], None]  # stage, status, seconds, detail
PROMOTIONS_EXPERIMENT = "mlreg-promotions"


@dataclass
class PromotionResult:
    plan: Plan
    ok: bool = False
    rolled_back: bool = False
    stages: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rolled_back": self.rolled_back,
            "error": self.error,
            "promotion_run": self.run_id,
            "plan": self.plan.to_dict(),
            "stages": self.stages,
        }


@dataclass
class Options:
    dry_run: bool = False
    allow_breaking: bool = False
    skip_quality: bool = False
    serve_as: str = "auto"
    on_stage: OnStage | None = None


class Promotion:
    def __init__(
        self, settings: Settings, env: Environment, registry: MlflowRegistry, options: Options
    ) -> None:
        self.settings = settings
        self.env = env
        self.registry = registry
        self.options = options
        self.store: RepositoryStore = open_store(env.store, digest_cache=settings.digest_cache)
        self.changed: list[Step] = []
        self.preflight: quality.QualityReport | None = None

    # -- bookkeeping ---------------------------------------------------------------------------

    def _stage(self, result: PromotionResult, name: str, fn: Callable[[], str]) -> None:
        began = time.perf_counter()
        try:
            detail = fn()
        except BaseException as exc:
            seconds = time.perf_counter() - began
            message = exc.message if isinstance(exc, MlregError) else f"{type(exc).__name__}: {exc}"
            result.stages.append({"stage": name, "status": "failed", "seconds": seconds, "detail": message})
            if self.options.on_stage:
                self.options.on_stage(name, "failed", seconds, message)
            raise
        seconds = time.perf_counter() - began
        result.stages.append({"stage": name, "status": "ok", "seconds": seconds, "detail": detail})
        if self.options.on_stage:
            self.options.on_stage(name, "ok", seconds, detail)

    def controls(self, plan: Plan) -> list[TritonControl]:
        return [
            TritonControl(
                url, timeout=self.settings.triton_timeout, load_timeout=self.settings.triton_timeout * 10
            )
            for url in plan.targets
        ]

    # -- the pipeline --------------------------------------------------------------------------

    def already_serving(self, model: str, version: str, targets: tuple[str, ...]) -> bool:
        """The fast no-op check (no MLflow import): the store wants exactly this version, it is
        complete, every ensemble pins it, and every target serves exactly it."""
        if serving_versions(self.store.read_config(model)) != [version]:
            return False
        if self.store.read_manifest(model, version) is None:
            return False
        for ensemble in self.store.list_models():
            text = self.store.read_config(ensemble) or ""
            if 'platform: "ensemble"' in text and ensemble_pins(text).get(model, version) not in (
                version,
                "-1",
            ):
                return False
        for url in targets:
            with TritonControl(url, timeout=5) as triton:
                states = triton.model_states().get(model, {})
            if sorted(v for v, state in states.items() if state == "READY") != [version]:
                return False
        return True

    def run(self, model: str, version: str) -> PromotionResult:
        targets = resolve_targets(self.settings, self.env)
        if not self.options.dry_run and self.already_serving(model, version, targets):
            result = PromotionResult(Plan(self.env, targets, model, version), ok=True)
            result.stages.append(
                {
                    "stage": "noop",
                    "status": "ok",
                    "seconds": 0.0,
                    "detail": f"{model} version {version} already serves in '{self.env.name}'",
                }
            )
            return result
        self._preconditions(targets)
        with tempfile.TemporaryDirectory(prefix="mlreg-promote-") as tmp, self.store.lock(model, wait=0):
            plan = Plan(self.env, targets, model, version)
            result = PromotionResult(plan)

            def resolve() -> str:
                nonlocal plan
                plan = build_plan(self.registry, self.store, self.env, targets, model, version, Path(tmp))
                result.plan = plan
                return ", ".join(f"{s.model} v{s.version} ({s.role})" for s in plan.steps)

            self._stage(result, "resolve", resolve)
            if self._wants_onnx(plan):
                self._stage(result, "convert", lambda: self.convert(plan))
            if plan.noop:
                result.ok = True
                result.stages.append(
                    {
                        "stage": "noop",
                        "status": "ok",
                        "seconds": 0.0,
                        "detail": f"{model} version {version} already serves in '{self.env.name}'",
                    }
                )
                return result
            try:
                self._stage(result, "validate", lambda: self.validate(plan))
                if self.options.dry_run:
                    result.ok = True
                    return result
                if not self.options.skip_quality:
                    self._stage(result, "quality", lambda: self.quality(plan))
                self._stage(result, "assemble", lambda: self.assemble(plan))
                self._stage(result, "deploy", lambda: self.deploy(plan))
                self._stage(result, "verify", lambda: self.verify(plan))
                self._stage(result, "finalize", lambda: self.finalize(plan))
            except BaseException as exc:
                result.error = exc.message if isinstance(exc, MlregError) else str(exc)
                if self.changed:
                    self._stage(result, "rollback", lambda: self.rollback(plan))
                    result.rolled_back = True
                self._record_safely(result)
                raise PromotionError(
                    f"promotion of {model} version {version} to '{self.env.name}' failed: "
                    f"{result.error}"
                    + (
                        "; rolled back, the previous versions serve"
                        if result.rolled_back
                        else "; nothing was changed"
                    ),
                    fix="read the stage report; the MLflow alias was not moved",
                    result=result,
                ) from exc
            self._stage(result, "record", lambda: self.record(result))
            result.ok = True
            return result

    def _preconditions(self, targets: tuple[str, ...]) -> None:
        """Triton, store and MLflow reachable before anything starts."""
        from registry import mlflow_rest, mlflow_sqlite

        self.registry.warm_up()  # MLflow's import overlaps with the work below
        for url in targets:
            with TritonControl(url, timeout=5) as triton:
                triton.is_live()
        self.store.list_models()
        if self.registry.uri.startswith(("http://", "https://")):
            mlflow_rest.ping(self.registry.uri, self.settings.mlflow_timeout)
        elif mlflow_sqlite.database(self.registry.uri) is None:
            self.registry.experiment_id(PROMOTIONS_EXPERIMENT)  # creates the embedded registry

    def _wants_onnx(self, plan: Plan) -> bool:
        """--serve-as onnx, or auto and a target whose Triton has no TensorFlow backend."""
        step = plan.step(plan.model)
        if step.folder is None or 'platform: "tensorflow_savedmodel"' not in step.config_text:
            return False
        if self.options.serve_as == "onnx":
            return True
        if self.options.serve_as != "auto":
            return False
        from pipelines.promote.convert import needs_onnx

        for url in plan.targets:
            with TritonControl(url, timeout=5) as triton:
                if needs_onnx(str(triton.server_metadata().get("version", ""))):
                    return True
        return False

    def convert(self, plan: Plan) -> str:
        from pipelines.promote.convert import convert_step

        step = plan.step(plan.model)
        golden = quality.golden_inputs(self.settings, step.model, step.config_text)
        converted, parity = convert_step(step, golden, self.registry, self.env.gpu)
        plan.steps[plan.steps.index(step)] = converted
        plan.version = converted.version
        for other in plan.steps:  # ensembles re-pointed to the SavedModel version: to the ONNX one
            if other.role == "ensemble":
                other.config_text = desired_config(
                    other.config_text, [other.version], self.env.gpu, {step.model: converted.version}
                )
        worst = max(parity.values(), default=0.0)
        return (
            f"{step.model} v{step.version} (SavedModel) -> v{converted.version} (ONNX), "
            f"parity max |diff| {worst:.2g}"
        )

    def validate(self, plan: Plan) -> str:
        errors = checks.contract_errors(plan, self.store)
        if errors:
            raise PromotionError(
                "contract check failed:\n  " + "\n  ".join(errors),
                fix="fix the model or its config and register a new version",
            )
        breaking = checks.breaking_changes(plan)
        if breaking and not self.options.allow_breaking:
            raise PromotionError(
                f"{plan.model} version {plan.version} breaks the contract of the serving version:\n  "
                + "\n  ".join(breaking),
                fix="promote with --allow-breaking once every ensemble using it is updated in "
                "the same promotion, or keep the contract",
            )
        return f"{len(plan.steps)} model(s) checked" + (
            f", {len(breaking)} breaking change(s) allowed" if breaking else ""
        )

    def quality(self, plan: Plan) -> str:
        self.preflight = quality.preflight(plan, self.store, self.settings)
        if self.preflight.failures:
            raise PromotionError(
                "quality gate failed:\n  " + "\n  ".join(self.preflight.failures),
                fix="fix the model; its outputs on the golden inputs are not sane",
            )
        changes = ", ".join(f"{k} max|Δ| {v:.3g}" for k, v in self.preflight.changes.items())
        return f"golden inputs passed on {', '.join(self.preflight.checked)}" + (
            f"; against serving: {changes}" if changes else ""
        )

    def assemble(self, plan: Plan) -> str:
        sent = 0
        for step in plan.steps:
            if step.upload and step.folder is not None:
                self.changed.append(step)
                sent += self.store.put_version(
                    step.model, step.version, step.folder / step.version
                ).bytes_sent
        return f"{sent:,} bytes uploaded to {self.store.uri}"

    def deploy(self, plan: Plan) -> str:
        for step in plan.steps:
            if step.noop:
                continue
            overlap = step.role != "ensemble" and not self._platform_changes(step)
            versions = (
                sorted(set(step.previous_versions) | {step.version}, key=int) if overlap else [step.version]
            )
            if step.role != "ensemble" and not overlap:
                self._follow_latest(plan, step)
            if step not in self.changed:
                self.changed.append(step)
            self._write_and_load(plan, step, desired_config(step.config_text, versions, self.env.gpu))
        return ", ".join(f"{s.model} v{s.version}" for s in plan.steps if not s.noop)

    def _write_and_load(self, plan: Plan, step: Step, config_text: str) -> None:
        self.store.write_config(step.model, config_text)
        for triton in self.controls(plan):  # the first target is the canary
            with triton:
                triton.load(step.model)
                triton.wait_ready(step.model, step.version)

    @staticmethod
    def _platform_changes(step: Step) -> bool:
        """Old and new versions cannot share one config (e.g. SavedModel -> ONNX)."""
        if step.previous_config is None:
            return False
        from registry.contracts.config import parse_config

        old, new = parse_config(step.previous_config), parse_config(step.config_text)
        return (old.platform, old.backend) != (new.platform, new.backend)

    def _follow_latest(self, plan: Plan, step: Step) -> None:
        """Before a swap without overlap, ensembles pinned to the old version follow the latest
        loaded version (-1): Triton keeps the old one until the new one is READY, so no request
        through them fails; they are pinned to the new version right after."""
        for other in plan.steps:
            if other.role == "ensemble" and other.previous_config is not None:
                if other not in self.changed:
                    self.changed.append(other)
                self._write_and_load(
                    plan,
                    other,
                    desired_config(
                        other.previous_config,
                        other.previous_versions or [other.version],
                        self.env.gpu,
                        {step.model: "-1"},
                    ),
                )

    def verify(self, plan: Plan) -> str:
        for triton in self.controls(plan):
            with triton:
                for step in plan.steps:
                    if not triton.is_ready(step.model, step.version):
                        raise PromotionError(f"{triton.url}: {step.model} v{step.version} is not READY")
                    self._smoke(triton, step)
        return f"READY and answering on {len(plan.targets)} target(s)"

    def _smoke(self, triton: TritonControl, step: Step) -> None:
        inputs = quality.golden_inputs(self.settings, step.model, step.config_text)
        names = quality.output_names(step.config_text)
        version = step.version if step.role != "ensemble" else ""
        outputs = triton.infer(step.model, inputs, names, version=version)
        expected = (self.preflight.outputs.get(step.model) if self.preflight else None) or {}
        for name, array in outputs.items():
            if not np.isfinite(array).all():
                raise PromotionError(f"{triton.url}: {step.model}/{name} answered non-finite values")
            if name in expected and not np.allclose(array, expected[name], rtol=1e-4, atol=1e-4):
                raise PromotionError(
                    f"{triton.url}: {step.model}/{name} differs from the pre-flight "
                    "answer on the same golden inputs"
                )

    def finalize(self, plan: Plan) -> str:
        """Only the new versions serve now: old versions unload."""
        retired = []
        for step in plan.steps:
            if step.role == "ensemble" or step.previous_versions in ([], [step.version]):
                continue
            self.store.write_config(step.model, step.config_text)
            for triton in self.controls(plan):
                with triton:
                    triton.load(step.model)
                    triton.wait_ready(step.model, step.version)
            retired.append(f"{step.model} v{','.join(step.previous_versions)}")
        return "retired " + (", ".join(retired) or "nothing")

    def rollback(self, plan: Plan) -> str:
        restored = []
        # members and models first, so that the ensembles' old pins find their versions loaded
        order = [s for s in reversed(self.changed) if s.role != "ensemble"] + [
            s for s in reversed(self.changed) if s.role == "ensemble"
        ]
        seen: list[Step] = []
        for step in order:
            if any(step is done for done in seen):
                continue
            seen.append(step)
            if step.previous_config is None:
                self.store.delete(f"{step.model}/config.pbtxt")
                for triton in self.controls(plan):
                    with triton:
                        triton.unload(step.model)
            else:
                self.store.write_config(step.model, step.previous_config)
                for triton in self.controls(plan):
                    with triton:
                        triton.load(step.model)
                        for version in step.previous_versions:
                            triton.wait_ready(step.model, version)
            restored.append(f"{step.model} -> v{','.join(step.previous_versions) or 'none'}")
        return "restored " + ", ".join(restored)

    # -- record --------------------------------------------------------------------------------

    def record(self, result: PromotionResult) -> str:
        plan = result.plan
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for step in plan.steps:
            version = step.version
            if step.role == "ensemble":
                version = self._register_repointed(plan, step)
            self.registry.set_version_tag(step.model, version, f"promoted_{self.env.name}", stamp)
            self.registry.set_alias(step.model, self.env.alias, version)  # the alias moves last
        self._record_safely(result)
        return f"alias '{self.env.alias}' -> {plan.model} v{plan.version}; run {result.run_id}"

    def _register_repointed(self, plan: Plan, step: Step) -> str:
        from registry.register import Candidate, register

        assert plan.workdir is not None
        folder = plan.workdir / f"repointed-{step.model}"
        (folder / step.version).mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(step.config_text)
        return register(
            self.registry,
            Candidate(step.model, folder / step.version, folder / "config.pbtxt"),
            members=ensemble_pins(step.config_text),
        ).version

    def _record_safely(self, result: PromotionResult) -> None:
        """The promotion as an MLflow run (who, when, from -> to, targets, store, stages)."""
        import getpass

        plan = result.plan
        try:
            step = plan.step(plan.model)
            previous = ",".join(step.previous_versions) or "none"
        except StopIteration:
            previous = "unknown"
        try:
            run_id = self.registry.start_run(
                PROMOTIONS_EXPERIMENT,
                f"{plan.model}-v{plan.version}-{self.env.name}",
                {
                    "mlreg_model": plan.model,
                    "mlreg_version": plan.version,
                    "environment": self.env.name,
                    "result": "promoted"
                    if not result.error
                    else ("rolled back" if result.rolled_back else "refused"),
                    "user": getpass.getuser(),
                },
            )
            self.registry.log(
                run_id,
                {
                    "from_version": previous,
                    "to_version": plan.version,
                    "targets": ",".join(plan.targets),
                    "store": self.env.store,
                },
                {f"{s['stage']}_seconds": s["seconds"] for s in result.stages},
            )
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "report.json").write_text(json.dumps(result.to_dict(), indent=1))
                self.registry.log_artifacts(run_id, Path(tmp))
            self.registry.finish_run(run_id, ok=not result.error)
            result.run_id = run_id
            if not result.error:
                self.registry.set_version_tag(
                    plan.model, plan.version, f"promotion_run_{self.env.name}", run_id
                )
        except MlregError as exc:
            log.warning("could not record the promotion in MLflow: %s", exc)
