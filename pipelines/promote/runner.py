"""Running a promotion: a list of stages over one ``PromotionContext``, and one error hook.

``resolve`` builds the plan from under the locks and decides, once, whether there is anything to
do; the strategies are then chosen (``choose_deployer``: all at once, or staged under the
environment's policy; ``choose_gate``: on the canary, on a scratch server, or none) and the stage
list names them:

    resolve ▸ [convert] ▸ validate ▸ preflight ▸ [quality: scratch] ▸ assemble ▸ [archive] ▸
    [quality: canary] ▸ deploy ▸ verify ▸ finalize ▸ record ▸ [retain]        (a no-op: resolve ▸ repair)

Retention (``pipelines/promote/retention.py``): ``archive`` moves the versions beyond the
environment's window out of Triton's prefix before the load; ``retain`` finishes what is left once
the alias has moved (keep = 1, the archive's copy of a version brought back).  Retain is never
undone (a promotion is never undone for its sake); both run only when there is something to do.

The runner only sequences, times and reports.  ``--dry-run`` stops before the first live stage.
Any exit of a stage after ``resolve`` -- an ``MlregError``, any other exception, an interrupt --
goes to ``on_error``, which replays the undo log (ensembles first, then members: see
``pipelines/core/undo.py``), records the promotion in MLflow, and raises ``PromotionFailed``
saying what was put back; the MLflow alias moves only in ``record``, the last stage.

Locks: a promotion holds the store lock of every model whose config it writes (the model, the
members it brings along and every ensemble it re-points), taken in sorted name order without
waiting, and reads the configs it plans from under those locks.
"""

from __future__ import annotations

import time

from pipelines.core.context import Deployer, Options, PromotionContext, Stage
from pipelines.core.plan import Plan
from pipelines.core.policy import check_fleet
from pipelines.core.ports import Registry, ScratchServers, ServingTarget
from pipelines.core.reports import PromotionResult, StageRecord
from pipelines.core.undo import UndoLog
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import Fleet
from pipelines.fleet.replicas import Connect, reachable, triton_connector
from pipelines.ledger import recorder as ledger_recorder
from pipelines.promote import registered, retention
from pipelines.promote.after import RETAIN_S, Progress, best_effort, bounded
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.failure import fail, message_of
from pipelines.promote.gates import choose_gate
from pipelines.promote.preflight import preflight
from pipelines.promote.stages import (
    assemble,
    convert,
    numbered,
    record,
    repair,
    resolve,
    validate,
    verify,
    wants_onnx,
)
from pipelines.rollout.all_at_once import AllAtOnce
from pipelines.rollout.staged import Staged
from pipelines.storage import open_store
from pipelines.triton.control import RequestNonce
from registry.errors import Terminated
from registry.settings import Settings

__all__ = ["Promotion"]


def choose_deployer(env: Environment) -> Deployer:
    return AllAtOnce() if env.policy is None else Staged(env.policy)


def pipeline(ctx: FleetContext) -> list[Stage]:
    """The stages after ``resolve``, with the strategies ``resolve``'s plan chose."""
    if ctx.noop:
        return [Stage("repair", repair, live=True)]
    assert ctx.deployer is not None
    gate, deployer = ctx.gate, ctx.deployer
    stages = [Stage("convert", convert)] if wants_onnx(ctx) else []
    stages.append(Stage("validate", validate))
    stages.append(Stage("preflight", preflight))  # once, before any load (a dry run's too): it only reads
    if gate is not None and not gate.live:
        stages.append(Stage("quality", gate.run, by=gate.name))
    stages.append(Stage("assemble", assemble, live=True))
    stages.append(Stage("archive", retention.archive, live=True, when=retention.room_needed))
    if gate is not None and gate.live:
        stages.append(Stage("quality", gate.run, live=True, by=gate.name))
    return [
        *stages,
        # deploy: each re-pointed ensemble registered and in the folder of its number, then the roll-out
        Stage("deploy", numbered(deployer.deploy), live=True, by=deployer.name),
        Stage("verify", verify, live=True),
        Stage("finalize", deployer.finalize, live=True, by=deployer.name),
        Stage("record", record, live=True),
        Stage("retain", bounded_retain, live=True, when=retention.pending, undone=False),
    ]


def bounded_retain(ctx: FleetContext) -> retention.RetentionReport:
    """``retention.retain`` after record, best effort and bounded like capture arming (after.py):
    past ``RETAIN_S`` it is left behind (noted: "promoted; retention did not finish within ..."),
    and a signal ends the wait: ``Terminated`` is raised here, *after* record, which the runner
    turns into the real outcome (promoted, exit 0, "promoted; retain interrupted (SIGTERM)", the
    rest of the after-record steps skipped)."""
    found: list[retention.RetentionReport] = []

    def step(progress: Progress) -> list[str]:
        progress(ctx.env.store)
        found.append(retention.retain(ctx))
        return []

    notes, signal_name = bounded("retention", step, RETAIN_S)
    if signal_name:  # the runner notes "promoted; retain interrupted (SIG...)", skips what is left
        raise Terminated(signal_name)
    report = found[0] if found else retention.RetentionReport(ctx.env.keep)
    report.failed.extend(notes)
    ctx.result.notes.extend(notes)
    return report


def after_record(ctx: FleetContext) -> list[str]:
    """Each registered check's step after ``record`` where it offers one (capture armed again), in
    order, each best effort and bounded (after.py): a frozen replica or captures prefix, or a
    signal, ends it with a note, never with a false failure of what was promoted."""
    return [note for step in registered.after_steps(ctx) for note in best_effort(step.what, step.run)]


