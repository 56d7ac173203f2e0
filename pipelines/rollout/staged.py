"""The staged deployer: canary, bake on Triton's own metrics, waves in parallel.

Triton re-reads an ensemble's members from the repository whenever the ensemble loads, so an
ensemble pinned to a member version only one replica's override has loaded cannot load.  So, per
replica and within its wave, every re-pointed ensemble first follows the latest loaded version of
the changing members (-1, a config override: the store is not touched and the replicas not yet
told to move keep their pins), then the members move (override too; models new to the store are
written first: no replica serves them).  Once the whole fleet has moved, the configs are written to
the store and every replica loads the ensembles pinned to the new versions.

Every move is noted in the promotion's undo log first; a failed wave or a tripped bake raises, and
the runner's replay puts every touched replica back (the store never had these configs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from pipelines.checks.golden import golden_inputs, output_names
from pipelines.core.check import LoadRefused
from pipelines.core.plan import Step, desired_config, follow_latest
from pipelines.core.policy import Policy, Verdict, judge, waves_of
from pipelines.core.reports import FleetReport
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import Change, Fleet, Rollout, checkpoint
from pipelines.fleet.restarts import RestartWatch
from pipelines.rollout.probes import Probes, Target, with_probes
from pipelines.triton import metrics
from registry.errors import MlregError, PromotionError, TritonError

Scrape = Callable[[str], metrics.Snapshot]


@dataclass(frozen=True)
class Move:
    """One model's change on each replica, and the old versions its bake compares with."""

    step: Step
    change: Change
    baked_old: tuple[str, ...] = ()


def moves_of(steps: Sequence[Step], gpu: bool) -> list[Move]:
    """Each replica swaps straight to the new version (Triton serves the old one until the new one
    is READY; the ensembles over it follow the latest version by then): no second load."""
    moves = []
    for step in steps:
        old = () if step.is_ensemble else tuple(v for v in step.previous_versions if v != step.version)
        text = desired_config(step.config_text, [step.version], gpu)
        moves.append(Move(step, Change(step.model, text, (step.version,)), old))
    return moves


def following_latest(ensembles: Sequence[Step], members: Sequence[Step], gpu: bool) -> list[Move]:
    """Each re-pointed ensemble on its old config, following the latest loaded version (-1) of
    every changing member: sent to a replica before its members move, it serves whatever the
    replica has, old then new, with no failed request."""
    changing = [m.model for m in members if not m.is_ensemble and m.previous_config is not None]
    moves = []
    for step in ensembles:
        assert step.previous_config is not None
        versions = step.previous_versions or [step.version]
        text = follow_latest(step.previous_config, versions, gpu, changing)
        moves.append(Move(step, Change(step.model, text, tuple(versions))))
    return moves


