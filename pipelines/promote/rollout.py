"""Fleet roll-out: canary, bake on Triton's own metrics, waves in parallel, automatic abort.

An environment of ``mlreg.toml`` may declare a policy:

[environments.production]
store = "s3://models/production"
discover = "dns:triton-headless.models.svc.cluster.local:8001"   # or targets = [...]
canary = 1              # replicas (an integer) or a share ("10%")
waves = [50, 100]       # cumulative percent of the fleet after the canary
bake_seconds = 60       # after each wave but the last: the new version's metrics are judged
max_parallel = 4        # replicas changed at once within a wave
max_unavailable = 0     # unreachable replicas tolerated (skipped); more refuse the promotion
max_failure_ratio = 0.01  # new failure ratio may exceed the old one by at most this
max_latency_ratio = 2.0   # new mean latency at most this times the old one
min_requests = 10       # the new version must have answered this many requests in a bake
metrics_port = 8002     # Triton's metrics port on every replica (or metrics = {target = url})

Per replica, the new configs are sent with Triton's load API ``config`` override, so the
store's config stays the fleet's desired state until every replica has moved; then it is
written.  An abort sends every touched replica the store's config again (the old state, as an
override too: Triton keeps an override over an unchanged file) and raises PromotionError naming
the metric and its numbers; the store and the alias are left alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipelines.promote import metrics
from pipelines.promote.fanout import Rollout, TargetResult, checkpoint
from pipelines.promote.ports import ServingTarget
from registry.contracts.config import config_json
from registry.errors import MlregError, PromotionError, UsageError

if TYPE_CHECKING:
    from pipelines.promote.reports import FleetReport

KEYS = {
    "canary",
    "waves",
    "bake_seconds",
    "max_parallel",
    "max_unavailable",
    "max_failure_ratio",
    "max_latency_ratio",
    "min_requests",
    "metrics_port",
    "metrics",
}


@dataclass(frozen=True)
class Policy:
    canary: int | float = 1  # int: replicas; float: percent of the fleet
    waves: tuple[float, ...] = (100.0,)
    bake_seconds: float = 0.0
    max_parallel: int = 1
    max_unavailable: int = 0
    max_failure_ratio: float = 0.01
    max_latency_ratio: float = 2.0
    min_requests: int = 10
    metrics_port: int = 8002
    metrics: tuple[tuple[str, str], ...] = ()  # target -> metrics URL

    def metrics_url(self, target: str) -> str:
        explicit = dict(self.metrics).get(target)
        if explicit:
            return explicit
        host = target.rsplit(":", 1)[0]
        return f"http://{host}:{self.metrics_port}/metrics"


# -- parsing -----------------------------------------------------------------------------------


def parse_policy(where: str, raw: Mapping[str, Any]) -> Policy | None:
    """The rollout policy of one environment section (None when it declares none)."""
    if not KEYS & set(raw):
        return None
    fix = (
        "write e.g. canary = 1, waves = [25, 100], bake_seconds = 60, max_parallel = 4, "
        "max_unavailable = 0, max_failure_ratio = 0.01, max_latency_ratio = 2.0"
    )
    try:
        policy = Policy(
            canary=_canary(raw.get("canary", 1)),
            waves=tuple(_number(w, "waves") for w in _list(raw.get("waves", [100]), "waves")),
            bake_seconds=_number(raw.get("bake_seconds", 0), "bake_seconds"),
            max_parallel=_integer(raw.get("max_parallel", 1), "max_parallel", 1),
            max_unavailable=_integer(raw.get("max_unavailable", 0), "max_unavailable", 0),
            max_failure_ratio=_number(raw.get("max_failure_ratio", 0.01), "max_failure_ratio"),
            max_latency_ratio=_number(raw.get("max_latency_ratio", 2.0), "max_latency_ratio"),
            min_requests=_integer(raw.get("min_requests", 10), "min_requests", 0),
            metrics_port=_integer(raw.get("metrics_port", 8002), "metrics_port", 1),
            metrics=tuple(sorted(_table(raw.get("metrics", {})).items())),
        )
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", fix=fix) from exc
    _check(policy, where, fix)
    return policy


def _check(policy: Policy, where: str, fix: str) -> None:
    waves = list(policy.waves)
    if not waves or waves != sorted(set(waves)) or waves[0] <= 0 or waves[-1] != 100:
        raise UsageError(
            f"{where}: waves = {waves}: percents must rise strictly and end at 100",
            fix="e.g. waves = [25, 100]",
        )
    if not 0 <= policy.max_failure_ratio <= 1:
        raise UsageError(f"{where}: max_failure_ratio must be within 0..1", fix=fix)
    if policy.max_latency_ratio < 1:
        raise UsageError(f"{where}: max_latency_ratio must be >= 1 (1.5 = 50% slower allowed)", fix=fix)
    if isinstance(policy.canary, float) and not 0 < policy.canary <= 100:
        raise UsageError(f"{where}: canary percent must be within 0..100", fix=fix)


def _canary(raw: object) -> int | float:
    if isinstance(raw, str) and raw.strip().endswith("%"):
        return _number(raw.strip()[:-1], "canary")
    return _integer(raw, 'canary (a count, or a percent such as "10%")', 1)


def _number(raw: object, name: str) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"{name} must be a number, not {raw!r}")
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {raw!r}") from None
    if value < 0 or math.isnan(value):
        raise ValueError(f"{name} must not be negative, not {raw!r}")
    return value


def _integer(raw: object, name: str, least: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {raw!r}")
    return raw


def _list(raw: object, name: str) -> list[object]:
    if not isinstance(raw, list):
        raise ValueError(f"{name} must be a list such as [25, 100], not {raw!r}")
    return raw


def _table(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError(f'metrics must be a table of target = "http://host:8002/metrics", not {raw!r}')
    return dict(raw)


# -- pure logic --------------------------------------------------------------------------------


def waves_of(targets: Sequence[str], policy: Policy) -> list[list[str]]:
    """The canary replicas, then each wave's newly moved replicas (cumulative percents)."""
    n = len(targets)
    if n == 0:
        return []
    if isinstance(policy.canary, float):
        canary = math.ceil(n * policy.canary / 100)
    else:
        canary = policy.canary
    bounds = [min(n, max(1, canary))]
    for percent in policy.waves:
        bound = min(n, math.ceil(n * percent / 100 - 1e-9))
        if bound > bounds[-1]:
            bounds.append(bound)
    if bounds[-1] != n:
        bounds.append(n)
    starts = [0, *bounds[:-1]]
    return [list(targets[a:b]) for a, b in zip(starts, bounds, strict=True)]


