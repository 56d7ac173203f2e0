"""Retention: a load costs one version, not the model's whole history.

Triton localizes the whole model folder for each load from S3, so every version left under the
prefix it reads makes every later load slower.  Each environment keeps ``keep`` versions per model
there (``mlreg.toml``, default 2: what serves and the one before it, for an instant rollback;
``keep = 0`` turns retention off); the others move to the store's archive
(:mod:`pipelines.storage.archive`), never lost.

The window of a model, in order: the versions its stored config serves, those that served before
this promotion, then the others by their last promotion to the environment (MLflow's
``promoted_<env>`` tag), newest first, then by number.  Whatever the window, a version is never
archived while any ensemble of the store pins it or any target holds it -- every target is asked;
when one cannot be, nothing is archived (what it holds is unknown).

In a promotion, the ``archive`` stage (``make_room``) runs after ``assemble``'s upload and before
the load, under the promotion's locks: the versions that will be beyond the window once it is done
leave first, so the load localizes only the window (never what serves now nor the new versions).
Each move is in the undo log: a failed promotion brings them back (every exit restores).
``retain`` runs once the alias has moved, and only when there is anything left (keep = 1: the
version that served until now; the archive's copy of a version brought back): it never undoes a
promotion.  A failed move is a warning in the stage report (the version stays live, or in both
places after a crash) and the next promotion or ``mlreg store gc`` finishes it.  A promotion to an
archived version -- a rollback included -- brings it back in ``assemble`` (``restored``): a
server-side copy from the archive, verified against the registered digest before any load, or the
registry's artifacts uploaded when the archive has no whole copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.litter import remove_fenced_uploads
from pipelines.core.plan import Step, ensemble_pins, ensembles_pinning, serving_versions
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import checkpoint
from pipelines.storage import locking
from pipelines.storage.archive import archive_of, bring_back, complete, drop_archived, move_to_archive
from pipelines.storage.base import Repository
from pipelines.storage.versions import Versions
from registry.errors import MlregError, StorageError, TritonError
from registry.ports import RegistryReader

log = logging.getLogger(__name__)
States = Mapping[str, "dict[str, dict[str, str]] | MlregError"]  # url -> model -> version -> state
Stamp = Callable[[str, str], str]  # (model, version) -> when it was last promoted here ("" unknown)
HELD = {"READY", "LOADING"}  # serving, or reading its bytes (UNLOADING: being let go, read no more)


@dataclass(frozen=True)
class Move:
    model: str
    version: str
    bytes: int = 0


@dataclass
class RetentionReport:
    """What retention moved (or, in a dry run, would move) and why the rest stays."""

    keep: int
    moves: list[Move] = field(default_factory=list)  # live -> archive
    kept: dict[str, list[str]] = field(default_factory=dict)  # model -> versions left live
    protected: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> version -> why
    tidy: list[tuple[str, str]] = field(default_factory=list)  # archive copies of live versions
    failed: list[str] = field(default_factory=list)
    dry_run: bool = False
    skipped: str = ""  # why nothing was archived
    litter: list[str] = field(default_factory=list)  # fenced promotions' uploads removed (litter.py)
    seconds: float = 0.0  # spent asking, planning and moving

    @property
    def bytes_freed(self) -> int:
        return sum(m.bytes for m in self.moves)

    def detail(self) -> str:
        if self.skipped:
            return f"archived nothing: {self.skipped}"
        verb = "would archive" if self.dry_run else "archived"
        moved = ", ".join(f"{m.model} v{m.version}" for m in self.moves) or "nothing"
        text = f"keep {self.keep}: {verb} {moved} ({self.bytes_freed:,} bytes)"
        guarded = [
            f"{m} v{v} ({why})" for m, versions in self.protected.items() for v, why in versions.items()
        ]
        if guarded:
            text += f"; kept beyond the window: {', '.join(guarded)}"
        if self.tidy:
            dropped = ", ".join(f"{m} v{v}" for m, v in self.tidy)
            text += f"; the archive's copy of {dropped} dropped (live again)"
        if self.failed:
            text += f"; not archived: {'; '.join(self.failed)} (rerun 'mlreg store gc' to finish)"
        if self.litter:
            text += f"; {'; '.join(self.litter)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "keep": self.keep,
            "dry_run": self.dry_run,
            "moves": [m.__dict__ for m in self.moves],
            "bytes_freed": self.bytes_freed,
            "kept": self.kept,
            "protected": self.protected,
            "archive_copies_dropped": [f"{m}/{v}" for m, v in self.tidy],
            "failed": self.failed,
            "skipped": self.skipped,
            "fenced_uploads_removed": self.litter,
        }


# -- the rules (pure) ------------------------------------------------------------------------------


def window(
    keep: int, live: Iterable[str], desired: list[str], before: list[str], stamp: Stamp, model: str
) -> list[str]:
    """The live versions retention keeps: every desired one, then up to ``keep`` in all (the
    registry is asked for promotion dates only when what serves and served before leave room)."""
    live = list(live)
    ranked = [v for v in dict.fromkeys([*desired, *before]) if v in live]
    wanted = len([v for v in desired if v in live])
    if len(ranked) < keep:
        rest = [v for v in live if v not in ranked]
        ranked += sorted(rest, key=lambda v: (stamp(model, v), int(v)), reverse=True)
    return ranked[: max(keep, wanted)]


def pinned(store: Repository) -> dict[str, dict[str, str]]:
    """model -> version -> "pinned by ensemble E", for every ensemble config of the store."""
    found: dict[str, dict[str, str]] = {}
    for name, text in ensembles_pinning(store).items():
        for member, version in ensemble_pins(text).items():
            if int(version) > 0:
                found.setdefault(member, {})[version] = f"pinned by ensemble {name}"
    return found


def held(states: States) -> dict[str, dict[str, str]]:
    """model -> version -> "held by URL (STATE)" over every target's answer."""
    found: dict[str, dict[str, str]] = {}
    for url, models in states.items():
        if isinstance(models, MlregError):
            continue
        for model, versions in models.items():
            for version, state in versions.items():
                if state in HELD:
                    found.setdefault(model, {}).setdefault(version, f"held by {url} ({state})")
    return found