class StagedRollout:
    """Moves ``moves`` over ``targets`` wave by wave (each move tells the undo log first, through
    ``Fleet.move``)."""

    def __init__(
        self,
        targets: Sequence[str],
        fleet: Fleet,
        policy: Policy,
        scrape: Scrape | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.targets = list(targets)
        self.fleet = fleet
        self.policy = policy
        self.scrape = scrape or (lambda url: metrics.scrape(policy.metrics_url(url)))
        self.sleep = sleep
        self.moved: list[str] = []
        self.results: dict[str, Rollout] = {}
        self.verdicts: list[Verdict] = []
        self.skipped: dict[str, str] = {}  # url -> why: refused before its first load, left out
        self.may_skip = 0  # how many more replicas max_unavailable lets this roll-out leave out
        self.probes: Probes | None = None  # mlreg's own requests during each bake (probes.py)
        self.returning = False  # a rollback (Options.rollback): the version it returns to served before
        self.notes: list[str] = []  # what a bake judged besides the clients' requests
        self.tell: Callable[[str], None] = lambda text: None  # progress: each wave and bake as it starts
        self._skipping = threading.Lock()
        self.watch = RestartWatch(fleet)  # a replica that restarts mid-roll-out (restarts.py)

    def run(self, moves: list[Move]) -> list[Rollout]:
        self.results = {m.change.model: Rollout(m.change.model, list(m.change.versions)) for m in moves}
        waves = waves_of(self.targets, self.policy)
        bakes = self.policy.bake_seconds > 0 and any(m.baked_old for m in moves)
        baseline = self._scrape_all(self.targets) if bakes else {}
        for index, wave in enumerate(waves):
            if index:  # the replicas moved in earlier waves still hold it (or restarted: moved again)
                self.watch.check([u for u in self.moved if u not in self.skipped], moves)
            self.tell(f"wave {index + 1} of {len(waves)} ({len(wave)} replica(s))")
            try:
                self._wave(wave, moves)
            except MlregError as exc:
                raise PromotionError(
                    f"wave {index + 1} of {len(waves)} failed: {exc.message}",
                    fix="read the stage report; fix or replace the replica named, then promote again",
                ) from exc
            checkpoint(f"wave:{index + 1}")
            if index + 1 < len(waves) and bakes:
                self.tell(f"baking after wave {index + 1} of {len(waves)} ({self.policy.bake_seconds:g} s)")
                self._bake(moves, baseline, f"the bake after wave {index + 1} of {len(waves)}")
        self.watch.check([u for u in self.moved if u not in self.skipped], moves)  # after the last wave
        return list(self.results.values())

    def _wave(self, wave: list[str], moves: list[Move]) -> None:
        self.moved.extend(wave)
        workers = min(self.policy.max_parallel, len(wave))
        if workers <= 1:
            for url in wave:
                self._on_replica(url, moves)
            return
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(self._on_replica, url, moves) for url in wave]:
                future.result()

    def _on_replica(self, url: str, moves: list[Move]) -> None:
        done: list[Move] = []
        for move in moves:  # Fleet.move tells the undo log the replica's before-state
            try:
                self.fleet.move(url, move.change, self.results[move.change.model])
            except MlregError as exc:
                # refused before the load (no headroom) or a load that failed (Triton kept serving the
                # old version): before any member moved there, the replica is left out as it serves
                skippable = all(m.step.is_ensemble for m in done) and _unavailable(exc)
                if skippable and self._skip(url, exc.message):
                    self._put_back(url)  # as it served: counted against max_unavailable
                    return
                raise
            done.append(move)

    def _put_back(self, url: str) -> None:
        """A skipped replica back to what it served before this promotion touched it (the undo
        log's before-state: the ensembles told to follow the latest member pinned again, the member
        whose load failed sent its earlier config), and no longer the undo log's to put back."""
        why = self.fleet.release(url)
        if why:
            raise PromotionError(f"{url} could not be left out as it served: {why}")

    def _skip(self, url: str, why: str) -> bool:
        """Leave ``url`` out of the roll-out (never the canary) while max_unavailable allows."""
        with self._skipping:
            if url in waves_of(self.targets, self.policy)[0] or len(self.skipped) >= self.may_skip:
                return False
            self.skipped[url] = why
            return True

    def _scrape_all(self, urls: Sequence[str]) -> dict[str, metrics.Snapshot]:
        def scrape(url: str) -> metrics.Snapshot | MlregError:
            try:
                return self.scrape(url)
            except MlregError as exc:
                return exc

        with ThreadPoolExecutor(max(1, min(8, len(urls)))) as pool:
            found = dict(zip(urls, pool.map(scrape, urls), strict=True))
        snapshots = {}
        for url, snapshot in found.items():
            if isinstance(snapshot, MlregError):
                raise PromotionError(f"replica {url}: {snapshot.message}", fix=snapshot.fix)
            snapshots[url] = snapshot
        return snapshots

    def _bake(self, moves: list[Move], baseline: dict[str, metrics.Snapshot], when: str) -> None:
        before, after = self._bake_window(when)
        for url, move in ((u, m) for u in self.targets for m in moves if m.baked_old):
            self._check_counters(url, move, (baseline.get(url, {}), before[url], after[url]), when)
        deltas = {u: metrics.window(before[u], after[u]) for u in self.targets}
        for move in moves:
            if move.baked_old:
                self._judge(move, deltas, baseline, when)

    def _bake_window(self, when: str) -> tuple[dict[str, metrics.Snapshot], dict[str, metrics.Snapshot]]:
        """Every replica scraped, the bake waited out (probing, where it probes), scraped again."""
        try:
            before = self._scrape_all(self.targets)
            if self.probes is not None:  # mlreg's own requests while it waits (probes.py)
                others = [u for u in self.targets if u not in self.moved]
                moved = [u for u in self.moved if u not in self.skipped]  # a skipped one never loaded it
                self.probes.run(self.policy.bake_seconds, moved, others, self.sleep)
            else:
                self.sleep(self.policy.bake_seconds)
            return before, self._scrape_all(self.targets)
        except MlregError as exc:
            raise PromotionError(
                f"{when} failed: {exc.message}",
                fix="bring the replica back (its metrics port must answer), then promote again",
            ) from exc

    def _check_counters(
        self,
        url: str,
        move: Move,
        scrapes: tuple[metrics.Snapshot, metrics.Snapshot, metrics.Snapshot],
        when: str,
    ) -> None:
        """Raise when replica ``url``'s counters (baseline, before, after the bake) cannot judge
        ``move``: a NaN would pass every threshold, so the bake fails."""
        model, versions = move.change.model, {*move.change.versions, *move.baked_old}
        found = [f for scrape in scrapes for f in metrics.faults(model, versions, scrape)]
        # a counter going down is a restart only for a version loaded through the window: on a
        # moved replica the old version unloads (its series ends), on the others the new one never loads
        steady = set(move.change.versions) if url in self.moved else set(move.baked_old)
        found += metrics.faults(model, steady, scrapes[1], scrapes[2])
        if found:
            raise PromotionError(
                f"{when} failed: replica {url}: {metrics.summary(found)}",
                fix=f"make {self.policy.metrics_url(url)} answer Triton's own counters "
                "(metrics_port or metrics in the environment's mlreg.toml section); after a "
                "restart, let the replica serve again, then promote again",
            )

    def _judge(
        self,
        move: Move,
        deltas: dict[str, metrics.Snapshot],
        baseline: dict[str, metrics.Snapshot],
        when: str,
    ) -> None:
        model, old_versions = move.change.model, set(move.baked_old)
        new_versions = set(move.change.versions) - old_versions
        others = [u for u in self.targets if u not in self.moved]
        new = metrics.total([deltas[u] for u in self.moved], model, new_versions)
        old = metrics.total([deltas[u] for u in others], model, old_versions)
        if self.probes is not None:  # the probes' requests out of Triton's counts, their own in
            new = self._new_side(model, new, new_versions)
            old = with_probes(old, self.probes.counted(model, "old"))
        if not old.requests:  # no untouched replica had traffic: the old version before the swap
            before = metrics.total([baseline[u] for u in self.moved], model, old_versions)
            old = replace(before, probe_ok=old.probe_ok, probe_failed=old.probe_failed)
        verdict = judge(old, new, self.policy)
        self.verdicts.append(verdict)
        if not verdict.ok and self.returning:  # the version returned to: not a model to fix
            back = ",".join(sorted(new_versions))
            raise PromotionError(
                f"{when} tripped on {model} v{back}, the version this rollback returns to "
                f"({verdict.metric}): {verdict.detail}",
                fix=f"{model} v{back} served before but did not bake well now: read why above (a "
                f"replica, its inputs, the store's bytes); return to another version ('mlreg rollback "
                f"{model} --to-version N', 'mlreg history {model}' lists them) or promote a fixed one; "
                "the alias was not moved",
            )
        if not verdict.ok:
            raise PromotionError(
                f"{when} tripped on {model} v{','.join(sorted(new_versions))} ({verdict.metric}): "
                f"{verdict.detail}",
                fix="fix the model and register a new version; the alias was not moved",
            )

    def _new_side(self, model: str, counted: metrics.Counters, versions: set[str]) -> metrics.Counters:
        """The new version's counts without the probes' requests -- unless this is a rollback whose
        clients were quiet (fewer requests than the bake's minimum): the version it returns to then
        bakes on mlreg's own probe requests, as Triton counted them (their latency and failures)."""
        assert self.probes is not None
        side = self.probes.counted(model, "new")
        clients = with_probes(counted, side)
        probes = side.ok + side.failed
        if not self.returning or not probes or clients.requests >= min_requests(self.policy):
            return clients
        self.notes.append(
            f"{model} v{','.join(sorted(versions))}: clients sent {clients.requests:.0f} request(s) "
            f"during the bake; this rollback's bake judged mlreg's own {probes} probe request(s) instead"
        )
        return replace(counted, probe_ok=side.ok, probe_failed=side.failed)


