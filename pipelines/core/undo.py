"""The undo log: the one owner of what a promotion changed, and of how to put it back.

Noted *before* each change, whoever makes it:

- what each replica held before this promotion first changed a model there (its before-state,
  told by ``Fleet.move`` -- deployer, staged roll-out, canary gate, retire alike -- from the fleet's
  view taken under the locks);
- every config written to the store, and every version folder uploaded new to it;
- every version retention moved out of Triton's prefix (``make_room``);
- every MLflow alias and tag the ``record`` stage wrote.

The runner's error hook replays it once, on any exit after the first change, in an order that
never leaves an ensemble pinned to a member version that is gone:

1. the registry: aliases back (newest first), then the tags;
2. every re-pointed ensemble follows the latest loaded version (-1) of the members that move back,
   on the replicas it was sent to (an ensemble new to a replica is unloaded there);
3. the members: the store's config back (where it is not as noted: a write that failed before it
   changed the file left nothing to restore), then each replica back to its before-state (the store's
   old config sent as a load override, naming the versions it held; a model it did not hold
   unloaded);
4. the ensembles, the same way;
5. the version folders this promotion uploaded, new to the store, removed;
6. the versions archived by this promotion brought back where Triton reads;
7. the MLflow versions this promotion registered (a re-pointed ensemble's, issue 48 item 5)
   deleted, each once proven its own: found by its ``OWNER_TAG``, which names this promotion's id
   and is set in the call that creates the version (a version reused, registered by anyone else,
   never carries it); no alias names it; the store's config does not list it and no replica holds
   it (asked again, after the steps above).  A version that fails a proof is kept, and the report
   says why; one that cannot be asked about is named as not deleted.  A registered model the
   registration created (an ensemble MLflow did not know) goes too, once no version and no alias
   of it is left.

"Did anything change?" has one answer, ``UndoLog.changed``: the log knows the store session's
change journal (``journal``), so a store write noted here counts only once the store took it (a
request refused before it reached the store changed nothing: no rollback then).

A model whose earlier bytes no longer verify (``verify``) is never loaded again: it is left as it
serves now (store and replicas, its uploaded folder kept so the store's config never names a
folder that is gone), and so is every ensemble pinning it; the report names it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipelines.core.changes import Change, ready_versions
from pipelines.core.litter import forget_uploads
from pipelines.core.plan import Step, desired_config, ensemble_pins, follow_latest, serving_versions
from pipelines.core.ports import Replicas, ServingTarget
from pipelines.storage.base import Repository
from registry.errors import MlregError

OWNER_TAG = "mlreg_registered_by"  # a version a promotion registered: that promotion's id
VerifyStored = Callable[[str, str], str]  # (model, version) -> "" when its stored bytes verify, else why
Unarchive = Callable[[str, str], None]  # (model, version) back from the archive (raises MlregError)


class Journal(Protocol):
    """The store session's change journal (pipelines/storage/session.py ``StoreSession``)."""

    def changed_under(self, prefix: str) -> bool: ...


class RegistryWrites(Protocol):
    """The record stage's MLflow writes (``record.RecordWrites``): put back on replay."""

    @property
    def changed(self) -> bool: ...

    def put_back(self) -> tuple[list[str], list[str]]: ...


class RegisteredVersions(Protocol):
    """What the undo log reads of the registered versions and deletes (a registry's ``models``)."""

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]: ...

    def aliases(self, name: str) -> dict[str, str]: ...

    def versions(self, name: str) -> list[Any]: ...

    def delete_model(self, name: str) -> None: ...


class Registrar(Protocol):
    """What deleting a version this promotion registered needs of the registry (``Registry``):
    its ``models`` read (a model its registration created deleted) and a version deleted with its
    run."""

    @property
    def models(self) -> RegisteredVersions: ...

    def delete_version(self, name: str, version: str) -> None: ...


@dataclass(frozen=True)
class Registering:
    """A version of ``model`` this promotion registers, tagged ``OWNER_TAG`` = ``promotion_id``
    (``new_model``: ``model`` was no registered model before: the registration creates it)."""

    model: str
    promotion_id: str
    registry: Registrar
    new_model: bool = False
    pins: tuple[tuple[str, str], ...] = ()  # the member versions the registered config pins


