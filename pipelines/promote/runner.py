"""Running a plan as declared stages: resolve ▸ validate ▸ quality ▸ assemble ▸ deploy ▸ verify ▸
finalize ▸ record, with rollback.

Each ``Stage`` says whether it changes live state (``live``).  ``--dry-run`` stops before the first
live stage; a failure after it restores every changed config, reloads it on every target (the
``Fleet``), checks the old versions serve, and leaves the MLflow alias alone.  The version swap
keeps the old version serving (the config names both) until the new one is READY and verified on
every target.

Locks: a promotion holds the store lock of every model whose config it writes (the model, the
members it brings along and every ensemble it re-points), taken in sorted name order without
waiting, and reads the configs it plans from under those locks.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np

from pipelines.promote import checks, quality
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.fanout import Connect, Fleet, checkpoint, triton_connector
from pipelines.promote.plan import (
    Plan,
    Role,
    Step,
    build_plan,
    config_facts,
    desired_config,
    ensemble_pins,
    serving_versions,
)
from pipelines.promote.ports import Registry, ServingTarget
from pipelines.promote.reports import (
    ConvertReport,
    FleetReport,
    NoopReport,
    PromotionFailed,
    PromotionResult,
    QualityStageReport,
    RecordReport,
    ResolveReport,
    StageRecord,
    StageReport,
    UploadReport,
    ValidateReport,
    VerifyReport,
)
from pipelines.storage import open_store
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError, PromotionError
from registry.settings import Settings

log = logging.getLogger(__name__)
OnStage = Callable[[str, str, float, str], None]  # stage, status, seconds, detail
Registrar = Callable[[str, Path, dict[str, str]], str]  # model, folder (config + 1/), pins -> version
PROMOTIONS_EXPERIMENT = "mlreg-promotions"

__all__ = ["PROMOTIONS_EXPERIMENT", "Options", "Promotion", "PromotionFailed", "PromotionResult", "Stage"]


@dataclass
class Options:
    dry_run: bool = False
    allow_breaking: bool = False
    skip_quality: bool = False
    serve_as: str = "auto"
    on_stage: OnStage | None = None


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[], StageReport]
    live: bool = False  # changes what the store or the servers hold
    applies: Callable[[], bool] = _always
    ends: bool = False  # the promotion is complete once it ran (the no-op)
    planning: bool = False  # its errors propagate as they are: nothing changed, nothing recorded


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, MlregError) else f"{type(exc).__name__}: {exc}"


@dataclass
class Promotion:
    settings: Settings
    env: Environment
    registry: Registry
    options: Options
    connect: Connect | None = None  # how to reach a target (default: Triton over gRPC)
    registrar: Registrar | None = None  # how a re-pointed ensemble is registered (default: MLflow)
    store: RepositoryStore = field(init=False)
    changed: list[Step] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.store = open_store(self.env.store, digest_cache=self.settings.digest_cache)
        self.preflight: quality.QualityReport | None = None
        self.plan = Plan(self.env, (), "", "")
        self.fleet = Fleet(self.store, (), self._connect, self.settings.triton_timeout * 10)
        self.locks = ExitStack()
        self.result = PromotionResult(self.plan)
        self.staged_aborted = False  # a staged roll-out put its replicas back itself

    def _connect(self, url: str) -> ServingTarget:
        return (self.connect or triton_connector(self.settings))(url)

    # -- the runner ----------------------------------------------------------------------------

    def run(self, model: str, version: str) -> PromotionResult:
        targets = resolve_targets(self.settings, self.env)
        policy = self.env.policy  # HOOK: fleet roll-out policy (issue 12, pipelines/promote/rollout.py)
        if policy is not None:
            from pipelines.promote.rollout import reachable

            targets = reachable(targets, self._connect, policy)
        parallel = policy.max_parallel if policy else 1
        load_timeout = self.settings.triton_timeout * 10
        self.fleet = Fleet(self.store, targets, self._connect, load_timeout, parallel, policy is not None)
        with self.fleet, self.locks, tempfile.TemporaryDirectory(prefix="mlreg-promote-") as tmp:
            self.plan = Plan(self.env, targets, model, version, workdir=Path(tmp))
            self.result = result = PromotionResult(self.plan)
            if not self.options.dry_run and self.already_serving(model, version):
                result.stages.append(StageRecord("noop", "ok", 0.0, self.noop().detail(), self.noop()))
                result.ok = True
                return result
            self._preconditions()
            self.execute(self.stages(), result)
            return result

    def stages(self) -> list[Stage]:
        return [
            Stage("resolve", self.resolve, planning=True),
            Stage("convert", self.convert, applies=self._wants_onnx, planning=True),
            Stage("noop", self.noop, applies=lambda: self.plan.noop, ends=True),
            Stage("validate", self.validate),
            Stage("quality", self.quality, applies=lambda: self._gate(on_canary=False)),  # scratch server
            Stage("assemble", self.assemble, live=True),
            Stage("quality", self.quality, live=True, applies=lambda: self._gate(on_canary=True)),
            Stage("deploy", self.deploy, live=True),
            Stage("verify", self.verify, live=True),
            Stage("finalize", self.finalize, live=True),
            Stage("record", self.record, live=True),
        ]

    def execute(self, stages: list[Stage], result: PromotionResult) -> None:
        live = False
        for stage in stages:
            if not stage.applies():
                continue
            if stage.live and self.options.dry_run:
                break
            live = live or stage.live
            try:
                self._timed(result, stage)
            except BaseException as exc:
                if stage.planning:
                    raise
                self._fail(result, exc, live)
            if stage.ends:
                break
        result.ok = True

    def _timed(self, result: PromotionResult, stage: Stage) -> None:
        began = time.perf_counter()
        try:
            report = stage.run()
        except BaseException as exc:
            record = StageRecord(stage.name, "failed", time.perf_counter() - began, _message(exc))
            result.stages.append(record)
            self._tell(record)
            raise
        record = StageRecord(stage.name, "ok", time.perf_counter() - began, report.detail(), report)
        result.stages.append(record)
        self._tell(record)

    def _tell(self, record: StageRecord) -> None:
        if self.options.on_stage:
            self.options.on_stage(record.stage, record.status, record.seconds, record.detail)

    def _fail(self, result: PromotionResult, exc: BaseException, live: bool) -> NoReturn:
        result.error = _message(exc)
        if live and self.changed:
            try:
                self._timed(result, Stage("rollback", self.rollback))
                result.rolled_back = True
            except BaseException as failure:  # recorded and reported below, never swallowed
                result.rollback_error = _message(failure)
        result.rolled_back = result.rolled_back or (self.staged_aborted and not result.rollback_error)
        self._record_safely(result)
        head = f"promotion of {self.plan.model} version {self.plan.version} to '{self.env.name}' failed: "
        if result.rollback_error:
            raise PromotionFailed(
                head + f"{result.error}; the rollback failed too: {result.rollback_error}",
                fix="run 'mlreg status' to see what serves, then promote the version you want",
                result=result,
            ) from exc
        raise PromotionFailed(
            head
            + result.error
            + (
                "; rolled back, the previous versions serve"
                if result.rolled_back
                else "; nothing was changed"
            ),
            fix=(exc.fix if isinstance(exc, MlregError) and exc.fix else "read the stage report")
            + "; the MLflow alias was not moved",
            result=result,
        ) from exc

    # -- before the stages ---------------------------------------------------------------------

    def already_serving(self, model: str, version: str) -> bool:
        """The fast no-op check (no MLflow import): the store wants exactly this version, it is
        complete, every ensemble pins it, and every target serves exactly it (and, for an ensemble,
        every member at the version it pins)."""
        config = self.store.read_config(model)
        if serving_versions(config) != [version] or self.store.read_manifest(model, version) is None:
            return False
        assert config is not None
        wanted = {model: version}
        for member, pinned in ensemble_pins(config).items():
            if int(pinned) <= 0:
                return False  # "latest": only the registry knows which
            wanted[member] = pinned
        for ensemble in self.store.list_models():
            text = self.store.read_config(ensemble)
            if text and config_facts(text).is_ensemble:
                if ensemble_pins(text).get(model, version) not in (version, "-1"):
                    return False
        return self.fleet.serve_exactly(wanted)

    def _preconditions(self) -> None:
        """Triton, store and MLflow reachable before anything starts."""
        from registry import mlflow_rest, mlflow_sqlite

        self.registry.warm_up()  # MLflow's import overlaps with the work below
        if not self.options.skip_quality:
            quality.warm_up()  # great_expectations (seconds) imports while the promotion plans
        self.fleet.check_live()
        self.store.list_models()
        if self.registry.uri.startswith(("http://", "https://")):
            mlflow_rest.ping(self.registry.uri, self.settings.mlflow_timeout)
        elif mlflow_sqlite.database(self.registry.uri) is None:
            self.registry.experiment_id(PROMOTIONS_EXPERIMENT)  # creates the embedded registry

    # -- planning ------------------------------------------------------------------------------

    def resolve(self) -> ResolveReport:
        """Lock every model whose config the promotion may write, then plan from under the locks; a
        plan that needs one more model takes its lock and is made again."""
        model, version, workdir = self.plan.model, self.plan.version, self.plan.workdir
        assert workdir is not None
        held: set[str] = set()
        wanted = self._lock_names(model)
        while True:
            for name in sorted(wanted - held):
                if not self.options.dry_run:  # a plan only reads: it never waits for, nor blocks, others
                    self.locks.enter_context(self.store.lock(name, wait=0))
                held.add(name)
            plan = build_plan(
                self.registry, self.store, self.env, self.plan.targets, model, version, workdir, self._serves
            )
            wanted = {s.model for s in plan.steps} - held
            if not wanted:
                break
        self.plan = self.result.plan = plan
        return ResolveReport([f"{s.model} v{s.version} ({s.role.value})" for s in plan.steps], sorted(held))

    def _lock_names(self, model: str) -> set[str]:
        """The model, the members its stored config pins, and every ensemble of the store using it."""
        names = {model}
        for name in self.store.list_models():
            text = self.store.read_config(name)
            if text and config_facts(text).is_ensemble:
                pins = ensemble_pins(text)
                if model in pins:
                    names.add(name)
                if name == model:
                    names |= set(pins)
        return names

    def _serves(self, model: str, version: str) -> bool:
        return self.fleet.serve_exactly({model: version})

    def _wants_onnx(self) -> bool:
        """--serve-as onnx, or auto and a target whose Triton has no TensorFlow backend."""
        step = self.plan.step(self.plan.model)
        if step.folder is None or step.platform != "tensorflow_savedmodel":
            return False
        if self.options.serve_as != "auto":
            return self.options.serve_as == "onnx"
        from pipelines.promote.convert import needs_onnx

        return any(
            needs_onnx(str(self.fleet.target(url).server_metadata().get("version", "")))
            for url in self.plan.targets
        )

    def convert(self) -> ConvertReport:
        from pipelines.promote.convert import convert_step
        from registry.mlflow_registry import MlflowRegistry

        plan = self.plan
        step = plan.step(plan.model)
        golden = quality.golden_inputs(self.settings, step.model, step.config_text)
        assert isinstance(self.registry, MlflowRegistry), "conversion registers in MLflow"
        converted, parity = convert_step(step, golden, self.registry, self.env.gpu)
        plan.steps[plan.steps.index(step)] = converted
        plan.version = self.result.plan.version = converted.version
        for other in plan.steps:  # ensembles re-pointed to the SavedModel version: to the ONNX one
            if other.role is Role.ENSEMBLE:
                other.config_text = desired_config(
                    other.config_text, [other.version], self.env.gpu, {step.model: converted.version}
                )
        return ConvertReport(step.model, step.version, converted.version, max(parity.values(), default=0.0))

    def noop(self) -> NoopReport:
        return NoopReport(self.plan.model, self.plan.version, self.env.name)

    # -- checks before any change ----------------------------------------------------------------

    def validate(self) -> ValidateReport:
        plan = self.plan
        errors = checks.contract_errors(plan, self.store) + self._repointed_errors()
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
        verified = [self._verify_bytes(s) for s in plan.steps if not s.upload and not s.is_ensemble]
        return ValidateReport(len(plan.steps), breaking, verified)

    def _repointed_errors(self) -> list[str]:
        """A re-pointed ensemble is registered as a new version: it must validate before any change."""
        from registry.register import Candidate, validate_candidate

        errors: list[str] = []
        for step in self.plan.steps:
            if step.role is Role.ENSEMBLE:
                folder = self._repointed_folder(step)
                found, _ = validate_candidate(Candidate(step.model, folder / "1", folder / "config.pbtxt"))
                errors.extend(f"re-pointed {step.model}: {line}" for line in found)
        return errors

    def _repointed_folder(self, step: Step) -> Path:
        """The re-pointed config as a registrable version: ``config.pbtxt`` + ``1/``, its version_policy
        naming folder 1 like every registered version's; the environment may serve it from another
        folder (``step.version``, e.g. "2" once a registered v2 was promoted), which fetch_version and
        the plan map back to."""
        assert self.plan.workdir is not None
        folder = self.plan.workdir / f"repointed-{step.model}"
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(desired_config(step.config_text, ["1"], gpu=True))
        return folder

    def _verify_bytes(self, step: Step) -> str:
        """The version's files in the store against its manifest and the digest registered in MLflow
        (issue 10 item 2): the store's ``verify_version`` raises StorageError naming the file."""
        verify = getattr(self.store, "verify_version", None)  # HOOK: pipelines/storage (H-store)
        if verify is not None:
            verify(step.model, step.version, step.digest or None)
        return f"{step.model}/{step.version}"

    def _gate(self, on_canary: bool) -> bool:
        """The quality gate runs on the canary after the upload, or (dry run) on a scratch server."""
        wanted = not self.options.skip_quality
        return wanted and quality.on_canary(self.plan, self.options.dry_run) == on_canary

    def quality(self) -> QualityStageReport:
        self.preflight = quality.run_gate(
            self.plan, self.store, self.settings, self.fleet, self.options.dry_run
        )
        if self.preflight.failures:
            if self.preflight.restored:
                self.changed.clear()  # the gate put the canary and the store back itself
            raise quality.gate_error(self.preflight)
        return QualityStageReport(self.preflight.checked, self.preflight.changes)

    # -- changes -----------------------------------------------------------------------------------

    def _changing(self, step: Step) -> None:
        if not any(step is s for s in self.changed):
            self.changed.append(step)

    def assemble(self) -> UploadReport:
        sent, uploaded = 0, []
        for step in self.plan.steps:
            if step.upload and step.folder is not None:
                self._changing(step)
                sent += self.store.put_version(
                    step.model, step.version, step.folder / step.version
                ).bytes_sent
                uploaded.append(self._verify_bytes(step))
        checkpoint("uploaded")
        return UploadReport(sent, self.store.uri, uploaded)

    def deploy(self) -> FleetReport:
        if self.env.policy is not None:  # HOOK: canary, bake, waves (issue 12)
            from pipelines.promote.rollout import staged_deploy

            return staged_deploy(self)
        first = len(self.fleet.rollouts)
        for step in self.plan.steps:
            if step.noop:
                continue
            overlap = not step.is_ensemble and not step.runtime_changes
            versions = (
                sorted(set(step.previous_versions) | {step.version}, key=int) if overlap else [step.version]
            )
            if not step.is_ensemble and not overlap:
                self._follow_latest(step)
            self._changing(step)
            self.fleet.apply(
                step.model, desired_config(step.config_text, versions, self.env.gpu), [step.version]
            )
        summary = ", ".join(f"{s.model} v{s.version}" for s in self.plan.steps if not s.noop)
        return FleetReport(summary, self.fleet.rollouts[first:])

    def _follow_latest(self, step: Step) -> None:
        """Before a swap without overlap, ensembles pinned to the old version follow the latest
        loaded version (-1): Triton keeps the old one until the new one is READY, so no request
        through them fails; they are pinned to the new version right after."""
        for other in self.plan.steps:
            if other.role is Role.ENSEMBLE and other.previous_config is not None:
                self._changing(other)
                text = desired_config(
                    other.previous_config,
                    other.previous_versions or [other.version],
                    self.env.gpu,
                    {step.model: "-1"},
                )
                self.fleet.apply(other.model, text, [other.version])

    def verify(self) -> VerifyReport:
        for url in self.plan.targets:
            triton = self.fleet.target(url)
            for step in self.plan.steps:
                if not triton.is_ready(step.model, step.version):
                    raise PromotionError(f"{url}: {step.model} v{step.version} is not READY")
                self._smoke(triton, step)
        return VerifyReport(list(self.plan.targets), [s.model for s in self.plan.steps])

    def _smoke(self, triton: ServingTarget, step: Step) -> None:
        inputs = quality.golden_inputs(self.settings, step.model, step.config_text)
        names = quality.output_names(step.config_text)
        version = "" if step.is_ensemble else step.version
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

    def finalize(self) -> FleetReport:
        """Only the new versions serve now: the old versions unload (a staged roll-out swapped
        them replica by replica already)."""
        first, retired = len(self.fleet.rollouts), []
        for step in self.plan.steps:
            old = [v for v in step.previous_versions if v != step.version]
            if step.is_ensemble or not old:
                continue
            if self.env.policy is not None:
                retired.append(f"{step.model} v{','.join(old)} (in its wave)")
                continue
            self.fleet.apply(step.model, step.config_text, [step.version])
            retired.append(f"{step.model} v{','.join(old)}")
        return FleetReport("retired " + (", ".join(retired) or "nothing"), self.fleet.rollouts[first:])

    def rollback(self) -> FleetReport:
        """Every changed config restored, members and models first so that the ensembles' old pins
        find their versions loaded."""
        first, restored = len(self.fleet.rollouts), []
        newest_first = list(reversed(self.changed))
        order = [s for s in newest_first if not s.is_ensemble] + [s for s in newest_first if s.is_ensemble]
        for step in order:
            self.fleet.apply(step.model, step.previous_config, step.previous_versions)
            restored.append(f"{step.model} -> v{','.join(step.previous_versions) or 'none'}")
        return FleetReport("restored " + ", ".join(restored), self.fleet.rollouts[first:])

    # -- record --------------------------------------------------------------------------------

    def record(self) -> RecordReport:
        plan = self.plan
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for step in plan.steps:
            version = step.version
            if step.role is Role.ENSEMBLE:
                version = self._register_repointed(step)
            self.registry.set_version_tag(step.model, version, f"promoted_{self.env.name}", stamp)
            self.registry.set_alias(step.model, self.env.alias, version)  # the alias moves last
        self._record_safely(self.result)
        return RecordReport(self.env.alias, plan.model, plan.version, self.result.run_id)

    def _register_repointed(self, step: Step) -> str:
        folder = self._repointed_folder(step)
        pins = ensemble_pins(step.config_text)
        if self.registrar is not None:
            return self.registrar(step.model, folder, pins)
        from registry.mlflow_registry import MlflowRegistry
        from registry.register import Candidate, register

        assert isinstance(self.registry, MlflowRegistry), "the default registrar registers in MLflow"
        return register(
            self.registry, Candidate(step.model, folder / "1", folder / "config.pbtxt"), members=pins
        ).version

    def _record_safely(self, result: PromotionResult) -> None:
        """The promotion as an MLflow run (who, when, from -> to, targets, store, stages)."""
        import getpass

        plan = result.plan
        try:
            previous = ",".join(plan.step(plan.model).previous_versions) or "none"
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
                    "result": result.outcome,
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
                {f"{s.stage}_seconds": s.seconds for s in result.stages},
            )
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "report.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
                self.registry.log_artifacts(run_id, Path(tmp))
            self.registry.finish_run(run_id, ok=not result.error)
            result.run_id = run_id
            if not result.error:  # version tags, run link, the model's environments (H-mlflow)
                self.registry.record_deployment(plan.model, plan.version, self.env.name, run_id, plan.targets)
        except MlregError as exc:
            log.warning("could not record the promotion in MLflow: %s", exc)