def unreachable(states: States) -> list[str]:
    return [f"{url}: {answer.message}" for url, answer in states.items() if isinstance(answer, MlregError)]


# -- planning and moving ---------------------------------------------------------------------------


def plan(
    store: Repository,
    archive: Repository,
    models: Iterable[str],
    keep: int,
    states: States,
    stamp: Stamp,
    before: Mapping[str, list[str]] | None = None,
    desired: Mapping[str, list[str]] | None = None,
    guard: Mapping[str, dict[str, str]] | None = None,
) -> RetentionReport:
    """What retention would do for ``models`` (reads only).  ``desired``: the versions that will
    serve (default: what each stored config serves); ``guard``: more versions never to move."""
    report = RetentionReport(keep)
    protect = _protected(store, guard or {}, states)
    for model in sorted(set(models)):
        config = store.read_config(model)
        if config is None:
            continue  # not deployed here: nothing tells what serves
        live = store.list_versions(model)
        serving = (desired or {}).get(model) or serving_versions(config)
        kept = window(keep, live, serving, (before or {}).get(model, []), stamp, model)
        guarded = {v: why for v, why in protect.get(model, {}).items() if v in live and v not in kept}
        report.kept[model] = sorted(set(kept) | set(guarded), key=int)
        if guarded:
            report.protected[model] = guarded
        _sort_versions(store.versions, archive, model, live, report)
    return report


def _protected(
    store: Repository, guard: Mapping[str, dict[str, str]], states: States
) -> dict[str, dict[str, str]]:
    """model -> version -> why it never moves: pinned by an ensemble, guarded, held by a target."""
    protect = pinned(store)
    for more in (guard, held(states)):
        for model, versions in more.items():
            for version, why in versions.items():
                protect.setdefault(model, {}).setdefault(version, why)
    return protect


def _sort_versions(
    store: Versions, archive: Repository, model: str, live: list[str], report: RetentionReport
) -> None:
    """Each live version of ``model`` retention does not keep is a move; one it keeps that the
    archive holds too (and the store holds whole) is a copy to tidy."""
    stored = set(archive.list_versions(model))
    for version in live:
        if version in report.kept[model]:
            if version in stored and complete(store, model, version) is not None:
                report.tidy.append((model, version))
        else:
            found = store.read_manifest(model, version)
            size = sum(int(f["size"]) for f in found.files.values()) if found else 0
            report.moves.append(Move(model, version, size))