@dataclass
class Entry:
    """One model this promotion changed."""

    model: str
    ensemble: bool
    previous: str | None  # the store's config before (None: new to the store)
    previous_versions: tuple[str, ...]
    store: bool = False  # the store's config was written
    replicas: list[str] = field(default_factory=list)  # servers sent a change of it, in order
    before: dict[str, tuple[str, ...]] = field(default_factory=dict)  # url -> READY at the first touch
    uploaded: list[str] = field(default_factory=list)  # version folders new to the store

    def back_at(self, url: str, gpu: bool) -> Change | None:
        """What the replica at ``url`` held before (None: held, but not from this store's config)."""
        held = self.before.get(url, ())
        if not held:
            return Change(self.model, None)
        if self.previous is None:
            return None
        return Change(self.model, desired_config(self.previous, list(held), gpu), held)

    @property
    def describe(self) -> str:
        versions = sorted(
            {v for held in self.before.values() for v in held} or self.previous_versions, key=int
        )
        return f"{self.model} -> v{','.join(versions) or 'none'}"


@dataclass
class UndoReport:
    restored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "url: why" / "store: why"

    @property
    def ok(self) -> bool:
        return not self.failed


class UndoLog:
    """``journal``: the store session whose writes this log notes (None: every noted store write
    counts as made)."""

    def __init__(self, gpu: bool, journal: Journal | None = None) -> None:
        self.gpu = gpu
        self.journal = journal
        self.entries: dict[str, Entry] = {}
        self.steps: dict[str, Step] = {}  # the plan's steps by model (what a new entry starts from)
        self.registry: RegistryWrites | None = None
        self.archived: list[tuple[str, str]] = []  # (model, version) moved out of Triton's prefix
        self.unarchive: Unarchive | None = None
        self.registrations: list[Registering] = []  # MLflow versions this promotion registers
        self._mutex = threading.Lock()  # a staged wave touches replicas from several threads

    # -- what the writers note ---------------------------------------------------------------------

    def plan(self, steps: Iterable[Step]) -> None:
        self.steps = {s.model: s for s in steps}

    def entry(self, model: str) -> Entry:
        with self._mutex:
            if model not in self.entries:
                step = self.steps.get(model)
                self.entries[model] = (
                    Entry(model, step.is_ensemble, step.previous_config, tuple(step.previous_versions))
                    if step is not None
                    else Entry(model, False, None, ())  # only this promotion knows it (the gate's)
                )
            return self.entries[model]

    def track(self, model: str, previous: str, versions: Iterable[str]) -> None:
        """A model changed outside a plan (``mlreg retire``): its store config before."""
        self.entries[model] = Entry(model, False, previous, tuple(versions))

    def wrote_config_of(self, model: str) -> None:
        self.entry(model).store = True

    def touched(self, url: str, model: str, ready: tuple[str, ...]) -> None:
        """``Fleet.move``'s hook: the replica's before-state, kept from its first touch only."""
        entry = self.entry(model)
        with self._mutex:
            if url not in entry.before:
                entry.before[url] = ready
                entry.replicas.append(url)

    def uploaded(self, step: Step, version: str) -> None:
        if version not in step.previous_versions:
            self.entry(step.model).uploaded.append(version)

    def archived_version(self, model: str, version: str, back: Unarchive) -> None:
        self.archived.append((model, version))
        self.unarchive = back

    def wrote_registry(self, writes: RegistryWrites) -> None:
        self.registry = writes

    def forget(self, model: str) -> None:
        self.entries.pop(model, None)

    def registering(
        self,
        model: str,
        promotion_id: str,
        registry: Registrar,
        new_model: bool = False,
        pins: dict[str, str] | None = None,
    ) -> None:
        """A version of ``model`` pinning ``pins`` about to be registered with ``OWNER_TAG`` =
        ``promotion_id`` (``new_model``: and the model with it): noted before the call, so an exit
        during it still finds what it made (step 7)."""
        noted = Registering(model, promotion_id, registry, new_model, tuple(sorted((pins or {}).items())))
        if noted not in self.registrations:
            self.registrations.append(noted)

    @property
    def empty(self) -> bool:
        """Nothing noted (a noted change may still not have happened: ``changed`` tells)."""
        if self.registrations:
            return False
        return not (self.archived or (self.registry is not None and self.registry.changed)) and not any(
            e.store or e.replicas or e.uploaded for e in self.entries.values()
        )

    @property
    def changed(self) -> bool:
        """Whether a change noted here happened (or may have): a replica was sent one, the store
        took a write or delete under a noted model (its journal says), a version was archived, or
        the registry was written -- the one answer to "is there anything to put back?"."""
        if self.archived or self.registrations or (self.registry is not None and self.registry.changed):
            return True
        if self.empty:
            return False
        return any(e.replicas or self._stored(e.model) for e in self.entries.values())

    def _stored(self, model: str) -> bool:
        return True if self.journal is None else self.journal.changed_under(f"{model}/")

    @property
    def replicas(self) -> list[str]:
        """Every server this promotion sent a change to, in order."""
        seen: list[str] = []
        for entry in self.entries.values():
            seen.extend(url for url in entry.replicas if url not in seen)
        return seen

    def release(self, url: str, fleet: Replicas) -> str:
        """The replica at ``url`` left out of the roll-out as it served: every model this promotion
        changed there put back to what it held at the first touch (members first, then ensembles,
        newest first; one new to the replica unloaded), and ``url`` forgotten, so the replay does
        not put it back twice.  Returns "" or why not (``url`` then stays noted for the replay)."""
        with self._mutex:
            newest_first = [e for e in reversed(self.entries.values()) if url in e.before]
        for entry in [e for e in newest_first if not e.ensemble] + [e for e in newest_first if e.ensemble]:
            change = entry.back_at(url, self.gpu)
            why = fleet.restore(url, change) if change is not None else ""  # None: never unload what served
            if why:
                return why
            with self._mutex:
                del entry.before[url]
                entry.replicas.remove(url)
        return ""

    # -- the replay --------------------------------------------------------------------------------

    def replay(self, fleet: Replicas, store: Repository, verify: VerifyStored | None = None) -> UndoReport:
        """Put everything back (see the module's docstring for the order)."""
        report = UndoReport()
        touched = self.replicas  # before the put-back forgets any (step 7 asks them)
        self._registry_back(report)
        newest_first = list(reversed(self.entries.values()))
        ensembles = [e for e in newest_first if e.ensemble]
        members = [e for e in newest_first if not e.ensemble]
        kept = self._unverified(members, verify, report)
        self._models_back(members, ensembles, kept, fleet, store, report)
        for entry in newest_first:
            if entry.model not in kept:  # else the store's config still names them: the folders stay
                _remove_uploads(entry, store, report)
        self._archive_back(report)
        self._registered_back(fleet, store, report, touched)
        self.entries.clear()
        return report

    def _models_back(
        self,
        members: list[Entry],
        ensembles: list[Entry],
        kept: set[str],
        fleet: Replicas,
        store: Repository,
        report: UndoReport,
    ) -> None:
        """Each ensemble follows the latest version of its members moving back, then every model
        but those ``kept`` (and the ensembles over them) is put back in the store and on its
        replicas."""
        moving = {m.model for m in members if (m.store or m.replicas) and m.model not in kept}
        for entry in ensembles:
            if not _pins_any(entry, kept):
                self._follow(entry, moving, fleet, report)
        for entry in members + ensembles:
            if entry.model in kept or (entry.ensemble and _pins_any(entry, kept)):
                continue
            self._put_back(entry, fleet, store, report)

    def _registry_back(self, report: UndoReport) -> None:
        if self.registry is None or not self.registry.changed:
            return
        back, left = self.registry.put_back()
        report.restored.extend(back)
        report.failed.extend(left)
        self.registry = None

    def _archive_back(self, report: UndoReport) -> None:
        for model, version in self.archived:
            assert self.unarchive is not None
            try:
                self.unarchive(model, version)
            except MlregError as exc:
                report.failed.append(f"{model}/{version} stays in the archive: {exc.message}")
                continue
            report.restored.append(f"{model}/{version} back from the archive")
        self.archived.clear()

    def _registered_back(
        self, fleet: Replicas, store: Repository, report: UndoReport, touched: list[str]
    ) -> None:
        """Step 7: each version this promotion registered deleted, once proven its own (nothing
        serves it: the store's config, and every replica this promotion sent a change to); then a
        model its registration created, once it has no version and no alias left."""
        for noted in self.registrations:
            if _versions_back(noted, fleet, store, report, touched) and noted.new_model:
                _model_back(noted, report)
        self.registrations.clear()

    def _unverified(self, members: list[Entry], verify: VerifyStored | None, report: UndoReport) -> set[str]:
        """The members whose way back would load bytes that no longer verify."""
        kept: set[str] = set()
        for entry in members:
            if verify is None or entry.previous is None or not (entry.store or entry.replicas):
                continue
            loads = {v for held in entry.before.values() for v in held} or set(entry.previous_versions)
            for version in sorted(loads, key=int):
                why = verify(entry.model, version)
                if why:
                    where = ", ".join(entry.replicas) or "no replica yet"
                    report.failed.append(f"{why}: {entry.model} left as it serves now ({where})")
                    kept.add(entry.model)
                    break
        return kept

    def _follow(self, entry: Entry, moving: set[str], fleet: Replicas, report: UndoReport) -> None:
        """An ensemble first follows the latest loaded version of the members moving back; where
        it was new to a replica, it is unloaded there before its members go."""
        following = moving & set(ensemble_pins(entry.previous or ""))
        for url in list(entry.replicas):
            held = entry.before.get(url, ())
            if not held:
                _note(report, fleet.restore(url, Change(entry.model, None)), "")
                entry.replicas.remove(url)  # unloaded already
            elif entry.previous is not None and following:
                text = follow_latest(entry.previous, list(held), self.gpu, following)
                _note(report, fleet.restore(url, Change(entry.model, text, held)), "")

    def _put_back(self, entry: Entry, fleet: Replicas, store: Repository, report: UndoReport) -> None:
        # the config noted before the first write: nothing is written back where it still is -- a
        # write that failed before it changed the file (a full disk) left nothing to restore
        written = entry.store and not _unchanged(store, entry)
        if written:
            _note(report, _write_back(store, entry), "")
        restores = []
        for url in entry.replicas:
            change = entry.back_at(url, self.gpu)
            if change is None:
                _keep(report, fleet, url, entry.model, entry.before[url])  # never unload what served
            else:
                restores.append((url, change))
        # as many replicas at once as the roll-out moved (a 200-replica abort: waves, not 200 loads)
        workers = min(fleet.parallel, len(restores))
        if workers > 1:
            with ThreadPoolExecutor(workers) as pool:
                failures = list(pool.map(lambda item: fleet.restore(*item), restores))
        else:
            failures = [fleet.restore(url, change) for url, change in restores]
        for failure in failures:  # in the replicas' order, whatever order they finished in
            _note(report, failure, "")
        if written or entry.replicas:
            report.restored.append(entry.describe)