@dataclass
class Verdict:
    ok: bool
    metric: str = ""
    detail: str = ""
    old: metrics.Counters = field(default_factory=metrics.Counters)
    new: metrics.Counters = field(default_factory=metrics.Counters)


def judge(old: metrics.Counters, new: metrics.Counters, policy: Policy) -> Verdict:
    """The new version against the one it replaces, by the policy's thresholds."""
    if new.requests < policy.min_requests:
        return Verdict(
            False,
            "requests",
            f"the new version answered {new.requests:.0f} request(s) during the bake, "
            f"fewer than min_requests = {policy.min_requests}",
            old,
            new,
        )
    allowed = old.failure_ratio + policy.max_failure_ratio
    if new.failure_ratio > allowed:
        return Verdict(
            False,
            "failure_ratio",
            f"failure ratio {new.failure_ratio:.3f} ({new.failure:.0f} of {new.requests:.0f} requests) "
            f"against {old.failure_ratio:.3f} for the old version ({old.failure:.0f} of "
            f"{old.requests:.0f}); max_failure_ratio = {policy.max_failure_ratio}",
            old,
            new,
        )
    if old.requests and new.mean_latency_us > old.mean_latency_us * policy.max_latency_ratio:
        return Verdict(
            False,
            "latency_ratio",
            f"mean latency {new.mean_latency_us:.0f} us against {old.mean_latency_us:.0f} us for the old "
            f"version (x{new.mean_latency_us / max(old.mean_latency_us, 1e-9):.2f}); "
            f"max_latency_ratio = {policy.max_latency_ratio}",
            old,
            new,
        )
    return Verdict(
        True, "", f"failure ratio {new.failure_ratio:.3f} over {new.requests:.0f} requests", old, new
    )


