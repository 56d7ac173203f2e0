"""The one object that changes an environment's servers: ``Fleet``.

Every change of what a server holds is a ``Change`` -- a model's config (sent with the load as a
per-replica override, or read by the replica from the store) and the versions that must be READY
after it -- and goes through two calls: ``Fleet.move(url, change)`` (raises, recorded in a
``Rollout``) and ``Fleet.restore(url, change)`` (returns what could not be put back).
``Fleet.apply`` writes a config to the store once, then moves every target: the first is the
canary, the others follow one by one, or ``parallel`` at a time; the first failure is raised.

The fleet is asked once per promotion what each server holds (the view, taken by ``refresh`` in
``resolve`` under the locks) and keeps the view up to date with its own moves; only ``verify`` and
the wait loops ask again; after a load the view keeps the versions the replica kept serving (the
ones the loaded config still lists) beside the ones waited for.

A Fleet that changes anything is given its undo log (``undo``, a constructor argument): ``move``
tells it what the server held before its first change of ``model`` (``touched``) -- whoever moves
it (deployer, staged roll-out, gate, retire) -- and every store config ``apply`` or
``write_config`` writes is noted in it before the write.  A Fleet without one (a read-only user:
status, a probe) refuses every change (``NoUndoLog``): a forgotten log is an error, never a change
that cannot be undone.  ``restore`` (the undo itself) tells nobody.  Deployers and gates ask the
fleet (``release``, ``discard``); they never edit the log.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pipelines.core.plan import serving_versions
from pipelines.core.ports import ServingTarget
from pipelines.fleet.replicas import HUNG_LOADS, Connect, hung_loads, note_hung_load
from pipelines.storage.base import RepositoryStore
from registry.contracts.config import config_json
from registry.errors import MlregError, PromotionError

if TYPE_CHECKING:
    from pipelines.ledger.recorder import Recorder

States = dict[str, dict[str, str]]  # model -> version -> state, as Triton's repository index says
QUEUE_WAIT_S = 2.0  # how long a restore queued behind a late load is waited for before it is left queued
CONFIRM_S = 5.0  # how long a failed promotion checks what a replica with a queued restore serves
RESTART_WAIT_S = (
    30.0  # a replica that dropped: a restarted tritonserver is live in < 1 s, its pod in ~10-30 s
)
PAUSE_VARIABLE = "MLREG_TEST_PAUSE_AT"
RESUME_VARIABLE = "MLREG_TEST_RESUME_FILE"


def checkpoint(point: str) -> None:
    """A debug hook only tests turn on: with ``MLREG_TEST_PAUSE_AT=<point>`` the process says where it
    is on stderr and stops there, so a test can SIGKILL it at a known point of the promotion."""
    if os.environ.get(PAUSE_VARIABLE) == point:
        sys.stderr.write(f"mlreg-test: paused at {point}\n")
        sys.stderr.flush()
        resume = os.environ.get(RESUME_VARIABLE)  # with it: goes on once that file exists
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
            time.sleep(0.1 if resume else 3600)


class UndoNotes(Protocol):
    """What a Fleet tells its undo log (pipelines/core/undo.py ``UndoLog``), and the two things it
    asks of it."""

    def touched(self, url: str, model: str, ready: tuple[str, ...]) -> None:
        """The replica's before-state: ``ready`` at ``url`` before this operation's first change."""
        ...

    def wrote_config_of(self, model: str) -> None:
        """The store's config of ``model`` is about to be written (or deleted)."""
        ...

    def release(self, url: str, fleet: Fleet) -> str:
        """``url`` put back to its before-state and no longer the log's to put back ("" or why not)."""
        ...

    def forget(self, model: str) -> None:
        """``model`` (a private name, unloaded again) no longer the log's to put back."""
        ...


class NoUndoLog(PromotionError):
    """A change asked of a Fleet built without an undo log: refused before anything is sent."""


@dataclass(frozen=True)
class Change:
    """What one model becomes on a server: ``config`` (None: unloaded) with ``versions`` READY."""

    model: str
    config: str | None
    versions: tuple[str, ...] = ()
    override: bool = True  # sent with the load; False: the server reads the store's config
    files: Mapping[str, bytes] | None = None  # the model's own files, sent with the load
    retired: tuple[str, ...] = ()  # versions that must be unloaded after it (waited for)

    def describe(self) -> str:
        return f"{self.model} -> v{','.join(self.versions) or 'none'}"


