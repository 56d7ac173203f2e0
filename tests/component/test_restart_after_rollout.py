"""Issue 45 review, F9: a replica that restarts after the roll-out's last check (during verify) is
named by verify as a restart, not a bare 'not READY'; a replica that drops and never comes back is
waited for once (the roll-out's check) and named once -- the abort's put-back does not wait again.

In tests/unit/worlds.py's world (a real local store, tests/fakes.py's Tritons): a restart is a fake
replica's index emptied (explicit mode: a restarted tritonserver serves nothing), a drop a replica
answering gRPC UNAVAILABLE -- faults the unit suite cannot provoke on a real server
(tests/integration/test_restart.py's stand-in fleet crashes real processes).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.fleet.fleet import Change, Fleet
from pipelines.fleet.restarts import RestartWatch
from pipelines.storage import open_store
from registry.errors import PromotionError, TritonError
from tests.fakes import FakeTarget
from tests.unit.worlds import MEMBER, World

URL = "t9:8001"
CONFIG = (
    'name: "net"\nbackend: "python"\nmax_batch_size: 0\nversion_policy { specific { versions: [ 1 ] } }\n'
)


def test_a_replica_that_restarts_during_verify_is_named_as_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))

    def on_start(stage: str) -> None:
        if stage == "verify":  # after the roll-out's last check: t1 restarts and serves nothing
            world.fleet.connect("t1:8001").states = {}

    with pytest.raises(PromotionFailed) as failed:
        world.promote("net", "2", on_start=on_start)
    assert (
        "t1:8001: net v2 is not READY: the replica serves no version of net now -- it restarted after "
        "the roll-out"
    ) in failed.value.message, failed.value.message
    assert world.registry.alias_map["net"]["test"] == "1"  # nothing recorded
    assert serving_versions(world.config("net")) == ["1"]  # the store put back


class Gone(FakeTarget):
    """A replica that dropped and never comes back: every call is UNAVAILABLE."""

    def __init__(self) -> None:
        super().__init__(URL)
        self.asked = 0

    def model_states(self) -> dict[str, dict[str, str]]:
        self.asked += 1
        raise TritonError(f"{URL}: connection refused", status="StatusCode.UNAVAILABLE")

    def is_live(self) -> bool:
        raise TritonError(f"{URL}: connection refused", status="StatusCode.UNAVAILABLE")


def test_a_replica_that_never_comes_back_is_waited_for_once_and_named_once(tmp_path: Path) -> None:
    target = Gone()
    with Fleet(open_store(tmp_path / "store"), [URL], lambda url: target, load_timeout=1.0) as fleet:
        fleet.restart_wait = 0.5
        began = time.monotonic()
        with pytest.raises(PromotionError, match=f"{URL} dropped during the roll-out and did not come back"):
            RestartWatch(fleet).check([URL], [])
        assert time.monotonic() - began >= 0.5  # waited for, once
        began, asked = time.monotonic(), target.asked
        why = fleet.restore(URL, Change("net", CONFIG, ("1",)))
        assert time.monotonic() - began < 0.25  # the abort's put-back does not wait again
        assert target.asked == asked  # nor asks it again
        assert why == f"{URL}: not put back (it dropped and did not come back: above)"
