"""README "Every exit restores", with real signals: a SIGHUP sent to this process (a closed
terminal) inside the CLI's signal scope (``mlreg.cli.signals.sigterm_raises``) in the middle of a
promotion puts everything back and exits 129, and a second signal during the replay cannot cut it
short.  The world of tests/unit/worlds.py: a real local store, fake Tritons; the signals are real
(``os.kill`` of this process), delivered in the main thread where Python runs handlers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.signals import sigterm_raises
from pipelines.core.reports import PromotionFailed
from tests.fakes import Call, FakeTarget
from tests.unit.worlds import MEMBER, World


@pytest.fixture
def unraised() -> Iterator[list[int]]:
    """Signals that reached no raising handler (the one this installs under the CLI's): a signal
    the CLI does not raise on is recorded here instead of killing the test process."""
    seen: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: seen.append(signum)) for sig in (1, 3, 15)}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _deployed(world: World) -> World:
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    world.fleet.loads = 0
    return world


def _state(world: World) -> dict[str, Any]:
    return {
        "configs": {m: world.config(m) for m in ("pre", "net", "ens")},
        "serving": {url: t.model_states() for url, t in sorted(world.fleet.targets.items())},
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens")},
        "net v2 stored": world.fleet.store.versions.read_manifest("net", "2") is not None,
    }


def _signal_at_load(world: World, first: signal.Signals, then: signal.Signals | None = None) -> list[str]:
    """``first`` sent to this process at the second load; ``then`` at every load after it (the
    replay's).  Returns the signals sent, in order."""
    sent: list[str] = []
    handle = world.fleet.handle

    def signalling(target: FakeTarget, call: Call) -> None:
        handle(target, call)
        if call.method != "load":
            return
        if world.fleet.loads == 2:
            sent.append(first.name)
            os.kill(os.getpid(), first)
        elif world.fleet.loads > 2 and then is not None:
            sent.append(then.name)
            os.kill(os.getpid(), then)

    for target in world.fleet.targets.values():
        target.handler = signalling
    world.fleet.handle = signalling  # type: ignore[method-assign]
    return sent


def test_a_real_sighup_mid_promotion_puts_everything_back_and_exits_129(
    tmp_path: Path, unraised: list[int]
) -> None:
    world = _deployed(World(tmp_path))
    before = _state(world)
    sent = _signal_at_load(world, signal.SIGHUP)
    with sigterm_raises(), pytest.raises(PromotionFailed, match=r"interrupted \(SIGHUP\)") as info:
        world.promote("net", "2")
    assert sent == ["SIGHUP"]
    assert unraised == []  # the CLI's handler took it, and raised
    assert info.value.exit_code == 129
    assert "rolled back" in info.value.message
    assert _state(world) == before  # servers, store configs, aliases; the upload removed
    assert signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN  # the scope's handlers restored


def test_a_second_signal_during_the_replay_cannot_cut_it_short(tmp_path: Path, unraised: list[int]) -> None:
    world = _deployed(World(tmp_path))
    before = _state(world)
    sent = _signal_at_load(world, signal.SIGTERM, then=signal.SIGTERM)
    with sigterm_raises(), pytest.raises(PromotionFailed, match=r"interrupted \(SIGTERM\)") as info:
        world.promote("net", "2")
    assert sent[0] == "SIGTERM"
    assert len(sent) > 1, sent  # more SIGTERMs came while it put things back
    assert info.value.exit_code == 143
    assert "rolled back" in info.value.message
    assert "rollback failed" not in info.value.message
    assert _state(world) == before
    assert unraised == []  # the replay's signals were ignored, not passed on
