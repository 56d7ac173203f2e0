"""The shadow replay in a promotion: where it runs, what it skips, and capture after a promotion.

- In the quality gate (canary or scratch server), after the golden inputs and before any traffic or
  performance check: each gated candidate answers the serving version's captured requests
  (``replay.py``); a refusal is a gate failure, so the undo log puts the canary back.
- It is skipped, with the reason in the report, where it cannot or must not judge: the environment
  captures nothing (no ``shadow`` table) or excludes the model, nothing serves yet, ``--skip-shadow``,
  or an allowed breaking change of the contract (production's requests no longer fit).
- Everywhere else it never skips silently: captures that cannot be read (a location unreachable or
  frozen: bounded by ``capture.READ_DEADLINE_S``) refuse, named; fewer honest captures than
  ``min_captures`` *distinct inputs* (forged files and mlreg's own requests of this promotion do
  not count; a request repeated counts once) are *inconclusive*, which refuses too.
- After a promotion that succeeded, capture is switched on again on every replica for the models
  it moved (Triton's ``trace_count`` restarts) and the files are pruned to their bounds
  (``capture_after``: best effort, bounded by ``after.py``).
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.checks.capture import Shadow, arm, parse_shadow, prune_all, read_captures, settle
from pipelines.checks.replay import ShadowResult, inconclusive, kind_of, refused, replay, skipped
from pipelines.core.check import AfterStep, Phase, Place, Result, Trial, Verdict
from pipelines.core.plan import Step
from registry.contracts.config import parse_config
from registry.contracts.diff import diff_configs
from registry.errors import ContractError, MlregError

if TYPE_CHECKING:
    import numpy as np  # annotations only: numpy (~0.15 s) is not imported by the read-only verbs

log = logging.getLogger(__name__)

Infer = Callable[..., dict[str, "np.ndarray"]]  # ServingTarget.infer


class RunArtifacts(Protocol):
    """What ``scrub_run`` needs of the registry's runs (``registry.mlflow.MlflowRegistry.runs``)."""

    def artifact_paths(self, run_id: str, path: str) -> set[str]: ...

    def download(self, run_id: str, path: str, dest: Path) -> Path: ...

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None: ...


