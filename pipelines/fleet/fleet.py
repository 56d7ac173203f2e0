"""The one object that changes an environment's servers: ``Fleet``.

Every change of what a server holds is a ``Change`` (pipelines/core/changes.py) -- a model's config
(sent with the load as a per-replica override, or read by the replica from the store) and the
versions that must be READY after it -- and goes through two calls: ``Fleet.move(url, change)``
(raises, recorded in a ``Rollout``) and ``Fleet.restore(url, change)`` (returns what could not be
put back).  ``Fleet.apply`` writes a config to the store once, then moves every target: the first
is the canary, the others follow one by one, or ``parallel`` at a time; the first failure is raised.

The Fleet moves and composes the parts that each answer one question about a move:

- ``view`` (view.py ``ServerView``): what each server holds, asked once per promotion (taken by
  ``refresh`` in ``resolve`` under the locks) and kept up to date with the fleet's own moves; only
  ``verify`` and the wait loops ask again; after a load the view keeps the versions the replica
  kept serving (the ones the loaded config still lists) beside the ones waited for;
- ``admission`` (admission.py ``Admission``): whether a load is sent at all (a replica fenced off,
  stored files that do not verify, the load guard's refusal), and the guard told how it went;
- ``recreations`` (recreations.py ``Recreations``): the serving versions a load re-created;
- ``sender`` (sender.py ``Sender``): one change sent to one server and waited for, the view and the
  deployment ledger told;
- ``putback`` (putback.py ``PutBack``): a replica put back to an earlier state, also behind a late
  load or after it dropped.

A Fleet that changes anything is given its undo log (``undo``, a constructor argument): ``move``
tells it what the server held before its first change of ``model`` (``touched``) -- whoever moves
it (deployer, staged roll-out, gate, retire) -- and every store config ``apply`` or
``write_config`` writes is noted in it before the write.  A Fleet without one (a read-only user:
status, a probe) refuses every change (``NoUndoLog``): a forgotten log is an error, never a change
that cannot be undone.  ``restore`` (the undo itself) tells nobody.  Deployers and gates ask the
fleet (``release``, ``discard``); they never edit the log.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from pipelines.core.changes import Change, Rollout, States, TargetResult, loading_versions, ready_versions
from pipelines.core.check import LoadGuard
from pipelines.core.ports import ServingTarget
from pipelines.fleet.admission import Admission
from pipelines.fleet.putback import PutBack, Queued
from pipelines.fleet.recreations import Recreations
from pipelines.fleet.replicas import HUNG_LOADS, Connect, hung_loads, note_hung_load
from pipelines.fleet.sender import Sender
from pipelines.fleet.view import ServerView
from pipelines.storage.base import Repository
from registry.errors import MlregError, PromotionError

if TYPE_CHECKING:
    from pipelines.ledger.recorder import Recorder

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


READY_BY_NAME_CAP = 512  # ModelReady questions one keyless read may ask of a replica


def ready_by_name(target: ServingTarget, store: Repository) -> States:
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
        store: Repository,
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
        self.parallel = max(1, parallel)
        self.rollouts: list[Rollout] = []
        self._open: dict[str, ServingTarget] = {}
        self.undo = undo
        self.view = ServerView(self._ask)
        self.sender = Sender(self.target, self.view, load_timeout, ledger)
        self.admission = Admission(store)  # the load guards: memory headroom and leaks (pipelines/guards)
        self.recreations = Recreations(self.target)
        self.putback = PutBack(self.sender, RESTART_WAIT_S)
        # what the parts found, read by the failure report and status (the parts' own dicts)
        self.restored = self.sender.restored  # url -> when (time.time()) its last restore finished
        self.fenced = self.admission.fenced  # url -> why nothing loads there again in this promotion
        self.recreated = self.recreations.found  # (url, model, version) a load re-created
        self.pending = self.putback.pending  # url -> a restore queued behind a late load (the truth)
        self.queued = self.putback.queued  # the same keys: what was queued, checked by confirm_queued
        self.gone = self.putback.gone  # url -> why it was not put back (dropped, never came back)
        self.restarted = self.putback.restarted  # urls that dropped and came back during this promotion

    @property
    def load_timeout(self) -> float:
        """How long a load (or an unload) is waited for, in seconds."""
        return self.sender.load_timeout

    @property
    def ledger(self) -> Recorder | None:
        """Told every load, unload and config update sent (None: no ledger)."""
        return self.sender.ledger

    @property
    def guards(self) -> list[LoadGuard]:
        """Asked around each load, in order (the registered guards' parts: pipelines/guards)."""
        return self.admission.guards

    @property
    def restart_wait(self) -> float:
        """How long a replica that dropped is waited for."""
        return self.putback.restart_wait

    @restart_wait.setter
    def restart_wait(self, seconds: float) -> None:
        self.putback.restart_wait = seconds

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
            self.admission.admit(url, change)
        except MlregError as exc:
            _failed(rollout, url, 0.0, exc)
            raise
        ready = self.ready(url, change.model)
        self._log(f"load {change.describe()} on {url}").touched(url, change.model, tuple(ready))
        kept = [v for v in change.versions if v in ready] if change.config is not None else []
        served = self.recreations.before(url, change.model, kept)
        self._send_watched(url, change, rollout, began)
        self.recreations.after(url, change.model, kept, served)
        if rollout is not None:
            rollout.targets.append(TargetResult(url, True, time.perf_counter() - began))

    def _send_watched(self, url: str, change: Change, rollout: Rollout | None, began: float) -> None:
        """``change`` sent to ``url``, the guard told how the load went (a failure noted in
        ``rollout``, a hung load for ``status``)."""
        started = time.time()
        try:
            self.sender.send(url, change)
        except MlregError as exc:
            _failed(rollout, url, time.perf_counter() - began, exc)
            if exc.context.get("status") == "load-deadline":  # status says since when it loads
                note_hung_load(self.store.objects, change.model, url, change.versions, started)
            self.admission.loaded(url, change, exc)
            raise
        self.admission.loaded(url, change, None)

    def recreation_notes(self) -> list[str]:
        """One line per version a load of this promotion re-created while it served."""
        return self.recreations.notes()

    def restore(self, url: str, change: Change) -> str:
        """Put the server at ``url`` back to ``change`` (an earlier state); returns "" or why not
        (putback.py: a replica still LOADING the model gets it queued behind that load; one that
        dropped is waited for up to ``restart_wait`` s, and named once if it does not come back)."""
        return self.putback.restore(url, change)

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
        self.store.session.write_config(model, text)

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

    def _ask(self, url: str) -> States:
        """What the server at ``url`` holds, asked of it (a keyless plan reads what serves)."""
        target = self.target(url)
        try:
            return target.model_states()
        except MlregError as exc:
            if exc.context.get("status") != "unauthorised":
                raise
            return ready_by_name(target, self.store)

    def states_of(self, url: str) -> States:
        """What the server at ``url`` holds: the view, asked of the server the first time only."""
        return self.view.states_of(url)

    def ready(self, url: str, model: str) -> list[str]:
        """The versions of ``model`` READY at ``url``, from the view (unreachable: none)."""
        return self.view.ready(url, model)

    def refresh(self, urls: Sequence[str] | None = None) -> None:
        """Forget the view of ``urls`` (every target): the next question asks the servers again."""
        self.view.forget(self.urls if urls is None else urls)

    def apply(self, change: Change) -> Rollout:
        """Write ``change``'s config to the store once (None: delete it; noted in the undo log
        first), then move every target, canary first (each move tells the undo log first)."""
        self._log(f"write {change.model}'s config").wrote_config_of(change.model)
        rollout = Rollout(change.model, list(change.versions) if change.config is not None else [])
        self.rollouts.append(rollout)
        if change.config is None:
            self.store.objects.delete(f"{change.model}/config.pbtxt")
        else:
            self.store.session.write_config(change.model, change.config)
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
        if hung_loads(fleet.store.objects, model):
            fleet.store.objects.delete(HUNG_LOADS.format(model=model))


def _failed(rollout: Rollout | None, url: str, seconds: float, exc: MlregError) -> None:
    if rollout is not None:
        rollout.targets.append(TargetResult(url, False, seconds, exc.message))
