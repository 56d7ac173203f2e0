"""The quality gate: a candidate version answers the golden inputs, its outputs are checked with
great_expectations (finite, expected shape, declared value ranges, a range learned from the
serving version) and compared with the serving version's answers on the same inputs.

Where it runs:

- **on the canary** (a real promotion, :mod:`pipelines.promote.canary_gate`): after the upload,
  before any other target loads and before any ensemble points at the candidate;
- **on a scratch tritonserver** (``preflight``): ``--dry-run`` and plan jobs, where nothing may
  change on the servers.  Slower (a server start and every model loaded), but it needs no fleet.
  The server comes from a factory the application passes in (``ScratchServers``): the promotion
  never starts a process itself.

Which one runs is chosen once, when the plan is built (:mod:`pipelines.promote.gates`).

The outputs are kept so ``verify`` can compare the live servers with them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.checks import lazy_iri
from pipelines.core.check import Judging, Phase, Place, Trial, Verdict, run_checks
from pipelines.core.plan import Plan, Step, desired_config, ensemble_pins, serving_versions
from pipelines.core.ports import ScratchServers
from pipelines.core.reports import Refusal
from pipelines.storage.base import Repository
from pipelines.storage.versions import Versions
from registry import background
from registry.contracts.config import CONFIG_NAME, data_type_name, parse_config
from registry.errors import MlregError, PromotionError
from registry.settings import Settings

if TYPE_CHECKING:
    import numpy as np  # at run time imported where used: the settings loader imports this module

log = logging.getLogger(__name__)
Outputs = dict[str, "np.ndarray"]
SCRATCH = "a scratch tritonserver"


class Answers(Protocol):
    """Anything that answers an inference request (a Triton: the canary, a scratch server)."""

    def load(self, model: str, config: str | None = None) -> None: ...

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@dataclass
class QualityReport:
    outputs: dict[str, Outputs] = field(default_factory=dict)  # model -> output name -> array
    failures: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    changes: dict[str, float] = field(default_factory=dict)  # model/output -> max |new - serving|
    previous: dict[str, str] = field(default_factory=dict)  # model -> serving version compared
    where: str = SCRATCH  # where the candidates answered
    restored: bool = False  # a failed gate put the canary and the store back as they were
    cleanup_errors: list[str] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)  # the performance check, per model
    shadow: list[dict[str, Any]] = field(default_factory=list)  # the shadow replay, per model
    captured: dict[str, list[dict[str, np.ndarray]]] = field(default_factory=dict)  # model -> inputs
    not_loaded: list[str] = field(default_factory=list)  # candidates whose load failed: never judged
    load_fix: str = ""  # a load that did not run or still runs: its error's own fix (its cause)
    generated: list[str] = field(default_factory=list)  # models sent inputs made from the config
    verdicts: list[Verdict] = field(default_factory=list)  # every check's, per candidate (core/check.py)
    observed: list[str] = field(default_factory=list)  # what observed checks would have refused

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "checked": self.checked,
            "failures": self.failures,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "observed": self.observed,
            "changes": self.changes,
            "compared_with": self.previous,
            "perf": self.perf,
            "shadow": self.shadow,
            "outputs": {m: {n: a.tolist() for n, a in o.items()} for m, o in self.outputs.items()},
        }


@lru_cache(maxsize=4)
def _golden_module(template_dir: Path) -> Any:
    path = template_dir / "golden_inputs.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("mlreg_golden_inputs", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quality_spec(settings: Settings, model: str) -> dict[str, dict[str, float]]:
    """Declared expectations per output (template's golden_inputs.QUALITY), else none."""
    module = _golden_module(settings.template_dir)
    return dict(getattr(module, "quality_spec", lambda _: {})(model)) if module else {}


def has_golden_inputs(settings: Settings, model: str) -> bool:
    """Whether the template's golden_inputs.py gives ``model``'s inputs (else they are made)."""
    module = _golden_module(settings.template_dir)
    return module is not None and module.model_inputs(model) is not None


def golden_inputs(settings: Settings, model: str, config_text: str) -> dict[str, np.ndarray]:
    """The template's golden inputs for ``model``, else zeros shaped like its config."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    module = _golden_module(settings.template_dir)
    found = module.model_inputs(model) if module is not None else None
    if found is not None:
        return dict(found)
    from tritonclient.utils import triton_to_np_dtype  # lazy: tritonclient ~0.25 s, no golden inputs only

    config = parse_config(config_text)
    batch = (1,) if config.max_batch_size > 0 else ()
    return {
        t.name: np.zeros(
            batch + tuple(max(int(d), 1) for d in t.dims),
            dtype=triton_to_np_dtype(data_type_name(t.data_type)),
        )
        for t in config.input
    }


def output_names(config_text: str) -> list[str]:
    return [t.name for t in parse_config(config_text).output]


def serving_reference(step: Step) -> str:
    """The version the candidate is compared with: the newest one serving that is not the candidate."""
    old = [v for v in step.previous_versions if v != step.version]
    return old[-1] if old else ""


class GateFailed(Refusal):
    """The candidates did not pass; ``report`` says why.  The runner's undo log puts back what the
    gate changed; the error then says whether the candidates left the canary (``after_undo``)."""

    def __init__(self, report: QualityReport) -> None:
        super().__init__(gate_error(report).message, fix=gate_fix(report))
        self.report = report

    def after_undo(self, restored: bool) -> str:
        self.report.restored = restored
        return gate_error(self.report).message


GATE_FIX = "fix the model; its outputs on the golden inputs are not sane"
LOAD_FIX = (
    "{models} never loaded (its initialize, its files or its config failed: Triton's reason is "
    "above), so no output was judged: fix that, register a new version and promote again"
)


def gate_fix(report: QualityReport) -> str:
    """What to do, by the cause: a candidate that never loaded is not a model whose outputs are
    wrong (its outputs were never asked for)."""
    if report.not_loaded:
        return LOAD_FIX.format(models=", ".join(report.not_loaded))
    if report.load_fix:
        return report.load_fix
    return GATE_FIX


def gate_error(report: QualityReport) -> PromotionError:
    where = f"quality gate failed on {report.where}"
    if report.restored:
        where += " (the candidates were unloaded there and their uploaded files removed)"
    lines = report.failures + [f"clean-up: {e}" for e in report.cleanup_errors]
    return PromotionError(f"{where}:\n  " + "\n  ".join(lines), fix=gate_fix(report))


# -- the scratch server ----------------------------------------------------------------------------


def scratch_repository(plan: Plan, store: Repository, root: Path) -> list[str]:
    """Plan models (new versions) + every ensemble involved and its members; returns models to run.

    The serving version sits beside the candidate (its answers are the regression reference) unless
    the promotion changes the runtime (SavedModel -> ONNX): old and new cannot share one config."""
    run = []
    for step in plan.steps:
        _scratch_step(step, store.versions, root / step.model)
        run.append(step.model)
    planned = {s.model for s in plan.steps}
    for step in list(plan.steps):
        if not step.is_ensemble:
            continue
        for member, version in ensemble_pins(step.config_text).items():
            if member not in planned and not (root / member).exists():
                _scratch_member(store, root / member, member, version)
    return run


def _scratch_step(step: Step, store: Versions, target: Path) -> None:
    """The step's folder at ``target``: its new version, and the serving one beside it where they
    can share one config."""
    target.mkdir(parents=True)
    (target / CONFIG_NAME).write_text(step.config_text)
    source = step.folder / step.version if step.folder is not None else None
    if source is not None:
        shutil.copytree(source, target / step.version)
    else:
        (target / step.version).mkdir()
    old = serving_reference(step)
    digest = step.previous_digests.get(old, "") if old else ""  # none: its bytes nobody registered
    if (
        source is not None
        and old
        and digest
        and not step.runtime_changes
        and store.read_manifest(step.model, old)
    ):
        store.get_version(step.model, old, target / old, digest)
        (target / CONFIG_NAME).write_text(desired_config(step.config_text, [old, step.version], gpu=False))


def _scratch_member(store: Repository, target: Path, member: str, pinned: str) -> None:
    """An ensemble's member the plan does not change, as the store serves it (at the version the
    ensemble pins, or the latest the store serves)."""
    text = store.read_config(member)
    if text is None:
        return
    version = pinned if int(pinned) > 0 else (serving_versions(text) or ["1"])[-1]
    target.mkdir()
    (target / CONFIG_NAME).write_text(text)
    store.versions.get_version(member, version, target / version, None)


def preflight(
    plan: Plan,
    store: Repository,
    settings: Settings,
    scratch: ScratchServers,
    connect: Callable[[str], Answers],
    live: Answers | None = None,
    judging: Judging | None = None,
) -> QualityReport:
    """The gate on a scratch tritonserver (``scratch``: started on a folder, stopped after): the
    registered checks of ``judging`` on each candidate.  ``live``: a server of the environment that
    answers for the serving version where it cannot sit beside the candidate (a runtime change)."""
    report = QualityReport()
    warm_up()
    with tempfile.TemporaryDirectory(prefix="mlreg-preflight-") as tmp:
        root = Path(tmp) / "repo"
        models = scratch_repository(plan, store, root)
        with scratch(root) as url:
            triton = connect(url)
            try:
                for model in models:
                    triton.load(model)
                trials = [_scratch_trial(plan.step(m), root, triton, live, settings, report) for m in models]
                run_checks(judging or Judging(()), trials, report)
            finally:
                triton.close()
    return report


def _scratch_trial(
    step: Step, root: Path, triton: Answers, live: Answers | None, settings: Settings, report: QualityReport
) -> Trial:
    """One candidate on the scratch server, compared with the serving version where the scratch
    server (beside it) or ``live`` (a runtime change) answers for it."""
    reference = serving_reference(step)
    source: Answers | None = triton if (root / step.model / reference).is_dir() else None
    if reference and source is None and step.runtime_changes:
        source = live
    return Trial(
        step,
        settings,
        report,
        loaded_as=step.model,
        reference=reference if source else "",
        candidate=triton,
        serving=source,
        where="scratch",
    )


# -- the checks ------------------------------------------------------------------------------------


_GX_LOCK = threading.Lock()


def warm_up() -> threading.Thread:
    """great_expectations imported and its context made in the background (2-5 s), while the
    candidates load; ``_batch_definition`` waits for it."""
    return background.start(_warm_batch_definition, "mlreg-gx-warm-up")


def _warm_batch_definition() -> None:
    """``_batch_definition`` in the background: a failure (great_expectations not installed,
    say) is the gate's own call to report, with its fix -- no thread prints a traceback."""
    try:
        _batch_definition()
    except Exception as exc:
        logging.getLogger(__name__).debug("great_expectations in the background failed: %s", exc)