def replay_step(
    step: Step,
    reference: str,
    candidate: tuple[Infer, str],
    serving: Infer,
    shadow: Shadow | None,
    skip: bool = False,
) -> tuple[ShadowResult, list[dict[str, np.ndarray]]]:
    """``step``'s candidate (``candidate``: an infer and the name it is loaded under) against the
    serving version ``reference`` (``serving``'s infer) on the captured requests; the result, and
    the captured inputs (the bake's probes send them again)."""
    model, version = step.model, step.version
    why = _skip_reason(step, reference, shadow, skip)
    if why:
        return skipped(model, version, reference, why), []
    assert shadow is not None
    try:
        reading = read_captures(shadow.locations(), model, reference, shadow.count, own=shadow.own)
    except MlregError as exc:  # fails closed: a check the environment asks for is never skipped
        why = f"the captures under {shadow.where()} could not be read: {exc.message}"
        return refused(model, version, reference, why), []
    requests = reading.requests  # one per distinct input, this promotion's own left out
    result = ShadowResult(model, version, reference, skipped=dict(reading.skipped))
    result.forged, result.forged_files = reading.forged, reading.forged_files
    result.captures, result.distinct = reading.captured, len(requests)
    if len(requests) < shadow.least:
        result.captured = len(requests)
        return inconclusive(result, shadow, len(requests)), []
    kinds = _kinds(step)
    names = list(kinds)
    infer, loaded_as = candidate

    def ours(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return infer(loaded_as, inputs, names, version=version)

    def theirs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return serving(model, inputs, names, version=reference)

    replay(requests, ours, theirs, kinds, shadow, result)
    return result, [r.inputs for r in requests]


def _skip_reason(step: Step, reference: str, shadow: Shadow | None, skip: bool) -> str:
    if skip:
        return "--skip-shadow"
    if shadow is None:
        return "the environment captures no requests (no [environments.X.shadow] table)"
    if not shadow.captures_model(step.model):
        return "the environment excludes this model from capture"
    if not reference:
        return "nothing serves this model yet"
    if _breaking(step):
        return "the contract changes (an allowed breaking change): production's requests do not fit it"
    return ""


def _breaking(step: Step) -> bool:
    if step.previous_config is None:
        return False
    try:
        changes = diff_configs(parse_config(step.previous_config), parse_config(step.config_text))
    except ContractError:
        return True
    return any(c.impact == "breaking" for c in changes)


def _kinds(step: Step) -> dict[str, str]:
    """The outputs both the serving config and the candidate's declare, with their measures."""
    kinds = kind_of(step.config_text)
    if step.previous_config is not None:
        before = kind_of(step.previous_config)
        kinds = {n: k for n, k in kinds.items() if n in before}
    return kinds


def capture_after(
    targets: tuple[str, ...],
    connect: Callable[[str], Any],
    steps: list[Step],
    shadow: Shadow | None,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Capture on again for the models a promotion moved (never ensembles), files pruned; notes.
    ``progress`` is told what is being reached (a replica, then each captures location)."""
    if shadow is None:
        return []
    models = [s.model for s in steps if not s.is_ensemble and not s.noop]
    notes = arm(targets, connect, models, shadow, progress)
    if progress is not None:
        progress(shadow.where())
    return notes + prune_all(shadow)


# -- captured tensors already in MLflow: purged from the runs named ---------------------------------

SHADOW_ARTIFACTS = ("report.json", "shadow.json")  # what record.py writes with the first divergent requests
_SHAPE = re.compile(r"shape \[[0-9, ]*\]$")


def scrub_run(registry: RunArtifacts, run_id: str) -> list[str]:
    """The captured tensors of the first divergent requests taken out of run ``run_id``'s
    ``report.json`` and ``shadow.json`` (their shapes kept); the artifacts rewritten."""
    present = registry.artifact_paths(run_id, "")
    scrubbed = []
    with tempfile.TemporaryDirectory(prefix="mlreg-scrub-") as tmp:
        down, up = Path(tmp) / "down", Path(tmp) / "up"
        down.mkdir()
        up.mkdir()
        for name in SHADOW_ARTIFACTS:
            if name not in present:
                continue
            document = json.loads(registry.download(run_id, name, down).read_text())
            shadows = (document.get("shadow") or []) if isinstance(document, dict) else document
            if _scrub(shadows if isinstance(shadows, list) else []):
                (up / name).write_text(json.dumps(document, indent=1, default=str))
                scrubbed.append(name)
        if scrubbed:
            registry.log_artifacts(run_id, up)  # the same names: rewritten in place
    return scrubbed


def _scrub(shadows: list[Any]) -> bool:
    """Each first divergent request's tensor values replaced by their shapes; whether any was."""
    firsts = [
        f for s in shadows if isinstance(s, dict) for f in (s.get("first") or []) if isinstance(f, dict)
    ]
    sides = [f.get(side) for f in firsts for side in ("inputs", "serving", "candidate")]
    changed = False
    for tensors in (t for t in sides if isinstance(t, dict)):
        for name, shown in tensors.items():
            found = _SHAPE.search(str(shown))
            kept = found.group(0) if found else "shape unknown"
            changed = changed or kept != shown
            tensors[name] = kept
    return changed


# -- the seam (pipelines/core/check.py): the replay as the gates run it ----------------------------


@dataclass(frozen=True)
class ShadowCheck:
    """The captured requests replayed to the candidate and the serving version (``replay_step``);
    its settings are the environment's ``[shadow]`` table (capture, read by ``capture.parse_shadow``)."""

    name: str = "shadow"
    phase: Phase = "gate"
    where: frozenset[str] = frozenset({"canary", "scratch"})
    owns: frozenset[str] = frozenset({"shadow"})
    aliases: tuple[str, ...] = ("--skip-shadow",)

    def parse(self, place: Place, raw: Mapping[str, Any]) -> Shadow | None:
        shadow = parse_shadow(place.where, raw.get("shadow"), place.folder)
        return settle(place.where, shadow, place.store, place.settings)

    def judge(self, trial: Trial) -> list[Verdict]:
        step, report = trial.step, trial.report
        if trial.serving is None or step.folder is None:
            return []  # nothing answers for the serving version here (a scratch server's runtime change)
        candidate = (trial.candidate.infer, trial.loaded_as or step.model)
        skip = bool(trial.skip)
        result, inputs = replay_step(
            step, trial.reference, candidate, trial.serving.infer, trial.setting, skip
        )
        report.shadow.append(result.to_dict())
        if inputs:
            report.captured[step.model] = inputs
        return [verdict(self.name, result, trial, trial.setting)]

    def own_requests(self, setting: Shadow, prefix: str) -> Shadow:
        """The replay leaves out the captured requests this promotion sent (their ids start with
        ``prefix``); no report or run records it."""
        return replace(setting, own=prefix)

    def after_record(self, ctx: Any) -> AfterStep | None:
        """Capture on again for what now serves (``capture_after``), once the promotion happened:
        the runner runs it best effort and bounded (pipelines/promote/after.py) -- a frozen replica
        or captures prefix, or a signal, ends it with a note, never with a false failure of what was
        promoted.  ``ctx``: the promotion's ``FleetContext`` (None: the environment captures nothing)."""
        if ctx.env.shadow is None:
            return None
        targets, connect, steps, shadow = ctx.plan.targets, ctx.fleet.connect, ctx.plan.steps, ctx.env.shadow
        return AfterStep(
            "capture arming", lambda progress: capture_after(targets, connect, steps, shadow, progress)
        )


def outcome(result: ShadowResult) -> Result:
    """The replay's result in the verdict's terms (an inconclusive replay refuses: fails closed)."""
    if result.ok:
        return "skipped" if result.verdict.startswith("skipped") else "pass"
    return "inconclusive" if result.verdict.startswith("inconclusive") else "fail"


def measured(result: ShadowResult, shadow: Shadow | None) -> str:
    if shadow is None:
        return "answers to captured requests"
    return (
        f"answers to captured requests diverging from serving v{result.serving} beyond tolerance "
        f"{shadow.tolerance:g} (captures under {shadow.where()})"
    )


def verdict(name: str, result: ShadowResult, trial: Trial, shadow: Shadow | None) -> Verdict:
    """The replay's result as a verdict: divergent requests above the noise floor (``value``)
    against the allowance (``threshold``: max_divergence of the judged requests + the noise margin)."""
    found = outcome(result)
    judged = bool(result.judged) and found != "inconclusive"
    line = f"{result.model}: shadow replay {result.line()}"
    return Verdict(
        name,
        found,
        trial.subject,
        measured(result, shadow),
        window=f"before traffic, on {trial.report.where}",
        replicas=(trial.replica,) if trial.replica else (),
        sample=result.judged if judged else result.distinct,
        value=float(result.diverged - result.floor) if judged else None,
        threshold=result.allowed if judged else None,
        noise_floor=float(result.floor) if judged else None,
        why=result.verdict.removeprefix("skipped: ") if found == "skipped" else line,
        fix="" if result.ok else REFUSED_FIX,
        findings=() if result.ok else (line,),
    )


REFUSED_FIX = (
    "fix the model (its answers to production's requests differ from the serving version's), or "
    "promote with --skip shadow (the report names it)"
)


CHECK = ShadowCheck()
