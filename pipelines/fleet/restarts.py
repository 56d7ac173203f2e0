"""A replica that restarts during a staged roll-out (issue 45, item 3).

A tritonserver that crashes and is restarted (by its supervisor: a pod's restart, systemd) comes
back as it starts -- in explicit mode serving nothing, or what ``--load-model`` names -- whatever
the roll-out had moved there.  ``RestartWatch.check`` asks each replica moved so far what it holds,
once per wave (one repository-index call per replica per wave: benchmarks/restart_calls.py counts
it on the stand-in fleet), before the next wave and after the last: a replica that lost what its
wave moved there, or whose connection dropped, is waited for (``Fleet.restart_wait``) and given
back the promoted state of its wave (the same moves again; its before-state stays the undo log's
first touch).  One that does not come back, or cannot be moved again, fails the roll-out, named
once with the fix; the abort then puts every touched replica back (``Fleet.restore`` waits for a
dropped one the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pipelines.core.changes import Change, ready_versions
from pipelines.core.plan import Step
from pipelines.core.ports import ServingTarget
from pipelines.fleet.fleet import Fleet
from pipelines.fleet.putback import dropped, wait_back
from registry.errors import MlregError, PromotionError


class Move(Protocol):
    """One model's change on each replica (``staged.Move``)."""

    @property
    def step(self) -> Step: ...

    @property
    def change(self) -> Change: ...


class RestartWatch:
    """Checks the replicas a roll-out moved, and moves again one that restarted."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.notes: list[str] = []  # one line per replica moved again

    def check(self, urls: Sequence[str], moves: Sequence[Move]) -> None:
        """Each of ``urls`` (moved already) still holds what ``moves`` made READY there, or is moved
        again after it came back; raises ``PromotionError`` naming a replica that cannot be."""
        for url in urls:
            lost = self._lost(url, moves)
            if lost:
                self._move_again(url, moves, lost)

    def _lost(self, url: str, moves: Sequence[Move]) -> list[str]:
        """What of ``moves`` ``url`` no longer holds READY (the one call); a replica that dropped is
        waited for, and then holds nothing this roll-out moved there."""
        target = self.fleet.target(url)
        try:
            states = target.model_states()
        except MlregError as exc:
            if not dropped(exc):
                raise
            if not wait_back(target, self.fleet.restart_wait):
                # waited for once: the abort's put-back does not wait again, and names it only by reference
                self.fleet.gone[url] = f"{url}: not put back (it dropped and did not come back: above)"
                raise PromotionError(
                    f"{url} dropped during the roll-out and did not come back within "
                    f"{self.fleet.restart_wait:.0f}s ({exc.message})",
                    fix="bring the replica back (read its log: a crash?), then run 'mlreg status': it "
                    "names the command that loads what the store wants there",
                ) from None
            states = target.model_states()
        return [
            f"{m.change.model} v{','.join(m.change.versions)}"
            for m in moves
            if not set(m.change.versions) <= set(ready_versions(states, m.change.model))
        ]

    def _move_again(self, url: str, moves: Sequence[Move], lost: list[str]) -> None:
        """``moves`` sent to ``url`` again, members before the ensembles that follow them."""
        self.fleet.refresh([url])
        ordered = [m for m in moves if not m.step.is_ensemble] + [m for m in moves if m.step.is_ensemble]
        try:
            for move in ordered:
                self.fleet.move(url, move.change)
        except MlregError as exc:
            raise PromotionError(
                f"{url} restarted during the roll-out (it no longer held {', '.join(lost)}) and could "
                f"not be given its wave's state again: {exc.message}",
                fix="read that replica's log; once it serves again, promote again",
            ) from exc
        self.notes.append(
            f"{url} restarted during the roll-out (it no longer held {', '.join(lost)}): loaded again "
            "(other models it served before its restart are not this promotion's: 'mlreg status' names them)"
        )


def not_ready_after_rollout(
    target: ServingTarget, model: str, version: str, exc: MlregError | None = None
) -> PromotionError:
    """Why ``model`` ``version`` is not READY at ``target`` after its roll-out (verify; issue 45
    review, F9): the replica dropped (``exc``: a crash or a restart under way), or it serves none of
    ``model``'s versions -- it restarted since (explicit mode starts serving nothing) -- or it holds
    other versions.  One call of the repository index, asked only once verify found it not READY."""
    url, fix = target.url, "the serving version is put back; once the replica serves again, promote again"
    if exc is None:
        try:
            states = target.model_states()
        except MlregError as error:
            exc = error
    if exc is not None:
        if dropped(exc):
            return PromotionError(
                f"{url} dropped after the roll-out, during verify (a crash or a restart?): {exc.message}",
                fix=f"bring the replica back (read its log); {fix}",
            )
        return PromotionError(f"{url}: {model} v{version} could not be checked: {exc.message}", fix=fix)
    held = ready_versions(states, model)
    if not held:
        return PromotionError(
            f"{url}: {model} v{version} is not READY: the replica serves no version of {model} now -- it "
            "restarted after the roll-out (a restarted replica serves what it loads at start)",
            fix=f"read that replica's log for the restart; {fix}",
        )
    return PromotionError(f"{url}: {model} v{version} is not READY (it holds v{','.join(held)})", fix=fix)
