"""The quality gate on the canary: the candidates answer on a server of the environment itself,
after their upload and before any other target loads them or any ensemble points at them.

How a candidate is put on the canary (never through the store's configs, which the whole fleet
reads: per-replica state goes through the load API's ``config`` override):

- **same runtime** (the usual swap): the canary loads the model with a config override naming the
  serving versions *and* the candidate -- the config ``deploy`` writes next, so the deploy finds
  the canary already as wanted (Triton re-reads the equal config and loads nothing again).  Pinned
  ensembles and version-specific requests stay on the serving version; the gate asks for the
  candidate by version.  The candidate is loaded once, as it would be without the gate.  One
  exposure remains: Triton answers a request to the model *without* a version with its newest
  loaded version, so a client calling the model directly and unpinned can reach the candidate on
  the canary between its READY and the gate's verdict (the inference and the checks, about a
  second).  Traffic through ensembles (pinned) and version-specific requests cannot.
- **a runtime change** (SavedModel -> ONNX): old and new cannot share one config.  The candidate is
  loaded alone under a private name (``<model>__mlreg_quality``), from its own files sent with the
  load request, so no live request can address it; the serving version answers for comparison
  under its own name, version-specifically.  The private model is unloaded afterwards.

A failure puts the canary back (the previous config as override, or the model unloaded where it
is new), removes the files this promotion uploaded, and leaves every config, other target and the
MLflow alias untouched.

Ensembles are not loaded by the gate (loading a re-pointed ensemble would send live traffic to the
candidate): ``verify`` runs every ensemble end to end on every target right after the re-point,
and a failure there rolls the promotion back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, cast

import numpy as np

from pipelines.promote.plan import Plan, Step, desired_config
from pipelines.promote.ports import ServingTarget
from pipelines.promote.quality import Probe, QualityReport, check_model, serving_reference, warm_up
from pipelines.storage.base import RepositoryStore
from registry.contracts.config import config_json
from registry.errors import MlregError
from registry.settings import Settings

log = logging.getLogger(__name__)
PRIVATE_SUFFIX = "__mlreg_quality"
SKIPPED_FILES = (".mlreg-manifest.json",)


class Canary(Protocol):
    """A serving target whose load API also takes the model's files (Triton's ``file:`` override)."""

    url: str

    def load(
        self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None
    ) -> None: ...

    def unload(self, model: str, unload_dependents: bool = False) -> None: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]: ...


def gated_steps(plan: Plan) -> list[Step]:
    """The versions that never served here: registered models, not ensembles (see the docstring)."""
    return [
        s
        for s in plan.steps
        if not s.is_ensemble and s.folder is not None and s.version not in s.previous_versions
    ]


def canary_gate(
    plan: Plan, store: RepositoryStore, settings: Settings, target: ServingTarget, gpu: bool
) -> QualityReport:
    canary = cast(Canary, target)
    report = QualityReport(where=f"the canary {canary.url}")
    steps = gated_steps(plan)
    if not steps:
        return report
    warm_up()  # great_expectations imports while the candidates load (the checks wait for it)
    touched: list[tuple[Step, Probe]] = []
    timeout = settings.triton_timeout * 10
    try:
        for step in steps:
            probe = _probe(step, canary)
            touched.append((step, probe))
            _load(canary, step, probe, gpu, timeout)
        for step, probe in touched:
            check_model(canary, settings, step.config_text, probe, report)
    except MlregError as exc:
        report.failures.append(exc.message)
    if report.failures:
        _restore(canary, store, plan, touched, report)
    else:
        _release(canary, touched)
    return report


def _probe(step: Step, canary: Canary) -> Probe:
    reference = serving_reference(step)
    name = f"{step.model}{PRIVATE_SUFFIX}" if step.runtime_changes else ""
    return Probe(step.model, step.version, reference, canary if reference else None, name)


def _load(canary: Canary, step: Step, probe: Probe, gpu: bool, timeout: float) -> None:
    if probe.name:  # alone, under a private name, from its own files
        config = config_json(desired_config(step.config_text, [step.version], gpu), probe.name)
        assert step.folder is not None
        canary.load(probe.name, config=config, files=_files(step.folder / step.version, step.version))
        canary.wait_ready(probe.name, step.version, timeout=timeout)
        return
    versions = sorted(set(step.previous_versions) | {step.version}, key=int)  # as deploy writes it
    canary.load(step.model, config=config_json(desired_config(step.config_text, versions, gpu)))
    canary.wait_ready(step.model, step.version, timeout=timeout)


def _files(folder: Path, version: str) -> dict[str, bytes]:
    return {
        f"file:{version}/{path.relative_to(folder).as_posix()}": path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in SKIPPED_FILES
    }


def _release(canary: Canary, touched: list[tuple[Step, Probe]]) -> None:
    """A passed gate: the private models go; the candidates loaded in place stay for ``deploy``."""
    for _, probe in touched:
        if probe.name:
            try:
                canary.unload(probe.name)
            except MlregError as exc:  # harmless: nothing routes to it; a restart drops it
                log.warning("could not unload %s from %s: %s", probe.name, canary.url, exc.message)


def _restore(
    canary: Canary,
    store: RepositoryStore,
    plan: Plan,
    touched: list[tuple[Step, Probe]],
    report: QualityReport,
) -> None:
    """A failed gate: the canary as before, this promotion's uploads removed."""
    for step, probe in reversed(touched):
        try:
            if probe.name:
                canary.unload(probe.name)
            elif step.previous_config is None:
                canary.unload(step.model)
            else:
                canary.load(step.model, config=config_json(step.previous_config))
        except MlregError as exc:
            report.cleanup_errors.append(f"{canary.url}: {step.model}: {exc.message}")
    for step in plan.steps:
        if step.upload and step.folder is not None and step.version not in step.previous_versions:
            try:
                store.delete_version(step.model, step.version)
            except MlregError as exc:
                report.cleanup_errors.append(f"{store.uri}: {step.model}/{step.version}: {exc.message}")
    report.restored = not report.cleanup_errors