def _batch_definition() -> Any:
    with _GX_LOCK:
        return _make_batch_definition()


@lru_cache(maxsize=1)
def _make_batch_definition() -> Any:
    """One in-memory great_expectations context per process (creating one costs ~1 s)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    lazy_iri.defer()  # jsonschema's IRI grammar (~2 s of CPU) built only if something checks one
    import great_expectations as gx  # lazy: ~4 s, only for the gate
    from great_expectations.data_context.types.base import ProgressBarsConfig  # lazy: ~4 s, only for the gate

    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return (
        context.data_sources.add_pandas("mlreg")
        .add_dataframe_asset("outputs")
        .add_batch_definition_whole_dataframe("all")
    )


def _expectations(
    name: str, values: np.ndarray, expected_shape: tuple[int, ...], ranges: list[tuple[float, float]]
) -> list[str]:
    """A great_expectations suite on one output: not null, finite, element count, value ranges."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    batch_def = _batch_definition()
    import great_expectations as gx  # lazy: ~4 s, only for the gate
    import pandas as pd  # lazy: ~0.3 s, only for the gate

    suite = gx.ExpectationSuite(name=f"mlreg-{name}")
    suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column="value"))
    suite.add_expectation(
        gx.expectations.ExpectColumnValuesToBeBetween(column="value", min_value=-1e30, max_value=1e30)
    )
    suite.add_expectation(gx.expectations.ExpectTableRowCountToEqual(value=int(np.prod(expected_shape))))
    for low, high in ranges:
        suite.add_expectation(
            gx.expectations.ExpectColumnValuesToBeBetween(column="value", min_value=low, max_value=high)
        )
    frame = pd.DataFrame({"value": values.astype(np.float64, copy=False).ravel()})
    result = batch_def.get_batch(batch_parameters={"dataframe": frame}).validate(suite)
    return [
        f"{name}: {getattr(r.expectation_config, 'type', 'expectation')} "
        f"{_kwargs(r.expectation_config)} failed: {r.result.get('unexpected_count', '')} "
        f"unexpected value(s), e.g. {r.result.get('partial_unexpected_list', [])[:3]}"
        for r in result.results
        if not r.success
    ]