def apply(store: Repository, archive: Repository, report: RetentionReport) -> RetentionReport:
    """Carry out ``report``'s moves (a failed one is noted and the others go on), then drop the
    archive's copies of versions live and whole again."""
    done = []
    for move in report.moves:
        try:
            moved = move_to_archive(store, archive, move.model, move.version, on_copied=_copied)
        except StorageError as exc:
            report.failed.append(f"{move.model} v{move.version}: {exc.message}")
            continue
        done.append(Move(move.model, move.version, moved or move.bytes))
    report.moves = done
    for model, version in report.tidy:
        try:
            drop_archived(archive.versions, model, version)
        except StorageError as exc:
            report.failed.append(f"archive copy of {model} v{version}: {exc.message}")
    return report


def _copied(model: str, version: str) -> None:
    checkpoint(f"archive-copied:{model}/{version}")  # tests SIGKILL here: live and archive both whole


# -- in a promotion --------------------------------------------------------------------------------


def pending(ctx: FleetContext) -> bool:
    """Whether ``retain`` has anything to do: retention on, a promotion that changed something, and
    a promoted model with more live versions than the window, or a version both live and archived
    (brought back, or a move a crash cut short).  A no-op rerun keeps its fast path: the next
    promotion or ``mlreg store gc`` finishes what a crash left."""
    if ctx.env.keep <= 0 or ctx.options.dry_run or ctx.noop:
        return False
    try:
        archive: Repository | None = archive_of(ctx.store)
    except StorageError:
        archive = None  # a store at a bucket's root: retain says so once there is more than the window
    try:
        for model in _models(ctx):
            live = set(ctx.store.list_versions(model))
            if len(live) > ctx.env.keep or (archive and live & set(archive.list_versions(model))):
                return True
    except MlregError:
        return True  # retain says why in its report
    return False


def room_needed(ctx: FleetContext) -> bool:
    """Whether the ``archive`` stage has anything to do: retention on and a planned model with
    more versions under Triton's prefix than the window (asked of the store)."""
    keep = ctx.env.keep
    if keep <= 0 or not ctx.plan.steps:
        return False
    try:
        return any(len(ctx.store.list_versions(m)) > keep for m in _models(ctx))
    except MlregError:
        return True  # the stage says why in its report


def archive(ctx: FleetContext) -> RetentionReport:
    """The ``archive`` stage (after ``assemble``, before any load): ``make_room``."""
    return make_room(ctx) or RetentionReport(ctx.env.keep)


def make_room(ctx: FleetContext) -> RetentionReport | None:
    """In ``assemble``, after the upload and before the load: the versions that will be beyond the
    window once this promotion is done leave now, so the load localizes only the window.  Never
    what serves now (the undo log would load it again) nor the new versions; the archive's copies
    of versions brought back stay until the promotion is done (``retain`` drops them).  None when
    there is nothing to move."""
    keep = ctx.env.keep
    if keep <= 0 or not ctx.plan.steps:
        return None
    began = time.perf_counter()
    try:
        if all(len(ctx.store.list_versions(m)) <= keep for m in _models(ctx)):
            return None
        report = _pass(ctx, pre_deploy=True)
    except MlregError as exc:  # the promotion goes on with every version where it is
        report = RetentionReport(keep, failed=[exc.message])
    for move in report.moves:  # every exit restores: the undo log brings them back (under the locks)
        ctx.undo.archived_version(move.model, move.version, lambda m, v: _unarchive(ctx.store, m, v))
    report.seconds = time.perf_counter() - began
    return report


def _unarchive(store: Repository, model: str, version: str) -> None:
    """A version ``make_room`` moved comes back where Triton reads (as it left: a rename locally,
    a checked copy across file systems or on S3); raises when it cannot (it stays whole in the
    archive)."""
    move_to_archive(archive_of(store), store, model, version)