def min_requests(policy: Policy) -> float:
    """The fewest requests the policy's bake asks of the new version (0: none)."""
    return max((c.min for c in policy.checks if c.metric == "requests" and c.min is not None), default=0.0)


def _unavailable(exc: MlregError) -> bool:
    """A replica that may be left out under max_unavailable: a load guard refused the load before
    anything was sent (``LoadRefused``: no headroom), or its load failed there (not a missing key,
    which every replica would refuse, nor a load still running)."""
    status = exc.context.get("status")
    return isinstance(exc, LoadRefused) or (
        isinstance(exc, TritonError) and status not in ("unauthorised", "load-deadline")
    )


def _leave_out(ctx: FleetContext, skipped: dict[str, str]) -> None:
    """The replicas the roll-out skipped (short of memory) leave the plan: each is left as it
    serves, and named in every report."""
    if skipped:
        ctx.plan.skipped.update(skipped)
        ctx.plan.targets = tuple(t for t in ctx.plan.targets if t not in skipped)
        ctx.fleet.only(ctx.plan.targets)


def _pin_new(ctx: FleetContext, repointed: list[Step]) -> None:
    """Each re-pointed ensemble, once its members moved everywhere, pinned to their new versions."""
    for step in repointed:
        text = desired_config(step.config_text, [step.version], ctx.env.gpu)
        ctx.fleet.apply(Change(step.model, text, (step.version,)))


