"""The staged roll-out's rig for unit tests: fake replicas behind a real Fleet (a local store) and
an undo log, as the deployer uses them (the same rig as tests/unit/test_rollout.py's, shared here
because a test module never imports another)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.plan import Role, Step
from pipelines.core.policy import Policy
from pipelines.core.undo import UndoLog
from pipelines.fleet.fleet import Change, Fleet
from pipelines.rollout.staged import Move, StagedRollout
from pipelines.storage import open_store
from pipelines.triton import metrics
from registry.errors import PromotionError, TritonError
from tests.fakes import Call, FakeTarget, Handler

CONFIG = 'name: "m"\nbackend: "python"\nversion_policy { specific { versions: [ 2 ] } }\n'
OLD_CONFIG = CONFIG.replace("[ 2 ]", "[ 1 ]")
URLS = [f"r{i}:8001" for i in range(4)]


Log = list[tuple[str, str, bool]]  # (url, model or "unload <model>", sent a config override)


def _replica(log: Log, dead: bool) -> Handler:
    """A replica's handler: each load and unload written to ``log``; a dead one refuses all."""

    def handle(target: FakeTarget, call: Call) -> None:
        if dead:
            what = {"is_live": "live check"}.get(call.method, call.method)
            raise TritonError(f"{what} failed on {call.url}: connection refused", fix="start it")
        if call.method == "load":
            log.append((call.url, call.model, call.config is not None))
        elif call.method == "unload":
            log.append((call.url, f"unload {call.model}", False))

    return handle


def _fleet(dead: set[str] | None = None) -> tuple[dict[str, FakeTarget], Log]:
    log: Log = []
    # a replica answers ready for whatever version it is asked about: these tests judge the order of
    # the moves and their undo, and their moves' versions need not match the configs they send
    replicas = {u: FakeTarget(u, _replica(log, u in (dead or set())), ready=lambda *_: True) for u in URLS}
    return replicas, log


def _opener(replicas: dict[str, FakeTarget]) -> Callable[[str], Any]:
    return replicas.__getitem__


def _snapshot(new_ok: float, new_failed: float, old_ok: float) -> metrics.Snapshot:
    return {
        ("m", "2"): metrics.Counters(new_ok, new_failed, (new_ok + new_failed) * 100),
        ("m", "1"): metrics.Counters(old_ok, 0, old_ok * 100),
    }


def _step(model: str, text: str, previous: str | None, previous_versions: list[str]) -> Step:
    return Step(model, "2", Role.MODEL, None, text, previous, previous_versions, upload=False)


def _move(
    model: str, text: str, versions: list[str], previous: str | None = None, baked_old: tuple[str, ...] = ()
) -> Move:
    step = _step(model, text, previous, ["1"] if previous else [])
    return Move(step, Change(model, text, tuple(versions)), baked_old)


class Rig:
    """Fake replicas behind a real Fleet (a local store) and an undo log, as the deployer uses them."""

    def __init__(self, tmp_path: Path, policy: Policy, dead: set[str] | None = None, **kwargs: Any) -> None:
        self.replicas, self.log = _fleet(dead)
        store = open_store(tmp_path / "store")
        source = tmp_path / "version"
        source.mkdir()
        (source / "model.py").write_text("x = 1\n")
        for model in ("m", "e", "n"):  # a real Fleet loads only versions the store verifies
            for version in ("1", "2"):
                store.versions.put_version(model, version, source)
        self.undo = UndoLog(gpu=False, journal=store.session)
        self.fleet = Fleet(store, URLS, _opener(self.replicas), 10, policy.max_parallel, undo=self.undo)
        self.staged = StagedRollout(URLS, self.fleet, policy, **kwargs)
        # these moves' versions need not match their configs (see _fleet): the restart watch, which
        # reads what each replica holds against them, would take that for a restart (test_restart.py)
        self.staged.watch.check = lambda urls, moves: None  # type: ignore[method-assign]

    def run_and_undo(self, moves: list[Move]) -> PromotionError:
        """The roll-out fails; the runner's replay of the undo log follows (as on_error does)."""
        self.undo.plan(m.step for m in moves)
        for move in moves:  # each replica serves the version a model had in the store before
            for replica in self.replicas.values():
                if move.step.previous_config is not None:
                    replica.states[move.step.model] = {v: "READY" for v in move.step.previous_versions}
        with pytest.raises(PromotionError) as info:
            self.staged.run(moves)
        self.report = self.undo.replay(self.fleet, self.fleet.store)
        return info.value
