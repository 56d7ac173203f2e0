"""The seam every check and load guard plugs into (issue 47): a ``Check`` judges a candidate before or
during traffic, a ``Guard`` must hold before a load; each returns ``Verdict`` records.

A check lives in its own module under ``pipelines/checks/`` (a guard under ``pipelines/guards/``),
defines one object satisfying the Protocol, and is registered by one line in
``pipelines/promote/registered.py``.  The engine reads the registry, never a feature's name:

- the settings loader (``pipelines/promote/environments.py``) lets the keys each one ``owns`` through
  and parses them with its own ``parse`` (its result is ``Environment.setting(name)``);
- the preflight (``pipelines/promote/preflight.py``, a stage after ``convert`` and ``validate``,
  before the upload and any load -- a dry run's scratch server's included) runs every registered
  ``Check`` whose ``phase`` is ``"preflight"`` ONCE per promotion, on one ``Trial`` holding every
  target (``targets``: each replica's connection, read for its metadata only), the environment's
  ``store`` and the plan's ``steps`` (converted ones included); nothing is loaded when it judges;
- the gates (canary, scratch server) run every registered ``Check`` whose ``phase`` is ``"gate"``,
  in the registry's order, for each candidate (a ``Trial``); ``--skip NAME`` and an environment's
  ``observe = [NAME, ...]`` name checks by their ``name`` (``--skip quality`` skips the gate, not
  the preflight).

A verdict that ``refuses`` stops the promotion; an *observed* check's verdict is recorded exactly as
an enforced one's, marked ``observed``, and never refuses ("observed: would have refused").

Around the loads and after ``record`` the engine also reads the registry only:

- each registered ``Guard``'s ``load_guard`` builds its part in one promotion (a ``LoadGuard``, or
  None), which the fleet asks before each load and tells after it, in the registry's order; a
  refusal before anything is sent is a ``LoadRefused`` (a staged roll-out may leave that replica out
  under ``max_unavailable``);
- each registered ``Check`` that offers one (``AfterRecord``) gets its ``after_record`` step run once
  the promotion happened (capture armed again: the shadow check's), best effort and bounded
  (``pipelines/promote/after.py``);
- each registered ``Check`` that must tell this promotion's own requests apart (``OwnRequests``: the
  shadow replay leaves them out of what it replays) has its settings told their secret prefix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pipelines.core.changes import Change
from pipelines.core.plan import Step
from registry.errors import MlregError, PromotionError
from registry.settings import Settings

Result = Literal["pass", "fail", "inconclusive", "skipped"]
RESULTS: tuple[Result, ...] = ("pass", "fail", "inconclusive", "skipped")
# once before any load (every target), before traffic (canary/scratch), during traffic, before a load
Phase = Literal["preflight", "gate", "bake", "load"]
PHASES: tuple[Phase, ...] = ("preflight", "gate", "bake", "load")
REFUSING: frozenset[str] = frozenset({"fail", "inconclusive"})  # a check that cannot judge fails closed
PRIVATE_SUFFIX = (
    "__mlreg_quality"  # a candidate loaded alone on the canary is <model><suffix> (runtime change)
)


@dataclass(frozen=True)
class Verdict:
    """One check's judgement of one subject (a candidate version, a replica): what was measured,
    from where, against what, and the result; ``findings``: the failure's lines (one per thing
    judged wrong, as the gate's report prints them)."""

    name: str  # the check's registered name ("golden", "perf", "shadow", ...)
    result: Result
    subject: str = ""  # what was judged: "image_model v3"
    measured: str = ""  # what, and from which counter or source
    window: str = ""  # when: "the canary, before traffic", "bake 30 s"
    replicas: tuple[str, ...] = ()
    sample: int | None = None  # sample size: requests, captures, outputs
    value: float | None = None
    threshold: float | None = None  # or allowance
    noise_floor: float | None = None
    why: str = ""  # the reason (a skip's, a failure's one line)
    fix: str = ""  # for a failure: what to do
    observed: bool = False  # recorded, not enforced (the environment's observe list)
    findings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"a verdict's result is one of {', '.join(RESULTS)}, not {self.result!r}")

    @property
    def refuses(self) -> bool:
        """Whether this verdict stops the promotion: a failure or an inconclusive judgement of an
        enforced check (never an observed one's)."""
        return self.result in REFUSING and not self.observed

    @property
    def would_refuse(self) -> bool:
        return self.result in REFUSING

    def observe(self) -> Verdict:
        return dataclasses.replace(self, observed=True)

    def line(self) -> str:
        """One line for people: ``perf image_model v3: fail (value 1.4, threshold 1.25): slower ...``."""
        figures = ", ".join(
            f"{k} {_number(v)}"
            for k, v in (("value", self.value), ("threshold", self.threshold), ("sample", self.sample))
            if v is not None
        )
        head = f"{self.name} {self.subject}".strip() + f": {self.result}"
        if self.observed and self.would_refuse:
            head = f"{self.name} {self.subject}".strip() + f": observed: would have refused ({self.result})"
        return head + (f" ({figures})" if figures else "") + (f": {self.why}" if self.why else "")

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["replicas"] = list(self.replicas)
        data["findings"] = list(self.findings)
        for key in ("value", "threshold", "noise_floor"):
            if isinstance(data[key], float) and not math.isfinite(data[key]):
                data[key] = None  # JSON has no nan
        data["refuses"] = self.refuses
        if self.observed and self.would_refuse:
            data["note"] = "observed: would have refused"
        return data


