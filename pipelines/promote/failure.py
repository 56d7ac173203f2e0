"""The promotion's one error hook: any exit of a stage after ``resolve`` -- an ``MlregError``, any
other exception, SIGINT, SIGTERM, SIGHUP, SIGQUIT -- replays the undo log (servers, store, archive
and the MLflow aliases and tags), records the attempt in MLflow, and raises ``PromotionFailed``
saying what was put back (exit 130, 143, 129, 131 after the signals).  A second signal cannot cut
the replay short: every one of them is ignored while it runs.

A promotion that lost a lock (its lease ran out and another promotion took it over) touches
nothing any more -- no store write, no server move, no registry write, its undo included: what it
changed now belongs to the lock's new holder.  It says what it left and who holds the lock.
"""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from pipelines.core.context import Stage
from pipelines.core.plan import serving_versions
from pipelines.core.reports import FleetReport, PromotionFailed, Refusal
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import CONFIRM_S, confirm_queued
from pipelines.ledger.mirror import mirror
from pipelines.promote.integrity import verifier
from pipelines.promote.record import record_promotion
from pipelines.promote.verdicts import time_to_safe
from pipelines.storage.disk import disk_full_error, is_disk_full
from registry.errors import INTERRUPT_EXIT_CODES, MlregError, PromotionError, Terminated
from registry.settings import PROMOTIONS_EXPERIMENT

Timed = Callable[[Stage], None]  # runs a stage, recorded in the result (the runner's)


def message_of(exc: BaseException) -> str:
    error = known(exc)
    return error.message if isinstance(error, MlregError) else f"{type(exc).__name__}: {exc}"


def known(exc: BaseException) -> BaseException:
    """``exc``, or the error it stands for: a full disk met outside the store's own calls (the
    promotion's work folder in TMPDIR, a copy of the registry's files) is "disk full at PATH"."""
    if isinstance(exc, MlregError) or not is_disk_full(exc):
        return exc
    full = disk_full_error(exc, "a file could not be written", Path(tempfile.gettempdir()))
    full.__cause__ = exc
    return full


def fail(ctx: FleetContext, exc: BaseException, timed: Timed) -> NoReturn:
    detected = time.time()  # the failing check decided and raised: the time to safe starts here
    exc = known(exc)
    result = ctx.result
    signal_name = _signal_of(exc)
    result.error = f"interrupted ({signal_name})" if signal_name else message_of(exc)
    touched, changed = ctx.undo.replicas, ctx.undo.changed
    sent = _sent(ctx)
    with signals_held():
        lost = _taken_over(ctx) if changed else []
        if lost:
            _fenced(ctx, exc, lost, signal_name, sent)
        if changed:
            try:
                timed(Stage("rollback", _rollback))
                result.rollback = "succeeded"
            except BaseException as failure:  # recorded and reported below, never swallowed
                result.rollback_error = message_of(failure)
                result.rollback = "failed"
            confirm_queued(ctx.fleet, CONFIRM_S, f"mlreg status --env {ctx.env.name}")  # checked, bounded
            result.time_to_safe = time_to_safe(detected, touched, ctx.fleet.restored)
            result.notes.extend(ctx.fleet.pending.values())  # restores queued behind a late load
            result.notes.extend(
                f"{url} dropped during the promotion and came back (a restart): waited for, then put back"
                for url in ctx.fleet.restarted
                if url not in ctx.fleet.gone
            )
        if isinstance(exc, Refusal):  # its own changes put back: nothing changed, it refused
            result.error = exc.after_undo(changed and not result.rollback_error)
            changed = bool(result.rollback_error)
        result.rolled_back = changed and not result.rollback_error
        _record(ctx)
        if result.rollback_error:
            result.notes.extend(_store_now(ctx))
        ctx.locks.close()  # released now: a release that fails is a note, never this error
        result.notes.extend(ctx.store.session.lock_notes)
    failed = _failure(ctx, exc, touched)
    if signal_name:
        failed.exit_code = INTERRUPT_EXIT_CODES[signal_name]
    raise failed from exc


def _record(ctx: FleetContext) -> None:
    """The attempt recorded in MLflow, as far as it can be: a file it cannot write (its report in
    a full TMPDIR) is a note, never the promotion's error (what was put back must still be said,
    and the locks released)."""
    try:
        record_promotion(ctx.registry, ctx.result, ctx.env, PROMOTIONS_EXPERIMENT)
        ctx.result.notes.extend(
            mirror(ctx.registry.runs, ctx.result.run_id, ctx.fleet.ledger)
        )  # ledger.jsonl
    except OSError as exc:
        ctx.result.notes.append(f"the attempt was not recorded in MLflow ({exc.strerror or exc})")


def _taken_over(ctx: FleetContext) -> list[str]:
    """The locks this promotion lost to time or to another holder.  A store that cannot be reached
    right now proves nothing either way: its lease is then not used for any store write (the store
    fences them), but while its end has not come no one else can hold the lock, so the servers are
    still put back."""
    return ctx.store.session.fenced(proven_only=True)


