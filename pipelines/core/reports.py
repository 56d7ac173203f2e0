"""What each promotion stage reports (one dataclass per stage), and the promotion's result."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from pipelines.core.changes import Rollout
from pipelines.core.check import Verdict
from pipelines.core.plan import Plan, Step
from registry.errors import PromotionError
from registry.settings import redact_data, redact_uri


class StageReport(Protocol):
    def detail(self) -> str: ...


class LoadFindings(Protocol):
    """What the fleet's load guard found (pipelines/guards/headroom.py ``Headroom``): per replica
    the memory figures read, refusals, leaks, and the footprints it measured (to record)."""

    def to_dict(self) -> dict[str, Any]: ...

    def footprints(self) -> list[tuple[str, str, int, str]]: ...  # (model, version, bytes, kind)

    def version_tags(self) -> list[tuple[str, str, dict[str, str]]]: ...  # the record stage writes them

    def summary(self) -> str: ...

    @property
    def notes(self) -> list[str]: ...  # where it could not check (never a silent pass)


@dataclass
class ResolveReport:
    steps: list[str]  # "model vN (role)"
    locked: list[str]

    def detail(self) -> str:
        return ", ".join(self.steps)


@dataclass
class NoopReport:
    model: str
    version: str
    environment: str

    def detail(self) -> str:
        return f"{self.model} version {self.version} already serves in '{self.environment}'"


@dataclass
class RepairReport:
    """The no-op's registry repair: what it put right (an alias, a failed attempt's tag)."""

    repaired: list[str] = field(default_factory=list)

    def detail(self) -> str:
        return "; ".join(self.repaired) or "the registry already says what serves"


@dataclass
class ConvertReport:
    model: str
    source_version: str
    onnx_version: str
    parity_max_abs_diff: float
    registered: bool = False  # False: assemble registers it (a dry run never does)

    def detail(self) -> str:
        return (
            f"{self.model} v{self.source_version} (SavedModel) -> v{self.onnx_version} (ONNX), "
            f"parity max |diff| {self.parity_max_abs_diff:.2g}"
            + ("" if self.registered else "; registered by the first live stage")
        )


@dataclass
class ValidateReport:
    checked: int
    breaking_allowed: list[str]
    verified: list[str]  # model/version whose stored bytes were checked against the registry

    def detail(self) -> str:
        text = f"{self.checked} model(s) checked"
        if self.breaking_allowed:
            text += f", {len(self.breaking_allowed)} breaking change(s) allowed"
        if self.verified:
            text += f", stored bytes verified: {', '.join(self.verified)}"
        return text


@dataclass
class QualityStageReport:
    checked: list[str]
    changes: dict[str, float]
    perf: list[dict[str, Any]] = field(default_factory=list)  # pipelines/checks/perf.py, per model
    where: str = ""  # "the canary URL" / "a scratch tritonserver"
    previous: dict[str, str] = field(default_factory=dict)  # model -> the serving version compared
    shadow: list[dict[str, Any]] = field(default_factory=list)  # pipelines/checks/replay.py, per model
    generated: list[str] = field(default_factory=list)  # checked on inputs made from the config
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # every check's (pipelines/core/check.py)
    observed: list[str] = field(default_factory=list)  # what observed checks would have refused

    def detail(self) -> str:
        changes = ", ".join(f"{k} max|Δ| {v:.3g}" for k, v in self.changes.items())
        perf = "; ".join(f"perf {p['line']}" for p in self.perf)
        shadow = "; ".join(f"shadow {s['line']}" for s in self.shadow)
        return (
            self._inputs_line()
            + (f"; against serving: {changes}" if changes else "")
            + (f"; {shadow}" if shadow else "")
            + (f"; {perf}" if perf else "")
            + "".join(f"; {line}" for line in self.observed)
        )

    def _inputs_line(self) -> str:
        """Which models passed on golden inputs, which on inputs made from their config (no golden
        inputs were given: zeros of each input's shape), or that none was sent any."""
        given = [m for m in self.checked if m not in self.generated]
        made = [m for m in self.checked if m in self.generated]
        parts = [f"golden inputs passed on {', '.join(given)}"] if given else []
        if made:
            parts.append(f"inputs made from the config (no golden inputs given) passed on {', '.join(made)}")
        return "; ".join(parts) or "no model was sent inputs"


@dataclass
class UploadReport:
    bytes_sent: int
    store: str
    uploaded: list[str]

    def detail(self) -> str:
        return f"{self.bytes_sent:,} bytes uploaded to {redact_uri(self.store)}"


@dataclass
class FleetReport:
    """deploy, finalize, rollback: the roll-outs over the fleet, one per config written."""

    summary: str
    rollouts: list[Rollout] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # replicas left out (max_unavailable) -> why

    def detail(self) -> str:
        if not self.skipped:
            return self.summary
        left_out = "; ".join(f"{url} ({why})" for url, why in self.skipped.items())
        return f"{self.summary}; skipped under max_unavailable: {left_out}"


@dataclass
class VerifyReport:
    targets: list[str]
    models: list[str]

    def detail(self) -> str:
        return f"READY and answering on {len(self.targets)} target(s)"


@dataclass
class RecordReport:
    alias: str
    model: str
    version: str
    run_id: str

    def detail(self) -> str:
        return f"alias '{self.alias}' -> {self.model} v{self.version}; run {self.run_id}"


@dataclass
class StageRecord:
    stage: str
    status: str  # "ok" | "failed"
    seconds: float
    detail: str
    report: StageReport | None = None
    by: str = ""  # the strategy that ran it: the deployer ("all at once", "staged") or the gate

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "stage": self.stage,
            "status": self.status,
            "seconds": self.seconds,
            "detail": self.detail,
        }
        if self.by:
            data["by"] = self.by
        if self.report is not None:
            data["report"] = asdict(self.report)  # type: ignore[call-overload]
        return data