def _number(value: float | int) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def refusals(verdicts: Iterable[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.refuses]


@dataclass(frozen=True)
class Place:
    """Where a settings table is read: ``where`` names it in errors (file and section); ``folder``:
    the folder relative paths are read from; the environment's ``store``."""

    where: str
    folder: Path
    settings: Settings
    store: str


@dataclass
class Trial:
    """One candidate before traffic, as a gate check sees it: the step, the server it answers on
    (``candidate``: an ``infer(model, inputs, outputs, version=)``, under the name ``loaded_as``),
    the serving version it is compared with (``reference``, answered by ``serving``), the
    check's own parsed settings (``setting``) and the gate's report (``report``: the record each
    feature adds its figures to).  ``skip``: why the check must not judge ("" it runs)."""

    step: Step
    settings: Settings
    report: Any
    loaded_as: str = ""
    reference: str = ""
    candidate: Any = None
    serving: Any = None
    setting: Any = None
    where: str = ""  # "canary" or "scratch"
    replica: str = ""
    connect: Callable[[], Any] | None = None  # a new connection to the candidate's server
    metrics_url: str = ""
    load_seconds: float | None = None
    skip: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # the preflight's (phase "preflight", once per promotion, nothing loaded): every target's
    # connection (its metadata read, nothing sent to load), the environment's store, the plan's steps
    targets: tuple[Any, ...] = ()
    store: str = ""
    steps: tuple[Step, ...] = ()

    @property
    def subject(self) -> str:
        return f"{self.step.model} v{self.step.version}"


class Check(Protocol):
    """Something that judges a promotion before any load (``phase`` "preflight": once, every
    target), a candidate before traffic ("gate") or during it ("bake").

    ``name``: its registered name (``--skip NAME``, ``observe = [NAME]``, the verdict's name);
    ``aliases``: older flag names that skip it (``--skip-perf``); ``where``: the gates it runs in
    ("canary", "scratch"); ``owns``: the keys of an environment section its ``parse`` reads."""

    @property
    def name(self) -> str: ...

    @property
    def phase(self) -> Phase: ...

    @property
    def where(self) -> frozenset[str]: ...

    @property
    def owns(self) -> frozenset[str]: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...

    def parse(self, place: Place, raw: Mapping[str, Any]) -> Any:
        """Its settings from an environment's section (the defaults where it says nothing)."""
        ...

    def judge(self, trial: Trial) -> list[Verdict]:
        """One candidate judged (``trial.skip``: recorded as skipped, with why)."""
        ...


class Guard(Protocol):
    """Something that must hold before a load onto a replica (memory headroom, the peak-batch
    warmup request): registered as checks are (``GUARDS``); ``field``: the ``Environment`` field its
    parsed setting fills ("": held by its name, ``Environment.setting(name)``)."""

    @property
    def name(self) -> str: ...

    @property
    def field(self) -> str: ...

    @property
    def owns(self) -> frozenset[str]: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...

    def parse(self, place: Place, raw: Mapping[str, Any]) -> Any: ...

    def load_guard(self, ctx: Any) -> LoadGuard | None:
        """Its part in one promotion (``ctx``: the promotion's ``FleetContext``, its fleet built),
        asked around each load (None: nothing to ask); what it finds it reports through ``ctx``
        (the memory headroom guard: ``ctx.result.headroom``)."""
        ...


class LoadGuard(Protocol):
    """A guard's part in one promotion, asked around each load (``pipelines/fleet/admission.py``):
    ``before_load`` raises (a ``LoadRefused`` naming the replica and the fix) to refuse a load before
    anything is sent -- the guards after it are then not asked, nor told; ``after_load`` hears how
    it went (``error`` None: every wanted version READY) and returns why the replica must not be
    loaded again in this promotion ("" when it may); ``notes``: where it could not check (the
    promotion's notes once it promoted: never a silent pass)."""

    def before_load(self, url: str, change: Change) -> None: ...

    def after_load(self, url: str, change: Change, error: MlregError | None) -> str: ...

    @property
    def notes(self) -> list[str]: ...


class LoadRefused(PromotionError):
    """A load guard's refusal before anything was sent to the replica: it serves as it did, so a
    staged roll-out may leave it out under ``max_unavailable`` (``pipelines/rollout/staged.py``)."""


@dataclass(frozen=True)
class AfterStep:
    """A check's step after ``record`` (the promotion happened): ``what`` names it in the notes
    ("capture arming did not finish within 30 s"); ``run`` is told where it is (a replica, a
    location) and returns its notes."""

    what: str
    run: Callable[[Callable[[str], None]], list[str]]


@runtime_checkable
class AfterRecord(Protocol):
    """A ``Check`` that offers a step after ``record`` (the shadow check: capture armed again for
    what now serves); ``after_record`` returns None when it has nothing to do in this promotion."""

    def after_record(self, ctx: Any) -> AfterStep | None: ...


@runtime_checkable
class OwnRequests(Protocol):
    """A ``Check`` that tells this promotion's own requests apart: ``own_requests`` returns its
    parsed settings (``setting``, never None) told ``prefix``, the secret every request id this
    promotion sends starts with (never shown, never recorded)."""

    def own_requests(self, setting: Any, prefix: str) -> Any: ...


class Checked(Protocol):
    """What a passed gate leaves for the stages after it: each candidate's answers to the golden
    inputs (``verify`` compares the servers with them) and the captured requests (the bake's probes
    send them again)."""

    outputs: dict[str, dict[str, Any]]
    captured: dict[str, list[dict[str, Any]]]


class Record(Protocol):
    """What a gate keeps of its checks (``pipelines/checks/golden.QualityReport``): the lines that
    refuse the candidates, every verdict, and what observed checks would have refused."""

    failures: list[str]
    verdicts: list[Verdict]
    observed: list[str]


def skip_reason(check: Check | Guard, skip: frozenset[str]) -> str:
    """Why ``check`` is skipped ("" when it is not): named by ``--skip`` (in its older flag's
    spelling where it has one: the one reports already show)."""
    if check.name not in skip:
        return ""
    older = f"--skip-{check.name}"
    return older if older in check.aliases else f"--skip {check.name}"


@dataclass(frozen=True)
class Judging:
    """What a gate runs: the registered ``checks`` of its kind, in order; the names ``--skip`` gave;
    the names the environment ``observe``s; each check's parsed settings (``setting(name)``)."""

    checks: tuple[Check, ...]
    skip: frozenset[str] = frozenset()
    observe: frozenset[str] = frozenset()
    setting: Callable[[str], Any] = lambda name: None


def run_checks(judging: Judging, trials: list[Trial], record: Record) -> None:
    """Every check of ``judging`` on every candidate (``trials``), in order, each while no enforced
    check refused (the later ones are recorded as not run).  An enforced check's refusing verdict
    adds its findings to ``record.failures``; an observed one's is recorded, marked, and refuses
    nothing ("observed: would have refused")."""
    for check in judging.checks:
        if record.failures:
            record.verdicts.extend(
                Verdict(check.name, "skipped", t.subject, why="not run: an earlier check refused")
                for t in trials
            )
            continue
        observed = check.name in judging.observe
        for trial in trials:
            trial.setting, trial.skip = judging.setting(check.name), skip_reason(check, judging.skip)
            for verdict in check.judge(trial):
                verdict = verdict.observe() if observed else verdict
                record.verdicts.append(verdict)
                if verdict.refuses:
                    record.failures.extend(verdict.findings or (verdict.line(),))
                elif verdict.observed and verdict.would_refuse:
                    record.observed.append(verdict.line())