# -- the roll-out ------------------------------------------------------------------------------


@dataclass
class Change:
    """One model's new config on a replica, and the versions that must be READY after it."""

    model: str
    config_text: str
    versions: list[str]
    baked_old: list[str] = field(default_factory=list)  # old versions to compare with ([]: no bake)
    restore_text: str | None = None  # the store's config before (an abort sends it; None: unload)


Scrape = Callable[[str], metrics.Snapshot]


class StagedRollout:
    """Moves ``changes`` over ``targets`` wave by wave; ``target(url)`` opens a replica."""

    def __init__(
        self,
        targets: Sequence[str],
        target: Callable[[str], ServingTarget],
        policy: Policy,
        load_timeout: float,
        scrape: Scrape | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.targets = list(targets)
        self.target = target
        self.policy = policy
        self.load_timeout = load_timeout
        self.scrape = scrape or (lambda url: metrics.scrape(policy.metrics_url(url)))
        self.sleep = sleep
        self.touched: list[str] = []
        self.results: dict[str, Rollout] = {}
        self.verdicts: list[Verdict] = []

    def run(self, changes: list[Change]) -> list[Rollout]:
        self.results = {c.model: Rollout(c.model, c.versions) for c in changes}
        waves = waves_of(self.targets, self.policy)
        baseline = self._scrape_all(self.targets) if self._bakes(changes) else {}
        for index, wave in enumerate(waves):
            try:
                self._move(wave, changes)
            except MlregError as exc:
                undone = self._undo(changes)
                raise PromotionError(
                    f"wave {index + 1} of {len(waves)} failed: {exc.message}; {undone}",
                    fix="read the stage report; fix or replace the replica named, then promote again",
                ) from exc
            checkpoint(f"wave:{index + 1}")
            if index + 1 < len(waves) and self._bakes(changes):
                self._bake(changes, baseline, index + 1, len(waves))
        return list(self.results.values())

    def _bakes(self, changes: list[Change]) -> bool:
        return self.policy.bake_seconds > 0 and any(c.baked_old for c in changes)

    def _move(self, wave: list[str], changes: list[Change]) -> None:
        self.touched.extend(wave)
        workers = min(self.policy.max_parallel, len(wave))
        if workers <= 1:
            for url in wave:
                self._on_replica(url, changes)
            return
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(self._on_replica, url, changes) for url in wave]:
                future.result()

    def _on_replica(self, url: str, changes: list[Change]) -> None:
        for change in changes:
            began = time.perf_counter()
            try:
                replica = self.target(url)
                replica.load(change.model, config=config_json(change.config_text))
                for version in change.versions:
                    replica.wait_ready(change.model, version, timeout=self.load_timeout)
            except MlregError as exc:
                self.results[change.model].targets.append(
                    TargetResult(url, False, time.perf_counter() - began, exc.message)
                )
                raise
            self.results[change.model].targets.append(TargetResult(url, True, time.perf_counter() - began))

    def _scrape_all(self, urls: Sequence[str]) -> dict[str, metrics.Snapshot]:
        def scrape(url: str) -> metrics.Snapshot | MlregError:
            try:
                return self.scrape(url)
            except MlregError as exc:
                return exc

        with ThreadPoolExecutor(max(1, min(8, len(urls)))) as pool:
            found = dict(zip(urls, pool.map(scrape, urls), strict=True))
        for url, snapshot in found.items():
            if isinstance(snapshot, MlregError):
                raise PromotionError(f"replica {url}: {snapshot.message}", fix=snapshot.fix)
        return found  # type: ignore[return-value]

    def _bake(
        self, changes: list[Change], baseline: dict[str, metrics.Snapshot], wave: int, waves: int
    ) -> None:
        moved = list(self.touched)
        others = [u for u in self.targets if u not in moved]
        try:
            before = self._scrape_all(self.targets)
            self.sleep(self.policy.bake_seconds)
            after = self._scrape_all(self.targets)
        except MlregError as exc:
            undone = self._undo(changes)
            raise PromotionError(
                f"the bake after wave {wave} of {waves} failed: {exc.message}; {undone}",
                fix="bring the replica back (its metrics port must answer), then promote again",
            ) from exc
        for change in changes:
            if not change.baked_old:
                continue
            new_versions = set(change.versions) - set(change.baked_old)
            deltas = {u: metrics.window(before[u], after[u]) for u in self.targets}
            new = metrics.total([deltas[u] for u in moved], change.model, new_versions)
            old = metrics.total([deltas[u] for u in others], change.model, set(change.baked_old))
            if not old.requests:  # no untouched replica had traffic: the old version before the swap
                old = metrics.total([baseline[u] for u in moved], change.model, set(change.baked_old))
            verdict = judge(old, new, self.policy)
            self.verdicts.append(verdict)
            if not verdict.ok:
                failed = self.abort(changes)
                raise PromotionError(
                    f"the bake after wave {wave} of {waves} tripped on {change.model} "
                    f"v{','.join(sorted(new_versions))} ({verdict.metric}): {verdict.detail}; "
                    f"rolled back on {', '.join(moved)}, the other replicas never loaded it"
                    + (f"; could not restore {'; '.join(failed)}" if failed else ""),
                    fix="fix the model and register a new version; the alias was not moved",
                )

    def _undo(self, changes: list[Change]) -> str:
        failed = self.abort(changes)
        if not failed:
            return "every touched replica is back on the store's config"
        return (
            f"every other touched replica is back on the store's config; could not restore "
            f"{'; '.join(failed)} (a replica that restarts reads the store)"
        )

    def abort(self, changes: list[Change]) -> list[str]:
        """Every touched replica goes back to the store's configs, newest change first (a model
        new to the store is unloaded); returns what could not be restored (a dead replica)."""
        failed = []
        for url in self.touched:
            try:
                replica = self.target(url)
                for change in reversed(changes):
                    if change.restore_text is None:
                        replica.unload(change.model)
                    else:
                        replica.load(change.model, config=config_json(change.restore_text))
            except MlregError as exc:
                failed.append(f"{url}: {exc.message}")
        return failed


