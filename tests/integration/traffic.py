"""Client traffic while a promotion runs: the "no failed request" half of the swap tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from pipelines.triton import TritonControl
from registry.errors import MlregError

Request = Callable[[TritonControl, np.random.Generator], object]


class Traffic:
    """One client thread per entry of ``urls`` (repeat a URL for more threads on it), each sending
    ``request`` until the block ends; every outcome counted, every error message kept."""

    def __init__(self, urls: Sequence[str], request: Request, settle: float = 0.5) -> None:
        self.request = request
        self.settle = settle
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"ok": 0, "failed": 0}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.send, args=(url, i)) for i, url in enumerate(urls)]

    def send(self, url: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with TritonControl(url, timeout=30) as triton:
            deadline = time.monotonic() + 300
            while not self.stop.is_set() and time.monotonic() < deadline:
                try:
                    self.request(triton, rng)
                    key = "ok"
                except MlregError as exc:
                    key = "failed"
                    self.errors.append(exc.message)
                with self.lock:
                    self.counts[key] += 1

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        time.sleep(self.settle)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(self.settle)
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