def _sent(ctx: FleetContext) -> tuple[int, int]:
    """What the promotion has sent so far: its server moves (the fleet's roll-outs) and the store
    keys it wrote or deleted (the store's change journal)."""
    return len(ctx.fleet.rollouts), len(ctx.store.session.changed_keys)


def _fenced(
    ctx: FleetContext, exc: BaseException, lost: list[str], signal_name: str, sent: tuple[int, int]
) -> NoReturn:
    """Another promotion owns the models now: nothing is put back (that would undo its work).  The
    sentence is derived from what was sent since the failure (nothing, unless a bug sent it)."""
    changed = ", ".join(ctx.undo.replicas) or "no replica"
    ctx.locks.close()  # a lost lock is not deleted: the release checks its holder first
    moves, keys = (now - then for now, then in zip(_sent(ctx), sent, strict=True))
    said = (
        "so nothing was put back"
        if not (moves or keys)
        else f"yet {moves} server move(s) and {keys} store write(s) were sent after the failure"
    )
    notes = "".join(f"; {note}" for note in ctx.store.session.lock_notes)
    plan = ctx.plan
    failed = PromotionFailed(
        f"promotion of {plan.model} version {plan.version} to '{ctx.env.name}' failed: "
        f"{ctx.result.error}; it lost its lock, {said} ({'; '.join(lost)}); "
        f"what it had changed is left to the lock's new holder (replicas sent a change: "
        f"{changed}){notes}",
        fix="run 'mlreg status' to see what serves now; promote again once the other promotion is done",
        result=ctx.result,
    )
    if signal_name:
        failed.exit_code = INTERRUPT_EXIT_CODES[signal_name]
    raise failed from exc


def _failure(ctx: FleetContext, exc: BaseException, touched: list[str]) -> PromotionFailed:
    result = ctx.result
    head = f"promotion of {ctx.plan.model} version {ctx.plan.version} to '{ctx.env.name}' failed: "
    notes = "".join(f"; {note}" for note in result.notes)
    if result.rollback_error:
        stage = f" (stage '{result.failed_stage}')" if result.failed_stage else ""
        return PromotionFailed(
            head + f"{result.error}{stage}; the rollback failed too: {result.rollback_error}{notes}",
            fix="run 'mlreg status' to see what serves, then promote the version you want (a rerun "
            "takes over a lock its holder left)",
            result=result,
        )
    tail = "; nothing was changed"
    if result.rolled_back:
        restored = result.stages[-1].detail if result.stages else ""
        back = _replicas_back(touched, ctx.plan.targets)
        tail = f"{back}; rolled back, the previous versions serve ({restored})"
    fix = exc.fix if isinstance(exc, MlregError) and exc.fix else "read the stage report"
    return PromotionFailed(
        head + result.error + tail + notes, fix=fix + _alias_note(result.failed_stage), result=result
    )


def _alias_note(stage: str | None) -> str:
    """Before ``record`` no alias moved; in ``record`` the rollback's report says what went back."""
    return "" if stage == "record" else "; the MLflow alias was not moved"


def _store_now(ctx: FleetContext) -> list[str]:
    """What the store's config of each model this promotion wrote lists now (read again)."""
    lines = []
    for model, written in sorted(ctx.store.session.written_configs.items()):
        try:
            text = ctx.store.read_config(model)
        except MlregError as exc:
            last = ",".join(serving_versions(written))
            lines.append(
                f"the store's config of {model} could not be read now ({exc.message}); "
                f"the last config this promotion wrote there lists v{last}"
            )
            continue
        listed = ",".join(serving_versions(text)) if text else "nothing"
        lines.append(f"the store's config of {model} lists v{listed}")
    return lines


def _rollback(ctx: FleetContext) -> FleetReport:
    first = len(ctx.fleet.rollouts)
    digests = {(s.model, v): d for s in ctx.plan.steps for v, d in s.previous_digests.items()}
    verify = verifier(ctx.store, digests, ctx.env.signatures, ctx.registry, ctx.plan.workdir)
    report = ctx.undo.replay(ctx.fleet, ctx.store, verify)
    if not report.ok:
        raise PromotionError(
            f"{'; '.join(report.failed)} (not put back; a replica that restarts reads the store)",
            fix="bring the replica back, then run 'mlreg status'",
        )
    return FleetReport("restored " + ", ".join(report.restored), ctx.fleet.rollouts[first:])


def _replicas_back(touched: list[str], targets: tuple[str, ...]) -> str:
    """On a fleet: which replicas were put back, and that the others never loaded the version."""
    if len(targets) < 2 or not touched:
        return ""
    if set(targets) <= set(touched):
        return "; every touched replica is back on the store's config"
    return (
        f"; rolled back on {', '.join(touched)}, the other replicas never loaded it"
        "; every touched replica is back on the store's config"
    )


def _signal_of(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    return exc.signal_name if isinstance(exc, Terminated) else ""


HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM, SIGHUP and SIGQUIT ignored while the undo log replays (main thread only:
    where Python delivers them); restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in HELD}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