def reachable(
    targets: Sequence[str], target: Callable[[str], ServingTarget], policy: Policy
) -> tuple[str, ...]:
    """The live replicas; more than ``max_unavailable`` unreachable ones refuse the promotion."""

    def live(url: str) -> str:
        try:
            replica = target(url)
        except MlregError as exc:
            return exc.message
        try:
            replica.is_live()
        except MlregError as exc:
            return exc.message
        finally:
            replica.close()
        return ""

    with ThreadPoolExecutor(max(1, min(8, len(targets)))) as pool:
        errors = dict(zip(targets, pool.map(live, targets), strict=True))
    down = [u for u, e in errors.items() if e]
    if len(down) > policy.max_unavailable:
        raise PromotionError(
            f"{len(down)} replica(s) unreachable ({', '.join(down)}), max_unavailable = "
            f"{policy.max_unavailable}: {errors[down[0]]}",
            fix="bring the replica back (or raise max_unavailable in mlreg.toml), then promote again",
        )
    return tuple(u for u in targets if u not in down)


def changes_of(steps: Sequence[Any], gpu: bool) -> list[Change]:
    """The plan's steps as per-replica changes: each replica swaps straight to the new version
    (Triton serves the old one until the new one is READY; the ensembles over it follow the
    latest version by then), so no second load is needed to retire the old one."""
    from pipelines.promote.plan import desired_config

    changes = []
    for step in steps:
        if step.noop:
            continue
        old = [] if step.is_ensemble else [v for v in step.previous_versions if v != step.version]
        text = desired_config(step.config_text, [step.version], gpu)
        changes.append(Change(step.model, text, [step.version], old, step.previous_config))
    return changes


