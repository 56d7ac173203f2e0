"""The fleet's view (``ServerView``): what each server holds, asked once per promotion and kept up
to date with the fleet's own moves.

The view of a server is asked of it the first time it is needed (``ask``: the fleet's question,
taken by ``refresh`` in ``resolve`` under the locks); after a load it keeps the versions the replica
kept serving (the ones the loaded config still lists) beside the ones waited for; a failed change,
or a replica that restarted, forgets it (what it holds now is asked again when needed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipelines.core.changes import Change, States, ready_versions
from pipelines.core.plan import serving_versions
from registry.errors import MlregError


class ServerView:
    """url -> what the server holds, as last asked (``ask``) and moved since."""

    def __init__(self, ask: Callable[[str], States]) -> None:
        self.ask = ask
        self.held: dict[str, States] = {}

    def states_of(self, url: str) -> States:
        """What the server at ``url`` holds: the view, asked of the server the first time only."""
        if url not in self.held:
            self.held[url] = self.ask(url)
        return self.held[url]

    def ready(self, url: str, model: str) -> list[str]:
        """The versions of ``model`` READY at ``url``, from the view (an unreachable server: none,
        its move says why)."""
        try:
            return ready_versions(self.states_of(url), model)
        except MlregError:
            return []

    def known_ready(self, url: str, model: str) -> tuple[str, ...]:
        """The versions of ``model`` READY at ``url`` as the view has it, never asking (() when the
        view of ``url`` is not taken)."""
        return tuple(ready_versions(self.held.get(url, {}), model))

    def forget(self, urls: Iterable[str]) -> None:
        """The next question about ``urls`` asks the servers again."""
        for url in urls:
            self.held.pop(url, None)

    def moved(self, url: str, change: Change, ok: bool) -> None:
        """The view after a change: its versions READY (none: unloaded); a failed change forgets
        the server's view (what it holds now is asked again when needed)."""
        if not ok:
            self.held.pop(url, None)
            return
        held = self.held.get(url)
        if held is None:
            return
        if change.config is None:
            held.pop(change.model, None)
        else:
            held[change.model] = {v: "READY" for v in kept_after(held, change)}


def kept_after(states: States, change: Change) -> list[str]:
    """What a replica holds READY of ``change.model`` after its load of ``change`` (a config): the
    versions it held that the config still lists (Triton keeps serving them; none when the config
    lists none: it names no specific versions) beside the ones waited for, less the retired."""
    listed = set(serving_versions(change.config))
    kept = {v for v in ready_versions(states, change.model) if v in listed} | set(change.versions)
    return sorted(kept - set(change.retired), key=int)