def _versions_back(
    noted: Registering, fleet: Replicas, store: Repository, report: UndoReport, touched: list[str]
) -> bool:
    """The versions ``noted`` made deleted where nothing uses them; whether every one was."""
    try:
        found = noted.registry.models.find_by_tag(noted.model, OWNER_TAG, noted.promotion_id)
    except MlregError as exc:
        report.failed.append(
            f"MLflow: the versions of {noted.model} this promotion registered cannot be looked "
            f"up, so none was deleted ({exc.message})"
        )
        return False
    every = True
    for version in sorted((str(v.version) for v in found), key=int):
        tags = dict(next(v for v in found if str(v.version) == version).tags or {})
        if tags.get(OWNER_TAG) != noted.promotion_id:  # the search's word is not the proof
            continue
        kept, unknown = _in_use(noted, version, fleet, store, touched)
        if kept:  # in use: kept, and said so; not known to be unused: kept, named as left over
            where = report.failed if unknown else report.restored
            where.append(f"{noted.model} v{version}, registered by this promotion, kept in MLflow ({kept})")
            every = False
            continue
        try:
            noted.registry.delete_version(noted.model, version)
        except MlregError as exc:
            report.failed.append(
                f"MLflow: {noted.model} v{version}, registered by this promotion and served "
                f"nowhere, was not deleted ({exc.message})"
            )
            every = False
            continue
        report.restored.append(f"{noted.model} v{version} (registered by this promotion) deleted")
    return every


