"""mlreg's own requests during a bake: the failures Triton's counters miss.

Triton 2.51 counts a python model's ``InferenceResponse(error=...)`` as a success, so a candidate
failing a share of its requests can pass a bake judged on ``nv_inference_request_failure`` alone.
While a bake waits, ``Probes`` sends requests at ``rate`` per second to the new version on the
replicas already moved and, where some are left, to the old version on the others (the
comparison), version-specifically, and counts which failed.  The requests are the captured ones
where the shadow replay read some (production's own inputs), else the golden inputs.

The bake judges them as ``probe_failure_ratio`` (``metrics.DERIVED``), and takes them out of
Triton's counts first, so that ``requests`` still counts clients only.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.triton import metrics
from registry.errors import MlregError

Inputs = Mapping[str, np.ndarray]


@dataclass
class Side:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few failures' messages


@dataclass(frozen=True)
class Target:
    """What to probe for one model: the requests, the outputs asked, the new and old versions."""

    model: str
    inputs: Sequence[Inputs]
    outputs: Sequence[str]
    new: str
    old: str


class Probes:
    def __init__(self, connect: Callable[[str], Any], rate: float, targets: Sequence[Target]) -> None:
        self.connect = connect
        self.rate = rate
        self.targets = [t for t in targets if t.inputs]
        self.sides: dict[tuple[str, str], Side] = {}  # (model, "new" | "old") -> counts

    def run(
        self,
        seconds: float,
        moved: Sequence[str],
        others: Sequence[str],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Probe while the bake waits ``seconds`` (``sleep``: the bake's); the counts in ``sides``
        (fresh for each bake).  At most ``rate x seconds`` requests a side, paced by ``sleep``."""
        self.sides = {}
        if self.rate <= 0 or not self.targets or not moved:
            sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        count = max(1, int(self.rate * seconds))
        stop = threading.Event()
        workers = [
            threading.Thread(
                target=self._side, args=(t, which, urls, count, deadline, sleep, stop), daemon=True
            )
            for t in self.targets
            for which, urls in (("new", moved), ("old", others))
            if urls
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()) + 30)
        stop.set()

    def _side(
        self,
        target: Target,
        which: str,
        urls: Sequence[str],
        count: int,
        deadline: float,
        sleep: Callable[[float], None],
        stop: threading.Event,
    ) -> None:
        side = self.sides.setdefault((target.model, which), Side())
        version = target.new if which == "new" else target.old
        connections: dict[str, Any] = {}
        try:  # a replica that cannot be reached: the connections already made are closed too
            for url in urls:
                connections[url] = self.connect(url)
            period = 1 / self.rate
            turns = zip(itertools.cycle(urls), itertools.cycle(target.inputs), range(count), strict=False)
            for url, inputs, _ in turns:
                if stop.is_set() or time.monotonic() >= deadline:
                    return
                began = time.monotonic()
                try:
                    connections[url].infer(target.model, inputs, list(target.outputs), version=version)
                    side.ok += 1
                except MlregError as exc:
                    side.failed += 1
                    if len(side.errors) < 3:
                        side.errors.append(f"{url}: {exc.message}")
                sleep(max(0.0, min(period - (time.monotonic() - began), deadline - time.monotonic())))
        finally:
            for connection in connections.values():
                connection.close()

    def counted(self, model: str, which: str) -> Side:
        return self.sides.get((model, which), Side())


def with_probes(counters: metrics.Counters, side: Side) -> metrics.Counters:
    """Triton's counters without the probes' requests (Triton counted them too: a failed probe as a
    failure where it counts one, else as a success), plus the probes' own counts."""
    failures = min(counters.failure, side.failed)
    successes = min(counters.success, side.ok + side.failed - failures)
    share = (successes + failures) / counters.requests if counters.requests else 0.0
    return metrics.Counters(
        success=counters.success - successes,
        failure=counters.failure - failures,
        duration_us=counters.duration_us * (1 - share),
        queue_us=counters.queue_us * (1 - share),
        compute_us=counters.compute_us * (1 - share),
        probe_ok=side.ok,
        probe_failed=side.failed,
    )
