"""Pre-flight quality gate: the plan's models on a scratch local Triton, outputs checked with
great_expectations (finite, expected shape, declared value ranges), and the ensembles that use
them run end to end.  The outputs are kept so ``verify`` can compare the live servers with them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import local_triton
from pipelines.promote.plan import Plan, desired_config, ensemble_pins, serving_versions
from pipelines.storage.base import RepositoryStore
from pipelines.triton import TritonControl
from registry.contracts.config import CONFIG_NAME, parse_config
from registry.errors import MlregError
from registry.settings import Settings

log = logging.getLogger(__name__)
Outputs = dict[str, np.ndarray]


@dataclass
class QualityReport:
    outputs: dict[str, Outputs] = field(default_factory=dict)  # model -> output name -> array
    failures: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    changes: dict[str, float] = field(default_factory=dict)  # model/output -> max |new - serving|
    previous: dict[str, str] = field(default_factory=dict)  # model -> serving version compared

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "failures": self.failures,
            "changes": self.changes,
            "compared_with": self.previous,
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


def golden_inputs(settings: Settings, model: str, config_text: str) -> dict[str, np.ndarray]:
    """The template's golden inputs for ``model``, else zeros shaped like its config."""
    module = _golden_module(settings.template_dir)
    found = module.model_inputs(model) if module is not None else None
    if found is not None:
        return dict(found)
    from tritonclient.utils import triton_to_np_dtype

    from registry.contracts.config import data_type_name

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


def scratch_repository(plan: Plan, store: RepositoryStore, root: Path) -> list[str]:
    """Plan models (new versions) + every ensemble involved and its members; returns models to run."""
    steps = {s.model: s for s in plan.steps}
    run = []
    for step in plan.steps:
        target = root / step.model
        target.mkdir(parents=True)
        (target / CONFIG_NAME).write_text(step.config_text)
        source = step.folder / step.version if step.folder is not None else None
        if source is not None:
            shutil.copytree(source, target / step.version)
        else:
            (target / step.version).mkdir()
        old = [v for v in step.previous_versions if v != step.version]
        if source is not None and old and store.read_manifest(step.model, old[-1]) is not None:
            # the serving version beside the candidate: its answers are the regression reference
            store.get_version(step.model, old[-1], target / old[-1])
            (target / CONFIG_NAME).write_text(
                desired_config(step.config_text, [old[-1], step.version], gpu=False)
            )
        run.append(step.model)
    for step in list(plan.steps):
        if parse_config(step.config_text).platform != "ensemble":
            continue
        for member, version in ensemble_pins(step.config_text).items():
            if member in steps or (root / member).exists():
                continue
            text = store.read_config(member)
            if text is None:
                continue
            version = version if int(version) > 0 else (serving_versions(text) or ["1"])[-1]
            (root / member).mkdir()
            (root / member / CONFIG_NAME).write_text(text)
            store.get_version(member, version, root / member / version)
    return run


@lru_cache(maxsize=1)
def _batch_definition() -> Any:
    """One in-memory great_expectations context per process (creating one costs ~1 s)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

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
    import great_expectations as gx
    import pandas as pd

    batch_def = _batch_definition()
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


def preflight(plan: Plan, store: RepositoryStore, settings: Settings) -> QualityReport:
    report = QualityReport()
    with tempfile.TemporaryDirectory(prefix="mlreg-preflight-") as tmp:
        root = Path(tmp) / "repo"
        models = scratch_repository(plan, store, root)
        info, process = local_triton.start_server(root, Path(tmp) / "state", settings.backends_source)
        try:
            with TritonControl(
                info.grpc_url, timeout=settings.triton_timeout, load_timeout=settings.triton_timeout * 10
            ) as triton:
                for model in models:
                    triton.load(model)
                for model in models:
                    step = plan.step(model)
                    old = [v for v in step.previous_versions if v != step.version]
                    reference = old[-1] if old and (root / model / old[-1]).is_dir() else ""
                    _check_model(triton, settings, step.config_text, model, step.version, reference, report)
        finally:
            local_triton.stop_pid(info.pid, info.shm_prefix, process=process)
    return report


LEARNED_FACTOR = 100.0  # a learned range: within 100x the serving version's largest magnitude


def _check_model(
    triton: TritonControl,
    settings: Settings,
    config_text: str,
    model: str,
    version: str,
    reference: str,
    report: QualityReport,
) -> None:
    inputs = golden_inputs(settings, model, config_text)
    names = output_names(config_text)
    ensemble = parse_config(config_text).platform == "ensemble"
    outputs = triton.infer(model, inputs, names, version="" if ensemble else version)
    serving: Outputs = {}
    if reference:
        try:
            serving = triton.infer(model, inputs, names, version=reference)
            report.previous[model] = reference
        except MlregError as exc:  # e.g. an allowed breaking change: the old one cannot answer
            log.warning("no regression reference for %s v%s: %s", model, reference, exc)
    declared = quality_spec(settings, model)
    config = parse_config(config_text)
    batch = len(next(iter(inputs.values()))) if config.max_batch_size > 0 else None
    for out in config.output:
        expected = ((batch,) if batch else ()) + tuple(int(d) for d in out.dims)
        if -1 in expected:
            expected = outputs[out.name].shape
        if outputs[out.name].shape != expected:
            report.failures.append(
                f"{model}/{out.name}: shape {outputs[out.name].shape}, config says {expected}"
            )
        spec = declared.get(out.name, {})
        ranges = [(float(spec["min"]), float(spec["max"]))] if "min" in spec and "max" in spec else []
        old = serving.get(out.name)
        if old is not None and old.shape == outputs[out.name].shape:
            bound = LEARNED_FACTOR * float(np.abs(old).max(initial=0.0)) + 1.0
            ranges.append((-bound, bound))
            change = float(np.abs(outputs[out.name].astype(np.float64) - old).max(initial=0.0))
            report.changes[f"{model}/{out.name}"] = change
            if "tolerance" in spec and change > float(spec["tolerance"]):
                report.failures.append(
                    f"{model}/{out.name}: changed by up to {change:.6g} against serving v{reference}, "
                    f"declared tolerance {spec['tolerance']}"
                )
        report.failures.extend(_expectations(f"{model}/{out.name}", outputs[out.name], expected, ranges))
    report.outputs[model] = outputs
    report.checked.append(model)