def _kwargs(config: Any) -> str:
    kwargs = getattr(config, "kwargs", {}) or {}
    return ", ".join(f"{k}={v}" for k, v in kwargs.items() if k in {"min_value", "max_value", "value"})


LEARNED_FACTOR = 100.0  # a learned range: within 100x the serving version's largest magnitude


@dataclass(frozen=True)
class Probe:
    """One candidate to ask: ``model`` version ``version`` (under ``name`` where it is loaded under
    a private name), compared with version ``reference`` of ``model`` answered by ``serving``."""

    model: str
    version: str
    reference: str = ""
    serving: Answers | None = None
    name: str = ""

    @property
    def loaded_as(self) -> str:
        return self.name or self.model


def check_model(
    candidate: Answers, settings: Settings, config_text: str, probe: Probe, report: QualityReport
) -> None:
    """Golden inputs to the candidate (version-specific) and to the serving version; every output
    judged."""
    model = probe.model
    inputs = golden_inputs(settings, model, config_text)
    names = output_names(config_text)
    config = parse_config(config_text)
    version = "" if config.platform == "ensemble" else probe.version
    outputs = candidate.infer(probe.loaded_as, inputs, names, version=version)
    serving = _serving_answers(probe, inputs, names, report)
    declared = quality_spec(settings, model)
    batch = len(next(iter(inputs.values()))) if config.max_batch_size > 0 and inputs else None
    for out in config.output:
        expected = ((batch,) if batch else ()) + tuple(int(d) for d in out.dims)
        if -1 in expected:
            expected = outputs[out.name].shape
        if outputs[out.name].shape != expected:
            report.failures.append(
                f"{model}/{out.name}: shape {outputs[out.name].shape}, config says {expected}"
            )
        ranges = _judge_change(
            f"{model}/{out.name}",
            outputs[out.name],
            serving.get(out.name),
            declared.get(out.name, {}),
            probe,
            report,
        )
        report.failures.extend(_expectations(f"{model}/{out.name}", outputs[out.name], expected, ranges))
    report.outputs[model] = outputs
    report.checked.append(model)
    if not has_golden_inputs(settings, model):
        report.generated.append(model)