@dataclass
class PromotionResult:
    plan: Plan
    ok: bool = False
    rolled_back: bool = False
    stages: list[StageRecord] = field(default_factory=list)
    error: str = ""
    rollback_error: str = ""
    run_id: str = ""
    rollback: str = "not needed"  # "not needed" (nothing changed) | "succeeded" | "failed"
    notes: list[str] = field(default_factory=list)  # what a failure left: the store's configs, locks
    headroom: LoadFindings | None = None  # memory headroom and leaks around each load (the runner's)
    shadow: list[dict[str, Any]] = field(default_factory=list)  # the gate's shadow replay, per model
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # every check's and guard's (core/check.py)
    bakes: list[Any] = field(default_factory=list)  # the staged bakes' judgements (policy.Verdict)
    adapted: list[dict[str, Any]] = field(default_factory=list)  # in verdicts: promote/verdicts.py's
    time_to_safe: dict[str, Any] | None = None  # an aborted promotion: detection -> every replica back
    started: float = field(default_factory=time.time)  # when the promotion began: its MLflow run's start

    @property
    def failed_stage(self) -> str:
        """The stage that failed ("" when none did, or a lost lock stopped it between stages)."""
        return next((s.stage for s in self.stages if s.status == "failed" and s.stage != "rollback"), "")

    @property
    def reason(self) -> str:
        """The promotion's one-line reason: the first enforced check's or guard's verdict that
        refused (its ``line``), else the error's first line ("" when it promoted)."""
        if not self.error:
            return ""
        for found in self.verdicts:  # the undo's time to safe judges no candidate: never the reason
            if found.get("refuses") and found.get("name") != "time_to_safe":
                return verdict_line(found)
        return self.error.splitlines()[0]

    @property
    def noop(self) -> bool:
        return bool(self.stages) and self.stages[0].stage == "noop"  # resolve found nothing to do

    @property
    def outcome(self) -> str:
        if not self.error:
            return "promoted"
        if self.rollback_error:
            return "rollback failed"
        return "rolled back" if self.rolled_back else "refused"

    def stage_names(self) -> list[str]:
        return [s.stage for s in self.stages]

    def to_dict(self) -> dict[str, Any]:
        """The result as ``--json`` prints it and MLflow's ``report.json`` keeps it: every URI in
        it redacted (``registry.settings.redact_uri``), whatever a stage or an error wrote."""
        return redact_data(self._fields())

    def _fields(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rolled_back": self.rolled_back,
            "error": self.error,
            "rollback_error": self.rollback_error,
            "outcome": self.outcome,
            "failed_stage": self.failed_stage,
            "rollback": self.rollback,
            "notes": self.notes,
            "promotion_run": self.run_id,
            "plan": self.plan.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "headroom": self.headroom.to_dict() if self.headroom is not None else None,
            "shadow": self.shadow,
            "verdicts": self.verdicts,
            "reason": self.reason,
            "time_to_safe": self.time_to_safe,
        }


def verdict_line(found: dict[str, Any]) -> str:
    """A verdict's one line (``Verdict.line``) from its ``to_dict`` form."""
    names = {f.name for f in fields(Verdict)}
    given = {k: v for k, v in found.items() if k in names}
    given["replicas"] = tuple(given.get("replicas") or ())
    given["findings"] = tuple(given.get("findings") or ())
    try:
        return Verdict(**given).line()
    except (TypeError, ValueError):  # not a verdict's fields: its name and result, as given
        return f"{found.get('name', '?')}: {found.get('result', '?')}"


class Refusal(PromotionError):
    """A check refused the candidates after they were put where it judges them (the canary gate):
    once the undo log took that back, the promotion changed nothing, and ``after_undo`` words the
    error for what the undo did."""

    def after_undo(self, restored: bool) -> str:
        return self.message


class PromotionFailed(PromotionError):
    """A promotion stage failed; ``result`` holds the plan, the stage reports and what was undone."""

    def __init__(self, message: str, *, fix: str, result: PromotionResult) -> None:
        super().__init__(message, fix=fix, result=result)  # context["result"]: for older callers
        self.result = result


@dataclass
class Converted:
    """A SavedModel step converted to ONNX, numbered but not registered yet (a dry run registers
    nothing): ``register_converted`` is the live half."""

    step: Step  # the ONNX version as the plan carries it
    source_version: str
    parity: dict[str, float]
    export_info: dict[str, Any]
    registered: bool  # an identical ONNX version is registered already (its number is used)


@dataclass(frozen=True)
class Repair:
    """A stored version to rewrite from the registry's copy in ``folder`` (config + <version>/)."""

    model: str
    version: str
    folder: Path
    problem: str  # what the store's copy got wrong

    def detail(self) -> str:
        return f"{self.model}/{self.version} restored from the registry ({self.problem})"