class LoadGuard(Protocol):
    """What checks a replica around each load (pipelines/guards/headroom.py): ``before_load``
    raises (an ``MlregError`` naming the replica and the fix) to refuse a load before anything is
    sent; ``after_load`` hears how it went (``error`` None: every wanted version READY) and returns
    why the replica must not be loaded again in this promotion ("" when it may)."""

    def before_load(self, url: str, change: Change) -> None: ...

    def after_load(self, url: str, change: Change, error: MlregError | None) -> str: ...


@runtime_checkable
class QueuesLoads(Protocol):
    """A target that can send a load and stop waiting for it (``TritonControl.queue_load``)."""

    def queue_load(self, model: str, config: str, wait: float) -> bool: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...


@dataclass
class TargetResult:
    url: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Rollout:
    """One model's change over the fleet: the config written once, then each target."""

    model: str
    versions: list[str]  # READY on every target afterwards ([] : unloaded)
    targets: list[TargetResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "versions": self.versions,
            "targets": [t.__dict__ for t in self.targets],
        }


READY_BY_NAME_CAP = 512  # ModelReady questions one keyless read may ask of a replica


def ready_by_name(target: ServingTarget, store: RepositoryStore) -> States:
    """What a replica whose repository index needs the control key this process does not hold
    serves (a plan's keyless ``--dry-run`` against locked replicas): each store model's version
    folders asked by ``ModelReady``, which a locked replica answers to anyone (it reads, never
    loads), bounded by ``READY_BY_NAME_CAP``.  Only READY versions are seen; a load this needs
    the key for is refused at the load itself."""
    states: States = {}
    pairs = [(m, v) for m in store.list_models() for v in store.list_versions(m)][:READY_BY_NAME_CAP]
    for model, version in pairs:
        if target.is_ready(model, version):
            states.setdefault(model, {})[version] = "READY"
    return states


