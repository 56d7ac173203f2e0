"""README "A swap cannot break a replica": a load past its deadline names the version still LOADING.

A fake of tritonclient's gRPC client (a fault we cannot provoke in a unit test: a real Triton whose
``initialize`` never returns is tests/integration/test_swaps.py's) answers the load with the
``DEADLINE_EXCEEDED`` status grpc gives a call past its ``client_timeout``, and the repository
index with the version still LOADING, as Triton 2.51 does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipelines.triton.control import TritonControl
from registry.errors import TritonError

LOAD_CONFIG = json.dumps({"version_policy": {"specific": {"versions": ["2"]}}})


class HungLoad:
    """tritonclient's gRPC client whose load never finishes in time."""

    def __init__(self) -> None:
        self.load_timeouts: list[float] = []

    def load_model(self, model: str, **kwargs: Any) -> None:
        from tritonclient.utils import InferenceServerException

        self.load_timeouts.append(kwargs["client_timeout"])
        raise InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED")

    def get_model_repository_index(self, **kwargs: Any) -> dict[str, Any]:
        return {
            "models": [
                {"name": "net", "version": "1", "state": "READY"},
                {"name": "net", "version": "2", "state": "LOADING"},
                {"name": "net", "version": "3", "state": "UNAVAILABLE", "reason": "an old failure"},
            ]
        }


def test_a_load_past_its_deadline_names_the_version_still_loading() -> None:
    triton = TritonControl("127.0.0.1:1", timeout=1.0, load_timeout=42.0)
    client = HungLoad()
    triton._client = client
    with pytest.raises(TritonError) as caught:
        triton.load("net", config=LOAD_CONFIG)
    error = caught.value
    assert client.load_timeouts == [42.0]  # the load's own deadline, not the calls' timeout
    assert error.message == ("127.0.0.1:1: the load of net v2 did not finish within 42s; v2 is still LOADING")
    assert error.context["status"] == "load-deadline"
    assert "read that replica's log for why net does not finish loading" in (error.fix or "")
    assert "an old failure" not in error.message  # a stale reason of another version is never quoted
