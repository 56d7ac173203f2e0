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

The performance check (``pipelines/checks/perf.py``) runs last, once the answers passed: the
candidate and the serving version answer the same golden requests, interleaved, on the canary; the
figures (p50/p95, throughput, the candidate's load time, Triton's queue and compute time per
request where the environment says where its metrics are) go into the report either way.

Ensembles are not loaded by the gate (loading a re-pointed ensemble would send live traffic to the
candidate): ``verify`` runs every ensemble end to end on every target right after the re-point,
and a failure there rolls the promotion back.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

from pipelines.checks.golden import QualityReport, serving_reference, warm_up
from pipelines.core.check import PRIVATE_SUFFIX, Judging, Trial, run_checks
from pipelines.core.plan import Plan, Step, desired_config
from pipelines.fleet.fleet import Change, Fleet, checkpoint
from registry.errors import MlregError, TritonError
from registry.settings import Settings

log = logging.getLogger(__name__)
SKIPPED_FILES = (".mlreg-manifest.json",)
# The statuses of a load Triton ran and refused (its initialize, files or config failed): an
# allow-list.  Anything else -- a load still running past its deadline ('load-deadline'), a replica
# that does not answer (UNAVAILABLE, DEADLINE_EXCEEDED), a missing key ('unauthorised'), a fenced
# replica or a headroom refusal (PromotionError), a lost lock (StorageError) -- keeps its own fix.
LOAD_REFUSED = frozenset(
    {"", "StatusCode.INTERNAL", "StatusCode.INVALID_ARGUMENT", "StatusCode.UNKNOWN", "StatusCode.NOT_FOUND"}
)


def never_loaded(exc: MlregError) -> bool:
    """``exc`` (raised by a candidate's load on the canary) says Triton ran the load and refused
    it -- the candidate never loaded -- by its type and status, never its text (issue 45 review, F5)."""
    return isinstance(exc, TritonError) and str(exc.context.get("status") or "") in LOAD_REFUSED


def load_failed(report: QualityReport, model: str, version: str, exc: MlregError) -> None:
    """A candidate's load on the canary failed: ``report`` says why by the error's cause."""
    if never_loaded(exc):
        report.not_loaded.append(f"{model} v{version}")  # no output to judge
    elif exc.fix:
        report.load_fix = exc.fix
    else:
        report.load_fix = f"{model} v{version} was not loaded on the canary (no output judged): {exc.message}"


def gated_steps(plan: Plan) -> list[Step]:
    """The versions that never served here: registered models, not ensembles (see the docstring)."""
    return [
        s
        for s in plan.steps
        if not s.is_ensemble and s.folder is not None and s.version not in s.previous_versions
    ]


def canary_gate(
    plan: Plan,
    settings: Settings,
    fleet: Fleet,
    gpu: bool,
    judging: Judging,
    metrics_url: str = "",
) -> QualityReport:
    """The candidates on the canary: loaded, then judged by the registered checks of ``judging``
    (golden outputs, shadow replay, perf, ...: pipelines/promote/registered.py)."""
    url = plan.targets[0]
    report = QualityReport(where=f"the canary {url}")
    steps = gated_steps(plan)
    if not steps:
        return report
    warm_up()  # great_expectations imports while the candidates load (the checks wait for it)
    canary = fleet.target(url)
    trials: list[Trial] = []
    try:
        for step in steps:
            reference = serving_reference(step)
            name = f"{step.model}{PRIVATE_SUFFIX}" if step.runtime_changes else ""
            began = time.perf_counter()
            try:
                fleet.move(url, candidate(step, name, gpu))
            except MlregError as exc:
                load_failed(report, step.model, step.version, exc)
                raise
            trials.append(
                Trial(
                    step,
                    settings,
                    report,
                    loaded_as=name or step.model,
                    reference=reference,
                    candidate=canary,
                    serving=canary,  # the serving versions answer there (the replay says when none does)
                    where="canary",
                    replica=url,
                    connect=partial(fleet.connect, url),
                    metrics_url=metrics_url,
                    load_seconds=time.perf_counter() - began,
                )
            )
            checkpoint(f"gate:{step.model}")  # the candidate loaded on the canary, not yet judged
        run_checks(judging, trials, report)
    except MlregError as exc:
        report.failures.append(exc.message)
    if not report.failures:
        _release(fleet, url, trials)
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


def _release(fleet: Fleet, url: str, trials: list[Trial]) -> None:
    """A passed gate: the private models go (no longer the undo log's); the candidates loaded in
    place stay for ``deploy``."""
    for trial in trials:
        if trial.loaded_as != trial.step.model:
            failure = fleet.discard(url, trial.loaded_as)
            if failure:  # harmless: nothing routes to it; a restart drops it
                log.warning("could not unload %s: %s", trial.loaded_as, failure)