class Fleet:
    """The servers of one environment, and the store whose configs they load.  ``undo``: the log
    every change is noted in first (None: a read-only fleet, which refuses every change);
    ``ledger``: told every load, unload and config update sent (pipelines/ledger)."""

    def __init__(
        self,
        store: RepositoryStore,
        urls: Sequence[str],
        connect: Connect,
        load_timeout: float,
        parallel: int = 1,
        *,
        undo: UndoNotes | None = None,
        ledger: Recorder | None = None,
    ) -> None:
        self.store = store
        self.urls = tuple(urls)
        self.connect = connect
        self.load_timeout = load_timeout
        self.parallel = max(1, parallel)
        self.rollouts: list[Rollout] = []
        self._open: dict[str, ServingTarget] = {}
        self.view: dict[str, States] = {}  # url -> what it holds, as last asked and moved since
        self.undo = undo
        self.ledger = ledger
        self.restored: dict[str, float] = {}  # url -> when (time.time()) its last restore finished
        self.guard: LoadGuard | None = None  # memory headroom and leaks (pipelines/guards/headroom.py)
        self.fenced: dict[str, str] = {}  # url -> why nothing loads there again in this promotion
        self.recreated: dict[tuple[str, str, str], None] = {}  # (url, model, version) a load re-created
        self.pending: dict[str, str] = {}  # url -> a restore queued behind a late load (the truth to say)
        self.queued: dict[str, Queued] = {}  # the same keys: what was queued, checked by confirm_queued
        self.restart_wait = RESTART_WAIT_S  # how long a replica that dropped is waited for
        self.gone: dict[str, str] = {}  # url -> why it was not put back (dropped, never came back)
        self.restarted: dict[str, None] = {}  # urls that dropped and came back during this promotion

    def target(self, url: str) -> ServingTarget:
        if url not in self._open:
            self._open[url] = self.connect(url)
        return self._open[url]

    def close(self) -> None:
        for target in self._open.values():
            target.close()
        self._open.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the two ways a server changes -----------------------------------------------------------

    def move(self, url: str, change: Change, rollout: Rollout | None = None) -> None:
        """``change`` on the server at ``url``: loaded and every wanted version READY (or raises).
        Never once the promotion lost the model's lock (the store's fence: its lease proven first),
        never without an undo log (``NoUndoLog``)."""
        self._log(f"load {change.describe()} on {url}")
        self.store.session.fence(change.model)
        began = time.perf_counter()
        try:
            self._admit(url, change)
        except MlregError as exc:
            _failed(rollout, url, 0.0, exc)
            raise
        kept, served = self._before_send(url, change)
        self._send_guarded(url, change, rollout, began)
        if served:
            self._check_kept(url, change.model, kept, served)
        if rollout is not None:
            rollout.targets.append(TargetResult(url, True, time.perf_counter() - began))

    def _before_send(self, url: str, change: Change) -> tuple[list[str], dict[str, int]]:
        """What ``url`` holds READY told to the undo log; the wanted versions it keeps serving, and
        the requests each has answered (to tell a version the load re-created)."""
        ready = self.ready(url, change.model)
        self._log(f"load {change.describe()} on {url}").touched(url, change.model, tuple(ready))
        kept = [v for v in change.versions if v in ready] if change.config is not None else []
        return kept, self._served(url, change.model) if kept else {}

    def _send_guarded(self, url: str, change: Change, rollout: Rollout | None, began: float) -> None:
        """``change`` sent to ``url``, the guard told how the load went (a failure noted in
        ``rollout``, a hung load for ``status``)."""
        guard = self.guard if change.config is not None else None
        started = time.time()
        try:
            self._send(url, change)
        except MlregError as exc:
            _failed(rollout, url, time.perf_counter() - began, exc)
            if exc.context.get("status") == "load-deadline":  # status says since when it loads
                note_hung_load(self.store, change.model, url, change.versions, started)
            if guard is not None:
                self._fence(url, guard.after_load(url, change, exc))
            raise
        if guard is not None:
            self._fence(url, guard.after_load(url, change, None))

    def _admit(self, url: str, change: Change) -> None:
        """Raise before anything is sent when ``url`` is fenced off or the guard refuses it."""
        if url in self.fenced:
            raise PromotionError(
                f"{url} is fenced off for this promotion: {self.fenced[url]}",
                fix="restart that replica (its memory comes back), then promote again",
            )
        if change.config is not None and change.versions and change.files is None:
            self.store.verify_load(change.model, change.versions, change.config)  # every one it names
        if self.guard is not None and change.config is not None:
            self.guard.before_load(url, change)

    def _check_kept(self, url: str, model: str, kept: list[str], served: dict[str, int]) -> None:
        """The versions a load kept serving whose counters restarted: Triton made them anew."""
        after = self._served(url, model)
        for version in kept:
            if served.get(version, 0) > after.get(version, 0):
                self.recreated[(url, model, version)] = None

    def _served(self, url: str, model: str) -> dict[str, int]:
        """version -> requests it answered (Triton's statistics, which a version re-created by a
        load starts again from zero; {} when the server does not say)."""
        try:
            stats = self.target(url).statistics(model)
        except MlregError:
            return {}
        counts = {}
        for entry in stats:
            if entry.get("name") == model:
                answered = entry.get("inference_stats") or {}
                counts[str(entry.get("version", ""))] = sum(
                    int((answered.get(kind) or {}).get("count", 0) or 0) for kind in ("success", "fail")
                )
        return counts

    def recreation_notes(self) -> list[str]:
        """One line per version a load of this promotion re-created while it served."""
        return [
            f"{url}: the load re-created {model} v{version}, which was serving (its statistics "
            "restarted): Triton re-creates a loaded version whose config changed beyond "
            "version_policy/instance_group, or whose files changed"
            for url, model, version in self.recreated
        ]

    def _fence(self, url: str, why: str) -> None:
        if why:
            self.fenced.setdefault(url, why)

    # -- the undo log: told first, asked by the deployers and gates --------------------------------

    def _log(self, what: str) -> UndoNotes:
        """The undo log, or ``NoUndoLog`` naming the change refused (nothing sent, nothing written)."""
        if self.undo is None:
            raise NoUndoLog(
                f"refused to {what}: this fleet has no undo log, so the change could not be put back",
                fix="build the Fleet with undo=UndoLog(...) (pipelines/core/undo.py); a read-only "
                "user never moves a server",
            )
        return self.undo

    def write_config(self, model: str, text: str) -> None:
        """The store's config of ``model`` written, noted in the undo log first."""
        self._log(f"write {model}'s config").wrote_config_of(model)
        self.store.write_config(model, text)

    def release(self, url: str) -> str:
        """``url`` left out of the operation as it served: put back to its before-state by the
        undo log, which then no longer puts it back ("" or why not)."""
        return self._log(f"release {url}").release(url, self)

    def discard(self, url: str, model: str) -> str:
        """``model`` (a private name this operation loaded) unloaded at ``url`` and no longer the
        undo log's to put back ("" or why it could not be unloaded)."""
        log = self._log(f"discard {model} on {url}")
        failure = self.restore(url, Change(model, None))
        log.forget(model)
        return failure

    # -- the view: asked once, kept up to date by the moves ----------------------------------------

    def states_of(self, url: str) -> States:
        """What the server at ``url`` holds: the view, asked of the server the first time only."""
        if url not in self.view:
            target = self.target(url)
            try:
                self.view[url] = target.model_states()
            except MlregError as exc:
                if exc.context.get("status") != "unauthorised":
                    raise
                self.view[url] = ready_by_name(target, self.store)  # a keyless plan reads what serves
        return self.view[url]

    def ready(self, url: str, model: str) -> list[str]:
        """The versions of ``model`` READY at ``url``, from the view (an unreachable server: none,
        its move says why)."""
        try:
            return ready_versions(self.states_of(url), model)
        except MlregError:
            return []

    def refresh(self, urls: Sequence[str] | None = None) -> None:
        """Forget the view of ``urls`` (every target): the next question asks the servers again."""
        for url in self.urls if urls is None else urls:
            self.view.pop(url, None)

    def _moved(self, url: str, change: Change, ok: bool) -> None:
        """The view after a change: its versions READY (none: unloaded); a failed change forgets
        the server's view (what it holds now is asked again when needed)."""
        if not ok:
            self.view.pop(url, None)
            return
        held = self.view.get(url)
        if held is None:
            return
        if change.config is None:
            held.pop(change.model, None)
        else:
            held[change.model] = {v: "READY" for v in kept_after(held, change)}

    def restore(self, url: str, change: Change) -> str:
        """Put the server at ``url`` back to ``change`` (an earlier state); returns "" or why not.
        A replica still LOADING the model (a load past its deadline) gets ``change`` queued behind
        that load (``_queue_behind``): the late version never takes traffic when its load ends.  A
        replica that dropped (crashed, restarting) is waited for up to ``restart_wait`` s, then put
        back; one that does not come back is named once, and not asked again in this promotion."""
        if url in self.gone:
            return self.gone[url]
        try:
            states = self._states_back(url)
            loading = loading_versions(states, change.model)
            if loading and change.config is not None:
                self.view.pop(url, None)
                return self._queue_behind(url, change, loading, ready_versions(states, change.model))
            member = _loading_member(change, states)
            if member:  # an ensemble's load waits for its member's (measured on 2.51): queued too
                self.view.pop(url, None)
                return self._queue_ensemble(url, change, member, loading_versions(states, member))
            self._send(url, change, undo=True)
        except MlregError as exc:
            why = exc.message if exc.message.startswith(url) else f"{url}: {exc.message}"
            if dropped(exc):
                self.gone[url] = why = (
                    f"{why} (waited {self.restart_wait:.0f}s for it to come back: it did not; what it "
                    "serves once it is back is what it loads at start)"
                )
            return why
        return ""

    def _states_back(self, url: str) -> States:
        """What ``url`` holds now, asked of it; a replica that dropped waited for (``restart_wait``)
        first -- it comes back as it starts (explicit mode: serving nothing), noted in ``restarted``."""
        target = self.target(url)
        try:
            return target.model_states()
        except MlregError as exc:
            if not dropped(exc) or not wait_back(target, self.restart_wait):
                raise
        self.view.pop(url, None)
        self.restarted.setdefault(url, None)
        return target.model_states()

    def _queue_ensemble(self, url: str, change: Change, member: str, loading: list[str]) -> str:
        """An ensemble's earlier config sent behind its ``member``'s load still running at ``url``:
        Triton makes it wait for that load, so it is left queued (the ensemble serves as it is
        meanwhile) and its truth kept in ``pending``."""
        target = self.target(url)
        assert change.config is not None
        if _pins(change).get(member) == -1:  # following the member's latest: it would follow the late
            return ""  # version when that lands; the undo's own put-back (pinned) is queued next
        if not isinstance(target, QueuesLoads):
            return f"{url}: {member} v{','.join(loading)} is still LOADING: {change.model} not put back"
        try:
            done = target.queue_load(change.model, config_json(change.config, change.model), QUEUE_WAIT_S)
        except MlregError as exc:
            return f"{url}: {change.model} could not be queued behind {member}'s load: {exc.message}"
        self._told(url, change, (), True, "ok" if done else "queued")
        if not done:
            key = f"{url} {change.model}"
            self.pending[key] = (
                f"queued {change.model}'s earlier config (v{','.join(change.versions)}) on {url} behind "
                f"the load of {member} v{','.join(loading)}, still running there"
            )
            self.queued[key] = Queued(url, change.model, (), tuple(change.versions), behind=member)
        return ""

    def _queue_behind(self, url: str, change: Change, loading: list[str], ready: list[str]) -> str:
        """``change`` (what ``url`` held before) sent as a load behind the one still running there:
        Triton runs a model's loads one after the other, so when the late load ends the load that
        names only the held versions unloads the late one (an unload would take the model down,
        the held versions with it: measured on 2.51).  Returns "" (the truth kept in ``pending``)
        or why it could not be queued."""
        target = self.target(url)
        late, held = ",".join(loading), ",".join(change.versions)
        if not isinstance(target, QueuesLoads) or change.config is None:
            return (
                f"{url}: {change.model} v{late} is still LOADING (a load that never finished): "
                "not put back; restart that replica"
            )
        try:
            done = target.queue_load(change.model, config_json(change.config, change.model), QUEUE_WAIT_S)
        except MlregError as exc:
            return (
                f"{url}: {change.model} v{late} is still LOADING and the load of v{held} could not be "
                f"queued behind it ({exc.message}): when it ends v{late} may serve; restart that replica"
            )
        self._told(url, change, (), True, "ok" if done else "queued")
        if done:
            for version in change.versions:
                target.wait_ready(change.model, version, timeout=self.load_timeout)
            return ""
        self.pending[url] = (
            f"the load of {change.model} v{late} is still running on {url}; queued the load of v{held} "
            "behind it (Triton runs a model's loads in turn)"
        )
        self.queued[url] = Queued(url, change.model, tuple(loading), tuple(change.versions))
        return ""

    def _send(self, url: str, change: Change, undo: bool = False) -> None:
        before = tuple(ready_versions(self.view.get(url, {}), change.model))  # () when not known
        try:
            self._load(url, change)
        except BaseException as exc:
            self._moved(url, change, ok=False)
            self._told(url, change, before, undo, "failed", getattr(exc, "message", type(exc).__name__))
            raise
        self._moved(url, change, ok=True)
        if undo:  # an aborted promotion's time to safe (pipelines/promote/verdicts.py)
            self.restored[url] = time.time()
        self._told(url, change, before, undo, "ok")

    def _told(
        self, url: str, change: Change, before: tuple[str, ...], undo: bool, result: str, detail: str = ""
    ) -> None:
        """The deployment ledger told of one call sent to ``url`` (it never raises)."""
        if self.ledger is not None:
            unload = change.config is None
            self.ledger.sent(
                url,
                change.model,
                change.versions,
                before,
                unload=unload,
                result=result,
                detail=detail,
                undo=undo,
            )

    def _load(self, url: str, change: Change) -> None:
        target = self.target(url)
        if change.config is None:
            target.unload(change.model)
            return
        override = config_json(change.config, change.model) if change.override else None
        if change.files is None:
            target.load(change.model, config=override)
        else:
            target.load(change.model, config=override, files=change.files)
        for version in change.versions:
            target.wait_ready(change.model, version, timeout=self.load_timeout)
        if change.retired and not self._unloaded(target, change.model, change.retired):
            # Triton compares the store file's modification time (one-second resolution on S3):
            # a config written twice within a second reads as unchanged; sent with the load, it is read
            target.load(change.model, config=config_json(change.config, change.model))
            if not self._unloaded(target, change.model, change.retired):
                still = ",".join(
                    v for v in change.retired if v in ready_versions(target.model_states(), change.model)
                )
                raise PromotionError(
                    f"{url}: {change.model} v{still} still serves after its retire "
                    f"({self.load_timeout:.0f}s)",
                    fix="read the server log; a rerun retires it again",
                )

    def _unloaded(self, target: ServingTarget, model: str, versions: tuple[str, ...]) -> bool:
        """Wait (up to the load timeout) until none of ``versions`` of ``model`` is READY, as a load
        waits for READY: Triton unloads asynchronously."""
        deadline = time.monotonic() + self.load_timeout
        while set(versions) & set(ready_versions(target.model_states(), model)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def apply(self, change: Change) -> Rollout:
        """Write ``change``'s config to the store once (None: delete it; noted in the undo log
        first), then move every target, canary first (each move tells the undo log first)."""
        self._log(f"write {change.model}'s config").wrote_config_of(change.model)
        rollout = Rollout(change.model, list(change.versions) if change.config is not None else [])
        self.rollouts.append(rollout)
        if change.config is None:
            self.store.delete(f"{change.model}/config.pbtxt")
        else:
            self.store.write_config(change.model, change.config)
        checkpoint(f"config-written:{change.model}")

        self.each(lambda url: self.move(url, change, rollout))
        checkpoint(f"loaded:{change.model}")
        return rollout

    def each(self, work: Callable[[str], None], urls: Sequence[str] | None = None) -> None:
        """``work(url)`` on the first target, then on the others (``parallel`` at a time)."""
        urls = self.urls if urls is None else tuple(urls)
        for url in urls[:1]:
            work(url)
        rest = urls[1:]
        if self.parallel > 1 and len(rest) > 1:
            with ThreadPoolExecutor(min(self.parallel, len(rest))) as pool:
                for future in [pool.submit(work, u) for u in rest]:
                    future.result()
            return
        for url in rest:
            work(url)

    # -- probes --------------------------------------------------------------------------------

    def states(self) -> dict[str, dict[str, dict[str, str]] | MlregError]:
        """url -> model -> version -> state; an unreachable target is its error (probed in parallel)."""

        def probe(url: str) -> dict[str, dict[str, str]] | MlregError:
            try:
                return self.states_of(url)
            except MlregError as exc:
                return exc

        with ThreadPoolExecutor(max(1, min(16, len(self.urls)))) as pool:
            return dict(zip(self.urls, pool.map(probe, self.urls), strict=True))

    def serving(self, model: str) -> dict[str, list[str]]:
        """url -> the versions of ``model`` READY there (raises when a target is unreachable)."""
        return {url: ready_versions(self.states_of(url), model) for url in self.urls}

    def serve_exactly(self, wanted: dict[str, str]) -> bool:
        """Every target serves exactly version ``v`` of each ``model: v`` (the no-op test)."""
        self.states()  # the targets asked in parallel, once
        for url in self.urls:
            states = self.states_of(url)
            if any(ready_versions(states, model) != [version] for model, version in wanted.items()):
                return False
        return True

    def live_pins(self, url: str, ensemble: str) -> dict[str, str] | None:
        """The member versions ``ensemble`` pins as loaded at ``url`` (None: not READY there)."""
        target = self.target(url)
        if not ready_versions(self.states_of(url), ensemble):
            return None
        steps = target.model_config(ensemble).get("ensemble_scheduling", {}).get("step", [])
        return {s["model_name"]: str(int(s.get("model_version", -1))) for s in steps}

    def check_live(self) -> None:
        for url in self.urls:
            self.target(url).is_live()

    def only(self, urls: Sequence[str]) -> None:
        """Narrow the fleet to ``urls`` (the reachable ones); the others' connections closed."""
        for url in self.urls:
            if url not in urls and url in self._open:
                self._open.pop(url).close()
        self.urls = tuple(u for u in self.urls if u in urls)


def _loading_member(change: Change, states: States) -> str:
    """A model ``change``'s (ensemble) config pins that is still LOADING in ``states`` ("": none)."""
    return next((m for m in _pins(change) if loading_versions(states, m)), "")


def _pins(change: Change) -> dict[str, int]:
    """member -> the version ``change``'s ensemble config pins ({} for another model)."""
    if change.config is None or "ensemble_scheduling" not in change.config:
        return {}
    steps = json.loads(config_json(change.config, change.model)).get("ensemble_scheduling", {})
    return {str(s.get("model_name", "")): int(s.get("model_version", -1)) for s in steps.get("step", [])}


@dataclass(frozen=True)
class Queued:
    """A restore queued behind a late load: at ``url``, ``model`` should end serving ``held``
    (and none of ``late``, the versions whose load outlived its deadline)."""

    url: str
    model: str
    late: tuple[str, ...]
    held: tuple[str, ...]
    behind: str = ""  # the model whose late load it waits for ("": ``model`` itself)


def confirm_queued(fleet: Fleet, wait: float, status: str, interval: float = 0.25) -> None:
    """Each restore queued behind a late load (``fleet.pending``) checked within ``wait`` s: its
    line ends with what the replica serves when asked (the queued load done: confirmed), else
    'not confirmed' and ``status``, the command that tells (issue 45 review, F2).  The late
    version may answer between its load's end and the queued load's (Triton's window)."""
    deadline = time.monotonic() + wait
    for key, queued in fleet.queued.items():
        while True:
            said, done = _outcome(fleet, queued)
            if done or time.monotonic() >= deadline:
                break
            time.sleep(interval)
        fleet.pending[key] += f"; {said}" if done else f"; not confirmed ({said}): check with '{status}'"


def _outcome(fleet: Fleet, queued: Queued) -> tuple[str, bool]:
    """What ``queued.url`` serves of the model now, and whether the queued restore is done."""
    try:
        index = fleet.target(queued.url).model_states()
    except MlregError as exc:
        return f"{queued.url} cannot be asked: {exc.message}", False
    states, behind = index.get(queued.model, {}), queued.behind or queued.model
    ready = ready_versions(index, queued.model)
    serves = (
        f"{queued.url} serves {queued.model} v{','.join(ready)}"
        if ready
        else f"{queued.url} serves no {queued.model}"
    )
    loading = loading_versions(index, behind) + (
        loading_versions(index, queued.model) if queued.behind else []
    )
    if loading:
        return f"{serves}, {behind} v{','.join(loading)} still LOADING", False
    if any(states.get(v) == "READY" for v in queued.late):
        return f"{serves}: the late v{','.join(queued.late)} landed and was not taken back", False
    if sorted(ready) == sorted(queued.held):
        return f"confirmed: {serves}", True
    return f"{serves} (the queued load wanted v{','.join(queued.held)})", False


def dropped(exc: MlregError) -> bool:
    """``exc`` says the replica cannot be reached (gRPC UNAVAILABLE: nothing listens, the connection
    closed mid-call) -- a crash or a restart -- not that it refused (a missing control key)."""
    status = exc.context.get("status")
    return status == "StatusCode.UNAVAILABLE"


def wait_back(target: ServingTarget, wait: float, interval: float = 0.25) -> bool:
    """Whether ``target`` answers a liveness check again within ``wait`` s (polled)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            if target.is_live():
                return True
        except MlregError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def kept_after(states: States, change: Change) -> list[str]:
    """What a replica holds READY of ``change.model`` after its load of ``change`` (a config): the
    versions it held that the config still lists (Triton keeps serving them; none when the config
    lists none: it names no specific versions) beside the ones waited for, less the retired."""
    listed = set(serving_versions(change.config))
    kept = {v for v in ready_versions(states, change.model) if v in listed} | set(change.versions)
    return sorted(kept - set(change.retired), key=int)


def ready_versions(states: dict[str, dict[str, str]], model: str) -> list[str]:
    return sorted((v for v, s in states.get(model, {}).items() if s == "READY"), key=int)


def loading_versions(states: dict[str, dict[str, str]], model: str) -> list[str]:
    """The versions of ``model`` Triton is still loading (a load that has not finished)."""
    return sorted((v for v, s in states.get(model, {}).items() if s == "LOADING" and v), key=int)


def refuse_pending_loads(fleet: Fleet, models: Sequence[str], clear: bool = True) -> None:
    """Refuse a promotion on a replica where one of ``models`` is still LOADING: Triton honours
    every queued load, so a new one waits behind a load that may never finish (one that hung past
    its deadline in an earlier promotion).  ``clear``: a model loading nowhere any more loses its
    note of a hung load (``note_hung_load``)."""
    loading_anywhere: set[str] = set()
    for url in fleet.urls:
        try:
            states = fleet.states_of(url)
        except MlregError:
            loading_anywhere.update(models)  # unknown: its note stays
            continue
        for model in models:
            loading = loading_versions(states, model)
            if loading:
                raise PromotionError(
                    f"{url}: {model} v{','.join(loading)} is still LOADING there (a load that has not "
                    "finished; a new load would wait behind it)",
                    fix=f"read that replica's log for why {model} v{loading[0]} does not finish loading; "
                    "restart the replica (what the store wants loads again), then promote again",
                    model=model,
                )
    for model in set(models) - loading_anywhere if clear else ():
        if hung_loads(fleet.store, model):
            fleet.store.delete(HUNG_LOADS.format(model=model))


def _failed(rollout: Rollout | None, url: str, seconds: float, exc: MlregError) -> None:
    if rollout is not None:
        rollout.targets.append(TargetResult(url, False, seconds, exc.message))
