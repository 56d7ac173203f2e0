"""The shadow replay in a promotion: where it runs, what it skips, and capture after a promotion.

- In the quality gate (canary or scratch server), after the golden inputs and before any traffic or
  performance check: each gated candidate answers the serving version's captured requests
  (``replay.py``); a refusal is a gate failure, so the undo log puts the canary back.
- It is skipped, with the reason in the report, where it cannot or must not judge: the environment
  captures nothing (no ``shadow`` table) or excludes the model, nothing serves yet, ``--skip-shadow``,
  an allowed breaking change of the contract (production's requests no longer fit), or nothing was
  captured of the serving version.
- After a promotion that succeeded, capture is switched on again on every replica for the models
  it moved (Triton's ``trace_count`` restarts) and the files are pruned to their bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipelines.promote.capture import Captures, Shadow, arm, read_captures
from pipelines.promote.plan import Step
from pipelines.promote.replay import ShadowResult, kind_of, replay, skipped
from pipelines.triton import REQUEST_PREFIX  # mlreg's own requests: never read back as production's
from registry.contracts.config import parse_config
from registry.contracts.diff import diff_configs
from registry.errors import ContractError, MlregError

log = logging.getLogger(__name__)

Infer = Callable[..., dict[str, np.ndarray]]  # ServingTarget.infer


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
        reading = read_captures(shadow.captures, model, reference, shadow.count)
    except MlregError as exc:
        return skipped(model, version, reference, f"the captures could not be read: {exc.message}"), []
    requests = [r for r in reading.requests if not r.request_id.startswith(REQUEST_PREFIX)]
    if not requests:
        where = f" under {shadow.captures}" if shadow.captures else " (the environment names no captures)"
        found = skipped(model, version, reference, f"no captured request of v{reference}{where}")
        found.skipped = dict(reading.skipped)
        return found, []
    kinds = _kinds(step)
    names = list(kinds)
    infer, loaded_as = candidate

    def ours(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return infer(loaded_as, inputs, names, version=version)

    def theirs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return serving(model, inputs, names, version=reference)

    result = ShadowResult(model, version, reference, skipped=dict(reading.skipped))
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
    targets: tuple[str, ...], connect: Callable[[str], Any], steps: list[Step], shadow: Shadow | None
) -> list[str]:
    """Capture on again for the models a promotion moved (never ensembles), files pruned; notes."""
    if shadow is None:
        return []
    models = [s.model for s in steps if not s.is_ensemble and not s.noop]
    notes = arm(targets, connect, models, shadow)
    if shadow.captures:
        try:
            Captures(shadow.captures).prune(shadow)
        except (OSError, MlregError) as exc:
            notes.append(f"captured files under {shadow.captures} could not be pruned: {exc}")
    return notes