def _model_back(noted: Registering, report: UndoReport) -> None:
    """The registered model ``noted``'s registration created (none before it), deleted once no
    version and no alias of it is left (someone else's since: kept)."""
    try:
        if noted.registry.models.versions(noted.model) or noted.registry.models.aliases(noted.model):
            return
        noted.registry.models.delete_model(noted.model)
    except MlregError as exc:
        report.failed.append(
            f"MLflow: model {noted.model}, new with this promotion's registration and left with no "
            f"version, was not deleted ({exc.message})"
        )
        return
    report.restored.append(f"model {noted.model} (registered by this promotion) deleted")


def _in_use(
    noted: Registering, version: str, fleet: Replicas, store: Repository, touched: list[str]
) -> tuple[str, bool]:
    """Why ``version`` of ``noted.model`` must stay in MLflow -- an alias names it, the store's
    config serves it, a replica of ``touched`` holds it -- and whether that is only not known
    (something cannot be asked); ("", False) when nothing uses it.  A folder of that number that
    serves other pins (the config from before this promotion, in a folder the registry's number
    happens to name) is not this version."""
    model, pins = noted.model, dict(noted.pins)
    try:
        named = sorted(a for a, v in noted.registry.models.aliases(model).items() if v == version)
        text = store.read_config(model) or ""
    except MlregError as exc:
        return f"whether anything uses it cannot be told: {exc.message}", True
    if named:
        return f"alias '{', '.join(named)}' names it", False
    if version in serving_versions(text) and (not pins or ensemble_pins(text) == pins):
        return f"the store's config of {model} lists it", False
    for url in touched:
        try:
            held = _holds(fleet.target(url), model, version, pins)
        except MlregError as exc:
            return f"{url} cannot be asked whether it holds it: {exc.message}", True
        if held:
            return f"{url} holds it", False
    return "", False


