"""Which UNAVAILABLE answers ``TritonControl`` retries: a server that is starting or restarting, yes;
a refused connection (nothing listens there) and Triton's refusal of a call without the control
key, no -- each is final at the first answer."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.triton import control as triton_module
from pipelines.triton.control import RETRY_DELAYS, TritonControl
from pipelines.triton.control_key import REFUSED
from registry.errors import TritonError

DEAD = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"  # noqa: E501 (grpc 1.85's words)
RESTARTING = "Socket closed"


class Unavailable:
    """tritonclient's gRPC client answering every live check UNAVAILABLE with ``message``."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.calls = 0

    def is_server_live(self, **kwargs: Any) -> bool:
        from tritonclient.utils import InferenceServerException

        self.calls += 1
        raise InferenceServerException(self.message, status="StatusCode.UNAVAILABLE")


def _live_check(monkeypatch: pytest.MonkeyPatch, message: str) -> tuple[TritonError, int, list[float]]:
    slept: list[float] = []
    monkeypatch.setattr(triton_module.time, "sleep", slept.append)
    triton = TritonControl("127.0.0.1:1", timeout=1.0)
    client = Unavailable(message)
    triton._client = client
    with pytest.raises(TritonError) as caught:
        triton.is_live()
    return caught.value, client.calls, slept


def test_a_server_restarting_is_retried_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    error, calls, slept = _live_check(monkeypatch, RESTARTING)
    assert (calls, slept) == (1 + len(RETRY_DELAYS), list(RETRY_DELAYS))
    assert "live check failed on 127.0.0.1:1: Socket closed" in error.message


def test_a_refused_connection_is_final_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    error, calls, slept = _live_check(monkeypatch, DEAD)
    assert (calls, slept) == (1, [])
    assert error.message.startswith("live check failed on 127.0.0.1:1: failed to connect")
    assert error.context["status"] == "StatusCode.UNAVAILABLE"
    assert "check that tritonserver runs and listens there" in (error.fix or "")


def test_a_call_without_the_control_key_is_final_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    error, calls, slept = _live_check(monkeypatch, REFUSED)
    assert (calls, slept) == (1, [])
    assert error.context["status"] == "unauthorised"