@dataclass(frozen=True)
class Staged:
    policy: Policy
    scrape: Scrape | None = None
    sleep: Callable[[float], None] = field(default=time.sleep)
    name: str = "staged"

    def deploy(self, ctx: FleetContext) -> FleetReport:
        plan, fleet, gpu = ctx.plan, ctx.fleet, ctx.env.gpu
        steps = [s for s in plan.steps if not s.noop]
        repointed = [s for s in steps if s.is_ensemble and s.previous_config is not None]
        moving = [s for s in steps if s not in repointed]
        moves = moves_of(moving, gpu)
        for move in moves:
            if move.step.previous_config is None:  # new to the store: no replica serves it yet
                self._write(ctx, move)
        rollout = self._rollout(ctx, moves)
        fleet.rollouts.extend(rollout.run(following_latest(repointed, moving, gpu) + moves))
        ctx.result.notes.extend(rollout.watch.notes + rollout.notes)
        _leave_out(ctx, rollout.skipped)
        for move in moves:
            self._write(ctx, move)
        _pin_new(ctx, repointed)
        return self._report(ctx, steps, rollout)

    def _rollout(self, ctx: FleetContext, moves: list[Move]) -> StagedRollout:
        plan = ctx.plan
        rollout = StagedRollout(plan.targets, ctx.fleet, self.policy, self.scrape, self.sleep)
        rollout.may_skip = max(0, self.policy.max_unavailable - len(plan.skipped))
        rollout.probes = self._probes(ctx, moves)
        rollout.returning = ctx.options.rollback
        rollout.verdicts = ctx.result.bakes  # every bake's judgement, kept on any exit (promote/verdicts.py)
        told = ctx.options.on_start
        if told is not None:  # the CLI's progress line, on a terminal only: each wave and bake
            rollout.tell = lambda text: told(f"deploy: {text}")
        return rollout

    def _report(self, ctx: FleetContext, steps: list[Step], rollout: StagedRollout) -> FleetReport:
        plan = ctx.plan
        baked = "; ".join(f"bake ok: {v.detail}" for v in rollout.verdicts)
        summary = ", ".join(f"{s.model} v{s.version}" for s in steps)
        waves = len(waves_of(plan.targets, self.policy))
        return FleetReport(
            f"{summary} over {len(plan.targets)} replica(s) in {waves} wave(s)"
            + (f"; {baked}" if baked else ""),
            ctx.fleet.rollouts,
            dict(plan.skipped),
        )

    def _probes(self, ctx: FleetContext, moves: list[Move]) -> Probes | None:
        """The bake's own requests (probes.py): the captured inputs the shadow replay read, else
        the golden inputs, to each model that bakes."""
        if self.policy.probe_rate <= 0 or self.policy.bake_seconds <= 0:
            return None
        captured = ctx.checked.captured if ctx.checked is not None else {}
        targets = []
        for move in (m for m in moves if m.baked_old):
            step = move.step
            try:
                inputs = captured.get(step.model) or [
                    golden_inputs(ctx.settings, step.model, step.config_text)
                ]
                names = output_names(step.config_text)
            except (MlregError, ValueError, TypeError):
                continue  # no inputs to send: Triton's counters alone judge this model
            targets.append(Target(step.model, inputs, names, step.version, move.baked_old[-1]))
        return Probes(ctx.fleet.connect, self.policy.probe_rate, targets)

    @staticmethod
    def _write(ctx: FleetContext, move: Move) -> None:
        ctx.fleet.write_config(move.change.model, move.change.config or "")  # noted in the undo log first

    def finalize(self, ctx: FleetContext) -> FleetReport:
        """Each replica swapped straight to the new version in its wave: nothing left to retire."""
        retired = [
            f"{s.model} v{','.join(old)} (in its wave)"
            for s in ctx.plan.steps
            if not s.is_ensemble and (old := [v for v in s.previous_versions if v != s.version])
        ]
        return FleetReport("retired " + (", ".join(retired) or "nothing"))
