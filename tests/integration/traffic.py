"""Client traffic while a promotion runs: the "no failed request" half of the swap tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from pipelines.triton.control import TritonControl
from registry.errors import MlregError

Request = Callable[[TritonControl, np.random.Generator], object]


class Traffic:
    """One client thread per entry of ``urls`` (repeat a URL for more threads on it), each sending
    ``request`` until the block ends; every outcome counted, every error message kept.

    The block starts once every thread has had an answer (traffic flows before the swap) and ends
    once every thread has had one more after it (traffic flows across the swap's end): handshakes,
    not sleeps.

    ``pause``: seconds each thread waits after an answer before its next request.  Unpaced, four
    threads kept both of CI's cores busy with requests for the whole promotion, which then ran
    slower and slowed the other worker's module; 10 ms between a thread's requests still leaves
    no window of Triton's longer than a few milliseconds unprobed (the threads are not in step),
    where a swap's unload-to-load gap, the failure these tests exist for, lasts far longer."""

    def __init__(
        self, urls: Sequence[str], request: Request, wait: float = 60.0, pause: float = 0.01
    ) -> None:
        self.request = request
        self.wait = wait
        self.pause = pause
        self.stop = threading.Event()
        self.lock = threading.Condition()
        self.counts: dict[str, int] = {"ok": 0, "failed": 0}
        self.errors: list[str] = []
        self.sent = [0] * len(urls)  # requests answered (or failed), per thread
        self.threads = [threading.Thread(target=self.send, args=(url, i)) for i, url in enumerate(urls)]

    def send(self, url: str, index: int) -> None:
        rng = np.random.default_rng(index)
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
                    self.sent[index] += 1
                    self.lock.notify_all()
                self.stop.wait(self.pause)

    def _each_thread_past(self, marks: list[int]) -> None:
        """Until every thread has had an answer (or a failure) since ``marks``; an AssertionError
        naming the threads that had none within ``wait`` seconds (the handshake is the claim)."""
        with self.lock:
            passed = self.lock.wait_for(
                lambda: all(n > m for n, m in zip(self.sent, marks, strict=True)), timeout=self.wait
            )
            stuck = [i for i, (n, m) in enumerate(zip(self.sent, marks, strict=True)) if n <= m]
        if not passed:
            self.stop.set()
            raise AssertionError(
                f"traffic threads {stuck} had no answer within {self.wait:.0f} s: {self.errors[-3:]}"
            )

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        self._each_thread_past([0] * len(self.threads))
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            marks = list(self.sent)
        self._each_thread_past(marks)
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