def _serving_answers(
    probe: Probe, inputs: dict[str, np.ndarray], names: list[str], report: QualityReport
) -> Outputs:
    if not probe.reference or probe.serving is None:
        return {}
    try:
        answers = probe.serving.infer(probe.model, inputs, names, version=probe.reference)
    except MlregError as exc:  # e.g. an allowed breaking change: the old one cannot answer
        log.warning("no regression reference for %s v%s: %s", probe.model, probe.reference, exc)
        return {}
    report.previous[probe.model] = probe.reference
    return answers


def _judge_change(
    name: str,
    new: np.ndarray,
    old: np.ndarray | None,
    spec: dict[str, float],
    probe: Probe,
    report: QualityReport,
) -> list[tuple[float, float]]:
    """The ranges the output must lie in (declared, learned from the serving version); the change
    against the serving version recorded, and judged against a declared tolerance."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    ranges = [(float(spec["min"]), float(spec["max"]))] if "min" in spec and "max" in spec else []
    if old is None or old.shape != new.shape:
        return ranges
    bound = LEARNED_FACTOR * float(np.abs(old).max(initial=0.0)) + 1.0
    ranges.append((-bound, bound))
    change = float(np.abs(new.astype(np.float64) - old).max(initial=0.0))
    report.changes[name] = change
    if "tolerance" in spec and change > float(spec["tolerance"]):
        report.failures.append(
            f"{name}: changed by up to {change:.6g} against serving v{probe.reference}, "
            f"declared tolerance {spec['tolerance']}"
        )
    return ranges


# -- the seam (pipelines/core/check.py): this check as the gates run it ---------------------------


@dataclass(frozen=True)
class GoldenCheck:
    """The golden inputs' answers judged (great_expectations, the change against the serving
    version): one verdict per candidate, its findings the report's failure lines."""

    name: str = "golden"
    phase: Phase = "gate"
    where: frozenset[str] = frozenset({"canary", "scratch"})
    owns: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> None:
        return None  # no settings: the template's golden_inputs.py says what to send and expect

    def judge(self, trial: Trial) -> list[Verdict]:
        step, report = trial.step, trial.report
        measured = "the outputs on the golden inputs (shape, finite, ranges; change against serving)"
        if trial.skip:
            return [Verdict(self.name, "skipped", trial.subject, measured, why=trial.skip)]
        before = len(report.failures)
        private = trial.loaded_as if trial.loaded_as != step.model else ""
        probe = Probe(step.model, step.version, trial.reference, trial.serving, private)
        check_model(trial.candidate, trial.settings, step.config_text, probe, report)
        found = tuple(report.failures[before:])
        del report.failures[before:]  # the gate writes what refuses (an observed check's never)
        return [
            Verdict(
                self.name,
                "fail" if found else "pass",
                trial.subject,
                measured + (f" v{trial.reference}" if report.previous.get(step.model) else ""),
                window=f"before traffic, on {report.where}",
                replicas=(trial.replica,) if trial.replica else (),
                sample=len(report.outputs.get(step.model, {})),
                value=float(len(found)),
                threshold=0.0,
                why="; ".join(found),
                fix=GATE_FIX if found else "",
                findings=found,
            )
        ]


CHECK = GoldenCheck()