def following_latest(ensembles: Sequence[Any], members: Sequence[Any], gpu: bool) -> list[Change]:
    """Each re-pointed ensemble, on its old config but following the latest loaded version (-1)
    of every changing member: sent to a replica before its members move, it serves whatever the
    replica has, old then new, with no failed request."""
    from pipelines.promote.plan import desired_config

    pins = {m.model: "-1" for m in members if not m.is_ensemble and m.previous_config is not None}
    out = []
    for step in ensembles:
        versions = step.previous_versions or [step.version]
        text = desired_config(step.previous_config, versions, gpu, pins)
        out.append(Change(step.model, text, versions, [], step.previous_config))
    return out


def staged_deploy(promotion: Any) -> FleetReport:
    """The runner's deploy stage under a policy.

    Triton re-reads an ensemble's members from the repository whenever the ensemble loads, so an
    ensemble pinned to a member version only one replica's override has loaded cannot load.
    Instead, per replica and within its wave, every re-pointed ensemble first follows the latest
    loaded version of the changing members (-1, a config override: the store is not touched and
    the replicas not yet told to move keep their pins), then the members move (override too;
    models new to the store are written first: no replica serves them).  Once the whole fleet
    has moved, the configs are written to the store and every replica loads the ensembles
    pinned to the new versions.
    """
    from pipelines.promote.plan import desired_config
    from pipelines.promote.reports import FleetReport

    plan, fleet, policy = promotion.plan, promotion.fleet, promotion.env.policy
    steps = [s for s in plan.steps if not s.noop]
    repointed = [s for s in steps if s.is_ensemble and s.previous_config is not None]
    staged_steps = [s for s in steps if s not in repointed]
    changes = changes_of(staged_steps, promotion.env.gpu)
    for step, change in zip(staged_steps, changes, strict=True):
        if step.previous_config is None:
            promotion._changing(step)
            promotion.store.write_config(change.model, change.config_text)
    before = following_latest(repointed, staged_steps, promotion.env.gpu)
    staged = StagedRollout(plan.targets, fleet.target, policy, fleet.load_timeout)
    promotion.staged = staged
    try:
        rollouts = staged.run(before + changes)
    except MlregError:
        # the abort put every touched replica back and the store never had these configs: the
        # runner's rollback has only the models new to the store left to undo
        promotion.staged_aborted = True
        promotion.changed[:] = [
            s for s in promotion.changed if s.previous_config is None or not any(s is t for t in steps)
        ]
        raise
    for step, change in zip(staged_steps, changes, strict=True):
        promotion._changing(step)
        promotion.store.write_config(change.model, change.config_text)
    fleet.rollouts.extend(rollouts)
    for step in repointed:
        promotion._changing(step)
        fleet.apply(
            step.model, desired_config(step.config_text, [step.version], promotion.env.gpu), [step.version]
        )
    baked = "; ".join(f"bake ok: {v.detail}" for v in staged.verdicts)
    summary = ", ".join(f"{s.model} v{s.version}" for s in steps)
    waves = len(waves_of(plan.targets, policy))
    return FleetReport(
        f"{summary} over {len(plan.targets)} replica(s) in {waves} wave(s)" + (f"; {baked}" if baked else ""),
        fleet.rollouts,
    )