def _stamped(connect: Connect, nonce: RequestNonce) -> Connect:
    """``connect`` whose targets send their requests with ``nonce`` (a Triton client has one;
    another target, such as a test's stand-in, is left as it is)."""

    def stamped(url: str) -> ServingTarget:
        target = connect(url)
        if hasattr(target, "nonce"):
            setattr(target, "nonce", nonce)  # noqa: B010  # ServingTarget does not declare it
        return target

    return stamped


class Promotion:
    def __init__(
        self,
        settings: Settings,
        env: Environment,
        registry: Registry,
        options: Options,
        connect: Connect | None = None,  # how to reach a target (default: Triton over gRPC)
        scratch: ScratchServers | None = None,  # the dry-run gate's servers (the application's)
    ) -> None:
        self.settings, self.env, self.registry, self.options = settings, env, registry, options
        self.connect = connect or triton_connector(settings, env.key(settings), env.load_deadline(settings))
        self.scratch = scratch
        self.ctx: FleetContext | None = None
        self.interrupted = ""  # a signal that came after record: the rest of the after-record steps skipped

    def run(self, model: str, version: str) -> PromotionResult:
        # this promotion's own requests carry a secret made now: the replay leaves out only those
        ctx = self.ctx = self._context(model, version, RequestNonce())
        try:
            self._sequence(ctx, [Stage("resolve", resolve)], planning=True)
            ctx.deployer, ctx.gate = choose_deployer(self.env), choose_gate(ctx)
            self._sequence(ctx, pipeline(ctx))
        finally:
            ctx.close()
        if not self.options.dry_run and not self.interrupted:
            ctx.result.notes.extend(after_record(ctx))
        ctx.result.notes.extend(ctx.store.session.lock_notes)  # a lock not released: where it was left
        ctx.result.notes.extend(ctx.fleet.recreation_notes())  # a swap that made a served version anew
        ctx.result.notes.extend(n for guard in ctx.fleet.guards for n in guard.notes)  # where not checked
        ctx.result.ok = True
        return ctx.result

    def _context(self, model: str, version: str, nonce: RequestNonce) -> FleetContext:
        env = registered.own_requests(self.env, nonce.prefix)  # each check that leaves its requests out
        targets = resolve_targets(self.settings, env)
        policy, skipped = env.policy, dict[str, str]()
        store = open_store(env.store, digest_cache=self.settings.digest_cache)
        load_timeout = env.load_deadline(self.settings)
        connect = _stamped(self.connect, nonce)
        fleet = Fleet(
            store,
            targets,
            connect,
            load_timeout,
            policy.max_parallel if policy else 1,
            undo=UndoLog(env.gpu, store.session),  # every move and store config noted in it first
            ledger=ledger_recorder.for_fleet(store, env.name, receipt_key=env.receipt_key),
        )
        if policy is not None:  # the live check's connections are the promotion's
            check_fleet(policy, len(targets), f"environment '{env.name}'")
            targets, skipped = reachable(targets, fleet.target, policy.max_unavailable, keep_open=True)
            fleet.only(targets)
        plan = Plan(env, targets, model, version, skipped=skipped)
        ctx = PromotionContext(
            self.settings, env, self.registry, self.options, store, fleet, plan, self.scratch
        )
        fleet.guards[:] = registered.load_guards(ctx)  # each registered guard's part, asked around each load
        return ctx

    def _sequence(self, ctx: FleetContext, stages: list[Stage], planning: bool = False) -> None:
        for stage in stages:
            if stage.live and self.options.dry_run:
                return
            if stage.when is not None and not stage.when(ctx):
                continue
            try:
                self._timed(ctx, stage)
            except BaseException as exc:
                if not planning and not stage.undone and isinstance(exc, KeyboardInterrupt | Terminated):
                    # after record: the promotion happened; the signal ends what is left, said so
                    self.interrupted = exc.signal_name if isinstance(exc, Terminated) else "SIGINT"
                    ctx.result.notes.append(f"promoted; {stage.name} interrupted ({self.interrupted})")
                    return
                if planning or not stage.undone:
                    raise  # nothing changed, nothing to record; or a stage the promotion outlives
                self.on_error(ctx, exc)

    def _timed(self, ctx: FleetContext, stage: Stage) -> None:
        if self.options.on_start is not None:  # e.g. the CLI's progress line (quality: 40 s...)
            self.options.on_start(stage.name)
        began = time.perf_counter()
        try:
            if stage.live:  # the locks' leases renewed; a lock lost (lease ran out) stops it here
                ctx.store.session.renew_leases()
            report = stage.run(ctx)
        except BaseException as exc:
            self._tell(
                ctx,
                StageRecord(stage.name, "failed", time.perf_counter() - began, message_of(exc), by=stage.by),
            )
            raise
        name = "noop" if ctx.noop and stage.name == "resolve" else stage.name  # resolve says no-op
        self._tell(
            ctx, StageRecord(name, "ok", time.perf_counter() - began, report.detail(), report, stage.by)
        )

    def _tell(self, ctx: FleetContext, record: StageRecord) -> None:
        ctx.result.stages.append(record)
        if self.options.on_stage:
            self.options.on_stage(record.stage, record.status, record.seconds, record.detail)

    # -- the one error hook ------------------------------------------------------------------------

    def on_error(self, ctx: FleetContext, exc: BaseException) -> None:
        """Replay the undo log, record the attempt, raise PromotionFailed saying what was undone
        (exit 130 after SIGINT, 143 after SIGTERM; a second signal cannot cut the replay short)."""
        fail(ctx, exc, lambda stage: self._timed(ctx, stage))
