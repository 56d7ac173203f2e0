"""The undo log: what a promotion changed, and how to put it back.

Every writer of a promotion -- the upload, the canary gate, the one-shot and the staged deploy --
notes a change here *before* making it: a version folder uploaded, a config written to the store,
a model sent to a replica.  On any failure or interrupt the runner replays the log once, in an
order that never leaves an ensemble pinned to a member version that is gone:

1. every re-pointed ensemble follows the latest loaded version (-1) of the members that move back,
   on the replicas it was sent to (an ensemble new to the store is unloaded);
2. the members: the store's config back, then each replica back to it (a model new there unloaded);
3. the ensembles: the store's config back, then each replica back to its old config;
4. the version folders this promotion uploaded, new to the store, removed.

A replica is put back with the store's old config sent as a load override: Triton keeps an
earlier override over a store file older than it, so a plain reload would not be enough.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipelines.promote.fanout import Change, Fleet, ready_versions
from pipelines.promote.plan import Step, desired_config, ensemble_pins
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError

VerifyStored = Callable[[str, str], str]  # (model, version) -> "" when its stored bytes verify, else why


@dataclass
class Entry:
    """One model this promotion changed."""

    model: str
    ensemble: bool
    previous: str | None  # the store's config before (None: new to the store)
    previous_versions: tuple[str, ...]
    store: bool = False  # the store's config was written
    replicas: list[str] = field(default_factory=list)  # servers sent a change of it, in order
    uploaded: list[str] = field(default_factory=list)  # version folders new to the store

    def back(self) -> Change:
        return Change(self.model, self.previous, self.previous_versions if self.previous else ())


@dataclass
class UndoReport:
    restored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "url: why" / "store: why"

    @property
    def ok(self) -> bool:
        return not self.failed


class UndoLog:
    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.entries: dict[str, Entry] = {}

    # -- what the writers note ---------------------------------------------------------------------

    def entry(self, step: Step) -> Entry:
        if step.model not in self.entries:
            self.entries[step.model] = Entry(
                step.model, step.is_ensemble, step.previous_config, tuple(step.previous_versions)
            )
        return self.entries[step.model]

    def wrote_config(self, step: Step) -> None:
        self.entry(step).store = True

    def moved(self, step: Step, url: str) -> None:
        replicas = self.entry(step).replicas
        if url not in replicas:
            replicas.append(url)

    def uploaded(self, step: Step, version: str) -> None:
        if version not in step.previous_versions:
            self.entry(step).uploaded.append(version)

    def loaded_privately(self, model: str, url: str) -> None:
        """A model only this promotion knows (the gate's private candidate): unloaded on undo."""
        entry = self.entries.setdefault(model, Entry(model, False, None, ()))
        if url not in entry.replicas:
            entry.replicas.append(url)

    def forget(self, model: str) -> None:
        self.entries.pop(model, None)

    @property
    def empty(self) -> bool:
        return not any(e.store or e.replicas or e.uploaded for e in self.entries.values())

    @property
    def replicas(self) -> list[str]:
        """Every server this promotion sent a change to, in order."""
        seen: list[str] = []
        for entry in self.entries.values():
            seen.extend(url for url in entry.replicas if url not in seen)
        return seen

    # -- the replay --------------------------------------------------------------------------------

    def replay(self, fleet: Fleet, store: RepositoryStore, verify: VerifyStored | None = None) -> UndoReport:
        """Put everything back; ``verify`` is asked before a version is loaded again: a member whose
        earlier bytes do not verify is left as it serves now (store and replicas), and so is every
        ensemble pinning it -- never loaded unverified -- and the report names it."""
        report = UndoReport()
        newest_first = list(reversed(self.entries.values()))
        ensembles = [e for e in newest_first if e.ensemble]
        members = [e for e in newest_first if not e.ensemble]
        moving = {m.model for m in members if m.store or m.replicas}
        kept = self._unverified(members, verify, report)
        for entry in ensembles:
            self._follow(entry, moving, fleet, report)
        for entry in members + ensembles:
            if entry.model in kept or (entry.ensemble and kept & set(ensemble_pins(entry.previous or ""))):
                continue
            self._put_back(entry, fleet, store, report)
        for entry in newest_first:
            for version in entry.uploaded:
                _note(
                    report, _delete_version(store, entry.model, version), f"{entry.model}/{version} removed"
                )
        self.entries.clear()
        return report

    @staticmethod
    def _unverified(members: list[Entry], verify: VerifyStored | None, report: UndoReport) -> set[str]:
        kept: set[str] = set()
        for entry in members:
            if verify is None or entry.previous is None or not (entry.store or entry.replicas):
                continue
            for version in entry.previous_versions:
                why = verify(entry.model, version)
                if why:
                    where = ", ".join(entry.replicas) or "no replica yet"
                    report.failed.append(f"{why}: {entry.model} left as it serves now ({where})")
                    kept.add(entry.model)
                    break
        return kept

    def _follow(self, entry: Entry, moving: set[str], fleet: Fleet, report: UndoReport) -> None:
        if entry.previous is None:
            change = Change(entry.model, None)  # new: it goes before its members
        else:
            pins = {m: "-1" for m in ensemble_pins(entry.previous) if m in moving}
            if not pins:
                return
            versions = list(entry.previous_versions) or ["1"]
            text = desired_config(entry.previous, versions, self.gpu, pins)
            change = Change(entry.model, text, tuple(versions))
        kept = [u for u in entry.replicas if entry.previous is None and fleet.served_before(u, entry.model)]
        for url in entry.replicas:
            if url not in kept:  # what served there before this promotion is never unloaded
                _note(report, fleet.restore(url, change), "")
        if entry.previous is None:
            entry.replicas[:] = kept  # the others unloaded already; the kept ones checked later

    def _put_back(self, entry: Entry, fleet: Fleet, store: RepositoryStore, report: UndoReport) -> None:
        if entry.store:
            _note(report, _write_back(store, entry), "")
        back = entry.back()
        for url in entry.replicas:
            if entry.previous is None and fleet.served_before(url, entry.model):
                _keep(report, fleet, url, entry.model)  # never unload what served before
                continue
            _note(report, fleet.restore(url, back), "")
        if entry.store or entry.replicas:
            report.restored.append(back.describe())


def _note(report: UndoReport, failure: str, done: str) -> None:
    if failure:
        report.failed.append(failure)
    elif done:
        report.restored.append(done)


def _keep(report: UndoReport, fleet: Fleet, url: str, model: str) -> None:
    """``model`` new to the store but served at ``url`` before this promotion (from another
    repository): left loaded; the report says whether it still serves what it served."""
    before = fleet.served_before(url, model)
    try:
        now = ready_versions(fleet.target(url).model_states(), model)
    except MlregError as exc:
        report.failed.append(f"{url}: {model} cannot be checked: {exc.message}")
        return
    if set(before) <= set(now):
        report.restored.append(
            f"{model} left as it served at {url} (v{','.join(before)}, not from this store)"
        )
    else:
        report.failed.append(
            f"{url}: {model} no longer serves v{','.join(before)} (it served it before this promotion, "
            "from outside the environment's store)"
        )


def _write_back(store: RepositoryStore, entry: Entry) -> str:
    try:
        if entry.previous is None:
            store.delete(f"{entry.model}/config.pbtxt")
        else:
            store.write_config(entry.model, entry.previous)
    except MlregError as exc:
        return f"{store.uri}: {entry.model}/config.pbtxt: {exc.message}"
    return ""


def _delete_version(store: RepositoryStore, model: str, version: str) -> str:
    try:
        store.delete_version(model, version)
    except MlregError as exc:
        return f"{store.uri}: {model}/{version}: {exc.message}"
    return ""
