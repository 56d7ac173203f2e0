"""README "Shadow replay": a candidate that *fails* on replayed requests where the serving version
answers is divergent on each of them, and a candidate diverging on 3 % of real requests is refused
while one within ``max_divergence`` passes (the verdict of tests/integration/test_shadow.py, judged
here on the replay's own comparison in a few milliseconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.checks import capture
from pipelines.checks.capture import Shadow
from pipelines.checks.replay import ShadowResult, compare
from pipelines.checks.traces import Captured

KINDS = {"Y": "regression"}


def _replay(n: int, candidate_off: set[int], candidate_fails: frozenset[int] = frozenset()) -> ShadowResult:
    """``n`` captured requests; the serving version answers each the same twice (no floor); the
    candidate is off by 1.0 on ``candidate_off`` and fails (no answer) on ``candidate_fails``."""
    answers = [np.array([[float(i)]], np.float32) for i in range(n)]
    requests = [Captured("m", "1", f"c{i}", {"X": answers[i]}, {"Y": answers[i]}) for i in range(n)]
    ours: list[tuple[dict[str, np.ndarray] | None, float]] = []
    for i, answer in enumerate(answers):
        if i in candidate_fails:
            ours.append((None, 1.0))
        else:
            ours.append(({"Y": answer + (1.0 if i in candidate_off else 0.0)}, 1.0))
    again = [({"Y": a}, 1.0) for a in answers]
    return compare(requests, ours, again, KINDS, Shadow(), ShadowResult("m", "2", "1"))


def test_a_candidate_failing_replayed_requests_the_serving_version_answers_is_refused() -> None:
    result = _replay(200, candidate_off=set(), candidate_fails=frozenset(range(0, 200, 25)))  # 8 of 200
    assert (result.judged, result.serving_failed, result.candidate_failed) == (200, 0, 8)
    assert (result.diverged, result.floor) == (8, 0)  # each failure counted divergent
    assert not result.ok
    assert re.match(r"refused: 8 divergent request\(s\), 8 failed above the floor", result.verdict)
    assert [r["request_id"] for r in result.first] == ["c0", "c25", "c50", "c75", "c100"]


def test_a_candidate_diverging_on_3_percent_of_real_requests_is_refused() -> None:
    result = _replay(1000, candidate_off=set(range(0, 990, 33)))  # 30 of 1000
    assert (result.judged, result.diverged, result.floor) == (1000, 30, 0)
    assert result.divergence == 0.03
    assert not result.ok
    assert result.allowed == 5  # max_divergence 0.5 % of 1000, no floor
    assert re.match(r"refused: 30 divergent request\(s\) above the floor, more than the 5\b", result.verdict)


def test_a_candidate_within_max_divergence_passes() -> None:
    result = _replay(1000, candidate_off={10, 500, 900})  # 0.3 %
    assert (result.judged, result.diverged, result.ok) == (1000, 3, True)
    assert result.verdict.startswith("passed (within max_divergence 0.5%")


def test_a_trace_file_listed_over_its_bound_is_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README "Inputs we did not write are untrusted": a trace file whose listed size is over
    MAX_FILE_BYTES is skipped without a byte of it read (a bound checked after reading would
    have read it all)."""
    record = [{"id": 1, "model_name": "m", "model_version": 1, "request_id": "c1"}]
    (tmp_path / "trace.json.0").write_text(json.dumps(record))
    (tmp_path / "trace.json.1").write_text(json.dumps(record) + " " * 4096)  # over the bound
    monkeypatch.setattr(capture, "MAX_FILE_BYTES", len(json.dumps(record)) + 1)
    opened: list[str] = []
    read = capture.Captures.read

    def spied(self: capture.Captures, name: str, *args: Any, **kwargs: Any) -> bytes:
        opened.append(name)
        return read(self, name, *args, **kwargs)

    monkeypatch.setattr(capture.Captures, "read", spied)
    reading = capture.read_captures(str(tmp_path), "m", "1", limit=10)
    assert reading.skipped[f"trace file over {capture.MAX_FILE_BYTES >> 20} MiB: not read"] == 1
    assert "trace.json.1" not in opened  # never opened
    assert opened == ["trace.json.0"]
