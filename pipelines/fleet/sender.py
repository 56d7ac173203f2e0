"""One change sent to one server (``Sender``): the wire every move and every restore of the fleet
goes through.

The model is loaded (its config sent as a per-replica override, or read from the store; its own
files sent with it) or unloaded, and waited for: every wanted version READY, every retired one
gone (Triton unloads asynchronously), within the load timeout.  The fleet's view is told what the
server holds after it (a failed change forgets it), the deployment ledger (pipelines/ledger) every
call sent, and a restore's finish is stamped (``restored``: an aborted promotion's time to safe,
pipelines/promote/verdicts.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipelines.core.changes import Change, ready_versions
from pipelines.core.ports import ServingTarget
from pipelines.fleet.view import ServerView
from registry.contracts.config import config_json
from registry.errors import PromotionError

if TYPE_CHECKING:
    from pipelines.ledger.recorder import Recorder


class Sender:
    """Sends changes through ``target`` (url -> its open connection), waiting ``load_timeout`` s at
    most; tells ``view`` and ``ledger`` (None: no ledger)."""

    def __init__(
        self,
        target: Callable[[str], ServingTarget],
        view: ServerView,
        load_timeout: float,
        ledger: Recorder | None = None,
    ) -> None:
        self.target = target
        self.view = view
        self.load_timeout = load_timeout
        self.ledger = ledger
        self.restored: dict[str, float] = {}  # url -> when (time.time()) its last restore finished

    def send(self, url: str, change: Change, undo: bool = False) -> None:
        """``change`` sent to ``url`` and waited for (raises); ``undo``: a restore."""
        before = self.view.known_ready(url, change.model)  # () when not known
        try:
            self._load(url, change)
        except BaseException as exc:
            self.view.moved(url, change, ok=False)
            self.told(url, change, before, undo, "failed", getattr(exc, "message", type(exc).__name__))
            raise
        self.view.moved(url, change, ok=True)
        if undo:  # an aborted promotion's time to safe (pipelines/promote/verdicts.py)
            self.restored[url] = time.time()
        self.told(url, change, before, undo, "ok")

    def told(
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
