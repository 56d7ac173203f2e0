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

Every load goes through ``Fleet.move`` and is noted in the promotion's undo log first: on a
failure the runner's replay puts the canary back (the previous config as override, or the model
unloaded where it is new) and removes the files this promotion uploaded; every config, other
target and the MLflow alias stay untouched.

Ensembles are not loaded by the gate (loading a re-pointed ensemble would send live traffic to the
candidate): ``verify`` runs every ensemble end to end on every target right after the re-point,
and a failure there rolls the promotion back.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines.promote.fanout import Change, Fleet
from pipelines.promote.plan import Plan, Step, desired_config
from pipelines.promote.quality import Probe, QualityReport, check_model, serving_reference, warm_up
from pipelines.promote.undo import UndoLog
from registry.errors import MlregError
from registry.settings import Settings

log = logging.getLogger(__name__)
PRIVATE_SUFFIX = "__mlreg_quality"
SKIPPED_FILES = (".mlreg-manifest.json",)


def gated_steps(plan: Plan) -> list[Step]:
    """The versions that never served here: registered models, not ensembles (see the docstring)."""
    return [
        s
        for s in plan.steps
        if not s.is_ensemble and s.folder is not None and s.version not in s.previous_versions
    ]


def canary_gate(plan: Plan, settings: Settings, fleet: Fleet, undo: UndoLog, gpu: bool) -> QualityReport:
    url = plan.targets[0]
    report = QualityReport(where=f"the canary {url}")
    steps = gated_steps(plan)
    if not steps:
        return report
    warm_up()  # great_expectations imports while the candidates load (the checks wait for it)
    canary = fleet.target(url)
    probes: list[tuple[Step, Probe]] = []
    try:
        for step in steps:
            reference = serving_reference(step)
            name = f"{step.model}{PRIVATE_SUFFIX}" if step.runtime_changes else ""
            probe = Probe(step.model, step.version, reference, canary if reference else None, name)
            probes.append((step, probe))
            if name:
                undo.loaded_privately(name, url)
            else:
                undo.moved(step, url)
            fleet.move(url, candidate(step, name, gpu))
        for step, probe in probes:
            check_model(canary, settings, step.config_text, probe, report)
    except MlregError as exc:
        report.failures.append(exc.message)
    if not report.failures:
        _release(fleet, undo, url, probes)
    return report


def candidate(step: Step, private_name: str, gpu: bool) -> Change:
    """The candidate on the canary: beside the serving versions, in the config ``deploy`` writes
    next; or alone under a private name, from its own files."""
    if private_name:
        assert step.folder is not None
        text = desired_config(step.config_text, [step.version], gpu)
        files = _files(step.folder / step.version, step.version)
        return Change(private_name, text, (step.version,), files=files)
    versions = sorted(set(step.previous_versions) | {step.version}, key=int)  # as deploy writes it
    return Change(step.model, desired_config(step.config_text, versions, gpu), (step.version,))


def _files(folder: Path, version: str) -> dict[str, bytes]:
    return {
        f"file:{version}/{path.relative_to(folder).as_posix()}": path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in SKIPPED_FILES
    }


def _release(fleet: Fleet, undo: UndoLog, url: str, probes: list[tuple[Step, Probe]]) -> None:
    """A passed gate: the private models go; the candidates loaded in place stay for ``deploy``."""
    for _, probe in probes:
        if probe.name:
            failure = fleet.restore(url, Change(probe.name, None))
            if failure:  # harmless: nothing routes to it; a restart drops it
                log.warning("could not unload %s: %s", probe.name, failure)
            undo.forget(probe.name)
