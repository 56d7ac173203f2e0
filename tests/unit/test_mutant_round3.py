"""Guarantee mutants of round three (issues 44, 45) that no other fast test killed
(tests/mutants/mutants.toml names them): each test asserts the state the guarantee is about.

- ``late-load-queued-behind``: a replica still LOADING the candidate past its deadline is put back
  by a load queued behind the late one (``Fleet.restore``), never by a load that would wait behind
  it: the queued config names only the serving version, the truth said is kept, and once the late
  load ends the replica serves the serving version alone.
- ``too-few-captures-inconclusive``: min_captures counts the requests *judged*, not only those read:
  enough captures, most of which the serving version fails on again (not held against the
  candidate), leave too few judged -- inconclusive, refused, never a pass on what is left.
- ``upload-temp-outside-the-model-folder``: an upload under way leaves nothing partial under
  ``<model>/``.
- ``status-under-a-store-outage-reads-readiness``: a replica whose repository index blocks on a
  frozen store (DEADLINE_EXCEEDED) is read from its readiness, never called unreachable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mlreg.ops import status, status_replicas
from pipelines.checks.capture import Shadow
from pipelines.checks.replay import ShadowResult, replay
from pipelines.checks.traces import Captured
from pipelines.fleet.fleet import Change, Fleet, ready_versions
from pipelines.promote.environments import Environment
from pipelines.storage import open_store
from registry.errors import TritonError
from tests.fakes import Call, FakeTarget

URL = "localhost:8001"
SERVING = """name: "scorer"
backend: "python"
max_batch_size: 0
version_policy: { specific: { versions: [9] } }
input [{ name: "x", data_type: TYPE_FP32, dims: [2] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [2] }]
"""


def _loads_wait_behind_a_late_one(target: FakeTarget, call: Call) -> None:
    """Triton 2.51 runs a model's loads in turn: a load sent while one of its versions is still
    LOADING waits behind it and, past the caller's deadline, is answered DEADLINE_EXCEEDED.  A fake
    of a fault the unit suite cannot provoke for real (a real server with an initialize that outlives
    load_timeout is tests/integration's late-load test)."""
    if call.method == "load" and "LOADING" in target.states.get(call.model, {}).values():
        raise TritonError(f"{target.url}: load of '{call.model}' still waits behind a running load")


class QueueingTarget(FakeTarget):
    """A FakeTarget with Triton's queue of loads: ``queue_load`` sends a load that stays queued
    behind the running one (False: not finished within ``wait``); ``late_load_ends`` lets the late
    load finish, then runs what was queued, in order."""

    def __init__(self, url: str) -> None:
        super().__init__(url, _loads_wait_behind_a_late_one)
        self.queued: list[tuple[str, str]] = []

    def queue_load(self, model: str, config: str, wait: float) -> bool:
        self.queued.append((model, config))
        return False  # still queued behind the late load

    def late_load_ends(self) -> None:
        for model, versions in self.states.items():
            self.states[model] = {v: "READY" for v in versions}  # the late version lands first
        for model, config in self.queued:
            versions = json.loads(config)["version_policy"]["specific"]["versions"]
            self.states[model] = {str(int(v)): "READY" for v in versions}
        self.queued.clear()


def test_a_late_load_is_taken_back_by_a_load_queued_behind_it(tmp_path: Path) -> None:
    target = QueueingTarget(URL)
    target.states = {"scorer": {"9": "READY", "12": "LOADING"}}  # v12's load outlived its deadline
    with Fleet(open_store(tmp_path / "store"), [URL], lambda url: target, load_timeout=1.0) as fleet:
        why = fleet.restore(URL, Change("scorer", SERVING, ("9",)))
        assert why == ""
        assert [(m, json.loads(c)["version_policy"]["specific"]["versions"]) for m, c in target.queued] == [
            ("scorer", ["9"])
        ]  # the load that keeps only the serving version, queued behind the late one
        assert target.configs == []  # no load that would wait behind it was sent
        assert "queued the load of v9 behind it" in fleet.pending[URL]  # what was done, no prediction
    target.late_load_ends()
    assert ready_versions(target.model_states(), "scorer") == ["9"]  # the candidate never takes traffic


def test_too_few_requests_judged_is_inconclusive_though_enough_were_captured() -> None:
    rng = np.random.default_rng(5)
    requests = []
    for n in range(60):
        x = rng.random((1, 4), dtype=np.float32)
        x[0, 0] = n  # which request it is, read back by the serving side
        requests.append(Captured("m", "1", f"c{n}", {"X": x}, {"Y": x.sum(axis=1, keepdims=True)}))

    def candidate(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"Y": inputs["X"].sum(axis=1, keepdims=True)}

    def serving(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if inputs["X"][0, 0] < 40:  # the serving version fails these again: none of them is judged
            raise TritonError("the serving version failed the request")
        return candidate(inputs)

    shadow = Shadow(captures="/nowhere", min_captures=50)
    result = replay(requests, candidate, serving, {"Y": "regression"}, shadow, ShadowResult("m", "2", "1"))
    assert (result.captured, result.judged, result.serving_failed, result.diverged) == (60, 20, 40, 0)
    assert not result.ok
    assert result.verdict.startswith("inconclusive: 20 captured request(s) of v1 could be judged")
    assert "min_captures 50" in result.verdict


def test_an_upload_under_way_shows_no_partial_file_under_the_model_folder(tmp_path: Path) -> None:
    """Issue 45 item 8: while a version's bytes are copied, nothing partial lies under ``<model>/``
    (Triton may read it; a SIGKILL would leave it there): the temporary file is at the store's
    root, and the version's file appears whole, once copied."""
    root = tmp_path / "store"
    store = open_store(root)
    source = tmp_path / "src"
    source.mkdir()
    data = os.urandom(3 << 20)  # three chunks: the callback runs while the copy is under way
    (source / "weights.bin").write_bytes(data)
    seen: list[tuple[str, int]] = []
    temps: list[str] = []

    def watch(sent: int) -> None:
        seen.extend(
            (p.relative_to(root).as_posix(), p.stat().st_size) for p in root.rglob("*") if p.is_file()
        )
        temps.extend(p.name for p in root.iterdir() if p.is_file())

    store.versions.put_version("m", "1", source, progress=watch)
    assert [(name, size) for name, size in seen if name.startswith("m/")] == []  # nothing partial
    assert temps  # the copy was under way in a temporary file at the root
    assert (root / "m" / "1" / "weights.bin").read_bytes() == data
    assert [p.name for p in root.iterdir() if p.is_file()] == []  # the temporary file is gone


class IndexBlockedTarget(FakeTarget):
    """A Triton whose repository index blocks on a frozen S3 store until the caller's deadline
    while statistics and model readiness answer from what it holds (Triton 2.51, FACTS.md) -- a
    fake of a fault the unit suite cannot provoke for real."""

    def model_states(self) -> dict[str, dict[str, str]]:
        raise TritonError(
            f"{self.url}: repository index failed: Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"
        )

    def statistics(self, model: str = "") -> list[dict[str, object]]:
        return [{"name": m, "version": v} for m, vs in self.states.items() for v in vs]


def test_a_replica_whose_index_blocks_on_the_store_is_read_from_its_readiness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = IndexBlockedTarget(URL)
    target.states = {"net": {"2": "READY"}}
    monkeypatch.setattr(
        status_replicas, "triton_connector", lambda settings, key=None: {URL: target}.__getitem__
    )
    settings = SimpleNamespace(triton_timeout=1.0, home=tmp_path / ".mlreg")
    env = Environment("s3", "s3://frozen/models", (URL,), "production", gpu=False)
    live, _ = status.probe_targets(settings, env, open_store(tmp_path / "store"), (), lambda: {"net": {"2"}})  # type: ignore[arg-type]
    assert live == {URL: {"net": {"2": "READY"}}}  # what it serves, not "unreachable"
    assert status.readiness_read(live) == [URL]
