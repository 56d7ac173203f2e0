"""Issue 45 review, F2: the late load's line says what was done ("queued the load of v9 behind
it"), never a prediction; a failed promotion then checks, within a bound, what the replica serves
(pipelines/fleet/fleet.confirm_queued) and says it -- or 'not confirmed' with the status command.

Triton 2.51's queue of loads is a fake here (a fault the unit suite cannot provoke for real: a real
server with an initialize that outlives load_timeout is tests/integration/test_swaps.py's test).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pipelines.fleet.fleet import Change, Fleet, confirm_queued, ready_versions
from pipelines.storage import open_store
from registry.errors import TritonError
from tests.fakes import Call, FakeTarget

URL = "localhost:8001"
SERVING = """name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy { specific { versions: [ 9 ] } }
"""
STATUS = "mlreg status --env production"


def _waits(target: FakeTarget, call: Call) -> None:
    if call.method == "load" and "LOADING" in target.states.get(call.model, {}).values():
        raise TritonError(f"{target.url}: load of '{call.model}' still waits behind a running load")


class Queueing(FakeTarget):
    """Triton's queue of a model's loads: ``queue_load`` stays queued behind the running load;
    ``late_load_ends`` lands the late version, then runs what was queued."""

    def __init__(self) -> None:
        super().__init__(URL, _waits)
        self.queued: list[str] = []

    def queue_load(self, model: str, config: str, wait: float) -> bool:
        self.queued.append(config)
        return False

    def late_load_ends(self, run_queued: bool = True) -> None:
        self.states["scorer"] = {v: "READY" for v in self.states["scorer"]}  # the late version lands
        for config in self.queued if run_queued else ():
            versions = json.loads(config)["version_policy"]["specific"]["versions"]
            self.states["scorer"] = {str(int(v)): "READY" for v in versions}
        self.queued.clear()


def _queued(tmp_path: Path, target: Queueing) -> Fleet:
    target.states = {"scorer": {"9": "READY", "12": "LOADING"}}  # v12's load outlived its deadline
    fleet = Fleet(open_store(tmp_path / "store"), [URL], lambda url: target, load_timeout=1.0)
    assert fleet.restore(URL, Change("scorer", SERVING, ("9",))) == ""
    assert fleet.pending[URL] == (
        f"the load of scorer v12 is still running on {URL}; queued the load of v9 behind it "
        "(Triton runs a model's loads in turn)"
    )  # what was done; before: 'when it ends, ... keeps serving v9', a prediction
    return fleet


def test_a_late_load_still_running_is_not_confirmed_and_the_status_command_given(tmp_path: Path) -> None:
    target = Queueing()
    with _queued(tmp_path, target) as fleet:
        confirm_queued(fleet, 0.3, STATUS, interval=0.05)
        assert fleet.pending[URL].endswith(
            f"; not confirmed ({URL} serves scorer v9, scorer v12 still LOADING): check with '{STATUS}'"
        )
    assert target.states["scorer"] == {"9": "READY", "12": "LOADING"}


def test_a_late_load_that_ends_within_the_bound_is_confirmed_from_what_the_replica_serves(
    tmp_path: Path,
) -> None:
    target = Queueing()
    with _queued(tmp_path, target) as fleet:
        timer = threading.Timer(0.1, target.late_load_ends)
        timer.start()
        try:
            confirm_queued(fleet, 5.0, STATUS, interval=0.05)
        finally:
            timer.join(5)
        assert fleet.pending[URL].endswith(f"; confirmed: {URL} serves scorer v9")
    assert ready_versions(target.model_states(), "scorer") == ["9"]


def test_a_queued_load_that_was_lost_says_what_the_replica_serves(tmp_path: Path) -> None:
    """The replica restarted (the queued load died with it) or the queued load never ran: the
    late version landed; the line says so, not 'A keeps serving v9'."""
    target = Queueing()
    with _queued(tmp_path, target) as fleet:
        target.late_load_ends(run_queued=False)
        confirm_queued(fleet, 0.2, STATUS, interval=0.05)
        assert fleet.pending[URL].endswith(
            f"; not confirmed ({URL} serves scorer v9,12: the late v12 landed and was not taken back): "
            f"check with '{STATUS}'"
        )
        target.states = {}  # restarted in explicit mode: serves nothing
        fleet.pending[URL] = "x"
        confirm_queued(fleet, 0.1, STATUS, interval=0.05)
        assert fleet.pending[URL] == (
            f"x; not confirmed ({URL} serves no scorer (the queued load wanted v9)): check with '{STATUS}'"
        )