def _holds(target: ServingTarget, model: str, version: str, pins: dict[str, str]) -> bool:
    """``target`` holds ``version`` of ``model`` (LOADING, or READY with ``pins`` where known)."""
    state = target.model_states().get(model, {}).get(version)
    if state != "READY" or not pins:
        return state in ("READY", "LOADING")
    steps = target.model_config(model).get("ensemble_scheduling", {}).get("step", [])
    return {s["model_name"]: str(int(s.get("model_version", -1))) for s in steps} == pins


def _note(report: UndoReport, failure: str, done: str) -> None:
    if failure:
        if failure not in report.failed:  # a replica that dropped: named once, not per model
            report.failed.append(failure)
    elif done:
        report.restored.append(done)


def _keep(report: UndoReport, fleet: Replicas, url: str, model: str, before: tuple[str, ...]) -> None:
    """``model`` new to the store but served at ``url`` before this promotion (from another
    repository): left loaded; the report says whether it still serves what it served."""
    try:
        now = ready_versions(fleet.target(url).model_states(), model)
    except MlregError as exc:
        report.failed.append(f"{url}: {model} cannot be checked: {exc.message}")
        return
    if set(before) == set(now):
        report.restored.append(
            f"{model} left as it served at {url} (v{','.join(before)}, not from this store)"
        )
    else:
        report.failed.append(
            f"{url}: {model} serves v{','.join(now) or 'nothing'}, not v{','.join(before)} as before this "
            "promotion (it served it from outside the environment's store: load it there again)"
        )


def _write_back(store: Repository, entry: Entry) -> str:
    try:
        if entry.previous is None:
            store.objects.delete(f"{entry.model}/config.pbtxt")
        else:
            store.session.write_config(entry.model, entry.previous)
    except MlregError as exc:
        return f"{store.uri}: {entry.model}/config.pbtxt: {exc.message}"
    return ""


def _unchanged(store: Repository, entry: Entry) -> bool:
    """Whether the store's config is the one noted before this promotion's first write (False
    when it cannot be read: the write back is tried, and says why it fails)."""
    try:
        return store.read_config(entry.model) == entry.previous
    except MlregError:
        return False


def _delete_version(store: Repository, model: str, version: str) -> str:
    try:
        store.versions.delete_version(model, version)
    except MlregError as exc:
        return f"{store.uri}: {model}/{version}: {exc.message}"
    return ""


def _pins_any(entry: Entry, models: set[str]) -> bool:
    """The config ``entry`` had before pins one of ``models``."""
    return bool(models & set(ensemble_pins(entry.previous or "")))


def _remove_uploads(entry: Entry, store: Repository, report: UndoReport) -> None:
    for version in entry.uploaded:
        failure = _delete_version(store, entry.model, version)
        _note(report, failure, f"{entry.model}/{version} removed")
        if not failure:  # its upload marker too (litter.py); one left over names a folder that is gone
            forget_uploads(store, [(entry.model, version)])
