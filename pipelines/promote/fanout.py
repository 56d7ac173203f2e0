"""The one object that drives an environment's servers: ``Fleet``.

A change of one model is ``Fleet.apply``: the config is written to the store once, then every
target loads it and waits until each wanted version is READY (the first target is the canary;
the others follow one by one, or ``parallel`` at a time).  Every target's outcome is kept as a
``TargetResult``; the first failure stops the roll-out and is raised.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.promote.ports import ServingTarget
from pipelines.storage.base import RepositoryStore
from registry.contracts.config import config_json
from registry.errors import MlregError
from registry.settings import Settings

Connect = Callable[[str], ServingTarget]
PAUSE_VARIABLE = "MLREG_TEST_PAUSE_AT"


def checkpoint(point: str) -> None:
    """A debug hook only tests turn on: with ``MLREG_TEST_PAUSE_AT=<point>`` the process says where it
    is on stderr and stops there, so a test can SIGKILL it at a known point of the promotion."""
    if os.environ.get(PAUSE_VARIABLE) == point:
        sys.stderr.write(f"mlreg-test: paused at {point}\n")
        sys.stderr.flush()
        time.sleep(3600)


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


def triton_connector(settings: Settings) -> Connect:
    """Real targets: Triton over gRPC with the configured timeouts."""

    def connect(url: str) -> ServingTarget:
        from pipelines.triton import TritonControl

        return TritonControl(url, timeout=settings.triton_timeout, load_timeout=settings.triton_timeout * 10)

    return connect


class Fleet:
    """The servers of one environment, and the store whose configs they load."""

    def __init__(
        self,
        store: RepositoryStore,
        urls: Sequence[str],
        connect: Connect,
        load_timeout: float,
        parallel: int = 1,
        override: bool = False,
    ) -> None:
        self.store = store
        self.urls = tuple(urls)
        self.connect = connect
        self.load_timeout = load_timeout
        self.parallel = max(1, parallel)
        # a staged fleet sends each config with its load: Triton keeps an earlier config override
        # over a store file older than it, so a plain load would not apply the store's
        self.override = override
        self.rollouts: list[Rollout] = []
        self._open: dict[str, ServingTarget] = {}

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

    # -- changes -------------------------------------------------------------------------------

    def apply(self, model: str, config_text: str | None, versions: Iterable[str]) -> Rollout:
        """Write ``model``'s config (None: delete it) once, then load it on every target and wait
        until each of ``versions`` is READY there (None: unload)."""
        rollout = Rollout(model, list(versions) if config_text is not None else [])
        self.rollouts.append(rollout)
        if config_text is None:
            self.store.delete(f"{model}/config.pbtxt")
        else:
            self.store.write_config(model, config_text)
        checkpoint(f"config-written:{model}")
        override = config_json(config_text) if self.override and config_text is not None else None

        def move(url: str) -> None:
            self._on_target(url, rollout, config_text is None, override)

        canary, rest = self.urls[:1], self.urls[1:]
        for url in canary:
            move(url)
        if self.parallel > 1 and len(rest) > 1:
            with ThreadPoolExecutor(self.parallel) as pool:
                for future in [pool.submit(move, u) for u in rest]:
                    future.result()
        else:
            for url in rest:
                move(url)
        checkpoint(f"loaded:{model}")
        return rollout

    def _on_target(self, url: str, rollout: Rollout, unload: bool, override: str | None = None) -> None:
        began = time.perf_counter()
        try:
            target = self.target(url)
            if unload:
                target.unload(rollout.model)
            else:
                target.load(rollout.model, config=override)
                for version in rollout.versions:
                    target.wait_ready(rollout.model, version, timeout=self.load_timeout)
        except MlregError as exc:
            rollout.targets.append(TargetResult(url, False, time.perf_counter() - began, exc.message))
            raise
        rollout.targets.append(TargetResult(url, True, time.perf_counter() - began))

    # -- probes --------------------------------------------------------------------------------

    def states(self) -> dict[str, dict[str, dict[str, str]] | MlregError]:
        """url -> model -> version -> state; an unreachable target is its error (probed in parallel)."""

        def probe(url: str) -> dict[str, dict[str, str]] | MlregError:
            try:
                return self.target(url).model_states()
            except MlregError as exc:
                return exc

        with ThreadPoolExecutor(max(1, min(16, len(self.urls)))) as pool:
            return dict(zip(self.urls, pool.map(probe, self.urls), strict=True))

    def serving(self, model: str) -> dict[str, list[str]]:
        """url -> the versions of ``model`` READY there (raises when a target is unreachable)."""
        return {url: ready_versions(self.target(url).model_states(), model) for url in self.urls}

    def serve_exactly(self, wanted: dict[str, str]) -> bool:
        """Every target serves exactly version ``v`` of each ``model: v`` (the no-op test)."""
        for url in self.urls:
            states = self.target(url).model_states()
            if any(ready_versions(states, model) != [version] for model, version in wanted.items()):
                return False
        return True

    def check_live(self) -> None:
        for url in self.urls:
            self.target(url).is_live()


def ready_versions(states: dict[str, dict[str, str]], model: str) -> list[str]:
    return sorted((v for v, s in states.get(model, {}).items() if s == "READY"), key=int)