def _pass(ctx: FleetContext, pre_deploy: bool) -> RetentionReport:
    archive = archive_of(ctx.store)
    states = ctx.fleet.states()
    missing = unreachable(states) + [f"{u}: {why}" for u, why in ctx.plan.skipped.items()]
    if missing:
        why = f"a target could not be asked what it holds ({'; '.join(missing)})"
        return RetentionReport(ctx.env.keep, skipped=why)
    before = {s.model: s.previous_versions for s in ctx.plan.steps}
    stamp = registry_stamp(ctx.registry.models, ctx.env.name)
    if not pre_deploy:
        found = plan(ctx.store, archive, _models(ctx), ctx.env.keep, states, stamp, before)
        return apply(ctx.store, archive, found)
    desired = {s.model: [s.version] for s in ctx.plan.steps}
    guard = {m: {v: "serves now (an abort would load it again)" for v in vs} for m, vs in before.items()}
    found = plan(ctx.store, archive, _models(ctx), ctx.env.keep, states, stamp, before, desired, guard)
    found.tidy = []  # an abort removes the live copy of a version brought back: the archive keeps its own
    return apply(ctx.store, archive, found)


def retain(ctx: FleetContext) -> RetentionReport:
    """After ``record``: what is still beyond the window archived (keep = 1: the version that served
    until this promotion), and the archive's copies of versions brought back dropped."""
    began = time.perf_counter()
    try:
        report = _pass(ctx, pre_deploy=False)
    except MlregError as exc:  # the promotion stands: the next one, or store gc, finishes this
        report = RetentionReport(ctx.env.keep, failed=[exc.message])
    report.seconds = time.perf_counter() - began
    return report


def _models(ctx: FleetContext) -> set[str]:
    return {s.model for s in ctx.plan.steps}  # each one locked by resolve


def registry_stamp(registry: RegistryReader, env_name: str) -> Stamp:
    """When each version was last promoted to ``env_name`` (MLflow's ``promoted_<env>`` tag)."""

    def stamp(model: str, version: str) -> str:
        try:
            return str(registry.version_tags(model, version).get(f"promoted_{env_name}", ""))
        except (MlregError, LookupError):
            return ""

    return stamp


def restored(store: Repository, step: Step) -> bool:
    """``step``'s version brought back from the archive and verified against the registered digest;
    False when the archive has no whole copy, or its copy does not verify (the caller uploads the
    registry's artifacts then, which re-sends every file that differs)."""
    if not step.digest:  # a manifest alone proves nothing: only MLflow's digest says it is registered
        return False
    try:
        archive = archive_of(store)
    except StorageError:
        return False
    if not bring_back(store, archive, step.model, step.version):
        return False
    try:
        store.versions.verify_version(step.model, step.version, step.digest, drop_bytecode=True)
    except StorageError:
        return False
    return True


# -- on an existing store: mlreg store gc ----------------------------------------------------------


def collect(
    store: Repository,
    ask: Callable[[], States],
    stamp: Stamp,
    keep: int,
    *,
    dry_run: bool = False,
    models: Iterable[str] | None = None,
) -> RetentionReport:
    """Apply the policy to ``store`` (every model, or ``models``) under each model's lock; ``ask``
    returns what every target holds (asked once the locks are held).  A target that cannot be
    asked refuses the whole run: what it holds is unknown."""
    if keep <= 0:
        return RetentionReport(keep, dry_run=dry_run, skipped="retention is off (keep = 0)")
    archive = archive_of(store)
    names = sorted(models if models is not None else store.list_models())
    with ExitStack() as locks:
        if not dry_run:  # a dry run only reads: it never blocks a promotion
            for name in names:
                locks.enter_context(locking.held(store.session, name))
        states = ask()
        missing = unreachable(states)
        if missing:
            raise TritonError(
                f"cannot ask every target what it holds, so nothing is archived: {'; '.join(missing)}",
                fix="bring the target back (or correct the environment's targets), then rerun",
            )
        # before the window (never archived), kept while a replica holds it
        litter = [] if dry_run else remove_fenced_uploads(store, names, states)
        found = plan(store, archive, names, keep, states, stamp)
        found.litter = litter
        found.dry_run = dry_run
        return found if dry_run else apply(store, archive, found)
