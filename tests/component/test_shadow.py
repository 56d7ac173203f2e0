"""The shadow replay's pure parts (issue 35): reading Triton's trace records, the files' bounds, the
comparison per output kind with its noise floor, the bake's own requests, and how they are shown.
The real-server claims are in tests/integration/test_shadow.py."""

from __future__ import annotations

import io
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from botocore.exceptions import ClientError

from mlreg.cli.markdown import _shadow_lines
from pipelines.checks import capture
from pipelines.checks.capture import Captures, Shadow, parse_shadow, parse_traces, read_captures
from pipelines.checks.replay import ShadowResult, compare, kind_of, ks_statistic
from pipelines.checks.traces import Captured, Reading
from pipelines.promote.record import write_shadow
from pipelines.rollout.probes import with_probes
from pipelines.triton import metrics
from registry.errors import UsageError

# one request as Triton 2.51 writes it (trace level TIMESTAMPS + TENSORS; seen here, FACTS.md)
TRACE = [
    {"id": 1, "model_name": "m", "model_version": 1, "request_id": "c7"},
    {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 1_000_000}]},
    {
        "id": 1,
        "activity": "TENSOR_QUEUE_INPUT",
        "tensor": {"name": "X", "data": "1,2.5,3,4", "shape": "1,4", "dtype": "FP32"},
    },
    {
        "id": 1,
        "activity": "TENSOR_BACKEND_OUTPUT",
        "tensor": {"name": "Y", "data": "7", "shape": "1,1", "dtype": "INT64"},
    },
    {"id": 1, "timestamps": [{"name": "REQUEST_END", "ns": 3_500_000}]},
]
CLASSES = 'name: "c"\nbackend: "python"\nmax_batch_size: 8\n' + (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def test_a_trace_record_becomes_a_request_with_its_tensors_and_latency() -> None:
    reading = Reading()
    [request] = parse_traces(TRACE, "trace.json.0", reading)
    assert (request.model, request.version, request.request_id) == ("m", "1", "c7")
    np.testing.assert_array_equal(request.inputs["X"], np.array([[1, 2.5, 3, 4]], np.float32))
    assert request.inputs["X"].dtype == np.float32
    assert request.outputs["Y"].dtype == np.int64
    assert request.latency_us == 2500
    assert request.source == "trace.json.0#1"


@pytest.mark.parametrize(
    "tensor",
    [
        {"name": "X", "data": "a,b", "shape": "2", "dtype": "BYTES"},  # not replayed faithfully
        {"name": "X", "data": "1,2,3", "shape": "1,4", "dtype": "FP32"},  # data does not fill the shape
        {"name": "X", "data": "1", "shape": "100000000,100", "dtype": "FP32"},  # over MAX_TENSOR_BYTES
        {"name": "X", "data": "1,x", "shape": "2", "dtype": "INT32"},  # not numbers
    ],
)
def test_a_tensor_that_cannot_be_replayed_skips_its_request_and_says_why(tensor: dict[str, Any]) -> None:
    records = [*TRACE[:2], {"id": 1, "activity": "TENSOR_QUEUE_INPUT", "tensor": tensor}, *TRACE[3:]]
    reading = Reading()
    assert parse_traces(records, "t", reading) == []
    assert list(reading.skipped.values()) == [1]
    [why] = reading.skipped
    assert "not replayable" in why


def test_captures_are_read_in_order_and_junk_files_are_skipped(tmp_path: Path) -> None:
    for index in range(3):
        record = [dict(r) for r in TRACE]
        record[0]["request_id"] = f"c{index}"
        record[2] = {**record[2], "tensor": {**record[2]["tensor"], "data": f"{index},2.5,3,4"}}  # distinct
        path = tmp_path / "replica-0" / f"trace.json.{index}"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(record))
        os.utime(path, (1000 + index, 1000 + index))
    (tmp_path / "replica-0" / "trace.json.3").write_text(
        '[{"id": 1, "model_name": "m", "mod'
    )  # being written
    (tmp_path / "notes.txt").write_text("not a trace")
    reading = read_captures(str(tmp_path), "m", "1", limit=2)
    # a sample (issue 44: no longer the newest two), in capture order, and no further once two are found
    ids = [r.request_id for r in reading.requests]
    assert len(ids) == 2
    assert set(ids) <= {"c0", "c1", "c2"}
    assert ids == sorted(ids)
    assert reading.files <= 3
    everything = read_captures(str(tmp_path), "m", "1", limit=10)
    assert [r.request_id for r in everything.requests] == ["c0", "c1", "c2"]
    assert sum(everything.skipped.values()) == 1  # the file being written; notes.txt is no trace


def test_a_trace_file_over_the_bound_is_skipped_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = tmp_path / "trace.json.0", tmp_path / "trace.json.1"
    small.write_text(json.dumps(TRACE))
    large.write_text(json.dumps(TRACE) + " " * 4096)  # newer, and over the bound
    os.utime(small, (1000, 1000))
    os.utime(large, (2000, 2000))
    monkeypatch.setattr(capture, "MAX_FILE_BYTES", small.stat().st_size + 1)
    reading = read_captures(str(tmp_path), "m", "1", limit=10)
    assert reading.files == 1  # only the small file was parsed
    assert len(reading.requests) == 1
    [why] = reading.skipped
    assert why.startswith("trace file over")
    assert why.endswith("not read")


def test_prune_keeps_the_files_within_their_age_and_size(tmp_path: Path) -> None:
    now = time.time()
    for index, age_hours in enumerate([200, 5, 4, 3, 2]):
        path = tmp_path / f"t.json.{index}"
        path.write_bytes(b"x" * 100)
        os.utime(path, (now - age_hours * 3600, now - age_hours * 3600))
    captures = Captures(str(tmp_path))
    gone = captures.prune(Shadow(max_bytes=250, max_age_hours=168), now=now)
    assert gone == ["t.json.0", "t.json.1", "t.json.2"]  # too old, then the oldest over 250 bytes
    assert [f.name for f in captures.files()] == ["t.json.3", "t.json.4"]


class _Listed:
    """Just enough of an S3 client for the trace files under s3://bucket/traces (in memory)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gone: set[str] = set()  # still listed, no longer readable (rotated since the listing)
        self.deleted: list[list[str]] = []

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
        when = datetime.fromtimestamp(1000, UTC)
        keys = sorted(k for k in self.objects if k.startswith(Prefix))
        return [{"Contents": [{"Key": k, "Size": len(self.objects[k]), "LastModified": when} for k in keys]}]

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects or Key in self.gone:
            raise ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")
        return {"Body": io.BytesIO(self.objects[Key]), "ETag": '"e"'}

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        self.deleted.append([o["Key"] for o in Delete["Objects"]])
        return {}


def test_s3_captures_go_through_the_store_a_vanished_file_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 the files are listed under the prefix only (not a sibling ``traces2/``), a file gone
    since the listing is skipped (not a botocore error out of the replay), a purge is batched."""
    trace = json.dumps(TRACE).encode()
    fake = _Listed({"traces/r0.json.1": trace, "traces/r0.json.2": trace, "traces2/r9.json": trace})
    captures = Captures("s3://127.0.0.1:9/bucket/traces")
    assert captures._s3 is not None
    monkeypatch.setattr(captures._s3._client, "get", lambda: fake)
    monkeypatch.setattr("pipelines.checks.capture.Captures", lambda location: captures)
    assert [f.name for f in captures.files()] == ["r0.json.1", "r0.json.2"]
    fake.gone.add("traces/r0.json.2")  # rotated away after the listing
    reading = read_captures("s3://127.0.0.1:9/bucket/traces", "m", "1", limit=10)
    assert [r.request_id for r in reading.requests] == ["c7"]
    assert sum(reading.skipped.values()) == 1
    captures.delete(["r0.json.1", "r0.json.2"])
    assert fake.deleted == [["traces/r0.json.1", "traces/r0.json.2"]]


def test_the_shadow_table_is_read_and_a_bad_one_refused(tmp_path: Path) -> None:
    shadow = parse_shadow("x", {"rate": 100, "captures": "traces", "exclude": ["a"]}, tmp_path)
    assert shadow is not None
    assert (shadow.rate, shadow.captures, shadow.captures_model("a")) == (
        100,
        str(tmp_path / "traces"),
        False,
    )
    assert shadow.trace_settings()["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert parse_shadow("x", False, tmp_path) is None  # shadow = false: never captured
    for bad, said in [
        ({"rat": 1}, "unknown key"),
        ({"max_divergence": 2}, "max_divergence"),
        ("on", "table"),
    ]:
        with pytest.raises(UsageError, match=said):
            parse_shadow("x", bad, tmp_path)


def _request(x: float, out: dict[str, np.ndarray]) -> Captured:
    return Captured("m", "1", f"c{x}", {"X": np.array([[x]], np.float32)}, out)


def test_classification_counts_each_flip_by_its_direction_and_refuses_above_the_floor() -> None:
    assert kind_of(CLASSES + 'output [ { name: "S" data_type: TYPE_FP32 dims: [ 3 ] } ]') == {
        "S": "classification"
    }
    one, zero = np.array([[0.1, 0.9, 0.0]], np.float32), np.array([[0.9, 0.1, 0.0]], np.float32)
    serving = [one] * 97 + [zero] * 3
    candidate = [zero] * 2 + [one] * 95 + [one] * 3  # two rows 1 -> 0, three rows 0 -> 1
    requests = [_request(i, {"S": s}) for i, s in enumerate(serving)]
    ours = [({"S": c}, 1.0) for c in candidate]
    again = [({"S": s}, 1.0) for s in serving]
    result = compare(
        requests, ours, again, {"S": "classification"}, Shadow(top_k=2), ShadowResult("m", "2", "1")
    )
    assert (result.judged, result.diverged, result.floor, result.ok) == (100, 5, 0, False)
    [scores] = result.outputs
    assert scores.flips == {"0->1": 3, "1->0": 2}
    assert scores.top1 == pytest.approx(0.95)
    assert scores.topk == pytest.approx(1.0)  # each candidate's class is among serving's top 2
    assert "refused: 5 divergent request(s) above the floor" in result.verdict
    assert "output S (classification): 5 diverged, floor 0, top-1 agreement 95.0%" in result.verdict


def test_requests_that_failed_on_the_serving_version_are_not_held_against_the_candidate() -> None:
    same = {"Y": np.array([[1.0]], np.float32)}
    requests = [_request(i, same) for i in range(10)]
    ours = [(None, 1.0)] * 3 + [(same, 1.0)] * 7
    again = [(None, 1.0)] * 3 + [(same, 1.0)] * 7
    shadow = Shadow(min_captures=5)  # 7 judged: the default minimum (50) would be inconclusive
    result = compare(requests, ours, again, {"Y": "regression"}, shadow, ShadowResult("m", "2", "1"))
    assert (result.judged, result.serving_failed, result.diverged, result.ok) == (7, 3, 0, True)


def test_a_noisy_model_passes_on_its_floor_and_a_floor_too_high_refuses_showing_it() -> None:
    rng = np.random.default_rng(1)
    was = [np.array([[v]], np.float32) for v in rng.random(400)]
    noisy = [w + (1.0 if rng.random() < 0.05 else 0.0) for w in was]
    noisy_too = [w + (1.0 if rng.random() < 0.05 else 0.0) for w in was]
    requests = [_request(i, {"Y": w}) for i, w in enumerate(was)]
    result = compare(
        requests,
        [({"Y": n}, 1.0) for n in noisy],
        [({"Y": n}, 1.0) for n in noisy_too],
        {"Y": "regression"},
        Shadow(),
        ShadowResult("m", "2", "1"),
    )
    assert result.ok, result.verdict
    assert result.divergence > Shadow().max_divergence  # without its floor it would be refused
    assert result.floor > 0
    loud = [({"Y": w + 0.5}, 1.0) for w in was]
    result = compare(requests, loud, loud, {"Y": "regression"}, Shadow(), ShadowResult("m", "2", "1"))
    assert not result.ok
    assert "disagrees with itself on 100.0% of the requests (the noise floor)" in result.verdict


def test_the_ks_statistic_is_the_largest_gap_between_the_two_cdfs() -> None:
    a = np.arange(100, dtype=float)
    assert ks_statistic(a, a) == 0.0
    assert ks_statistic(a, a + 50) == pytest.approx(0.5)
    assert ks_statistic(a, a + 1000) == 1.0


def test_probes_are_taken_out_of_tritons_counts_and_their_own_kept() -> None:
    from pipelines.rollout.probes import Side

    counted = with_probes(metrics.Counters(120, 0, 120_000), Side(ok=18, failed=2))
    assert (counted.success, counted.failure, counted.probe_ok, counted.probe_failed) == (100, 0, 18, 2)
    assert counted.mean_latency_us == pytest.approx(1000)


def _shown() -> dict[str, Any]:
    result = ShadowResult("m", "2", "1", ok=False, verdict="refused: 5 divergent", judged=100, diverged=5)
    result.first = [
        {
            "request_id": "c|1",
            "inputs": {"X": "[1, 2] shape [1, 2]"},
            "serving": {"S": "[0.9]"},
            "candidate": "failed",
        }
    ]
    result.pairs_ms = [[1.0, 1.1], [2.0, 1.9]]
    return result.to_dict()


def test_the_report_shows_the_replay_and_the_first_divergent_requests_escaped() -> None:
    lines = _shadow_lines({"shadow": [_shown()]})
    text = "\n".join(lines)
    assert "| m | v2 vs v1 | 100 | 5 (5.0%) | 0 (0.0%) | refused: 5 divergent |" in text
    assert "| c\\|1 | X [1, 2] shape [1, 2] | S [0.9] | failed |" in text  # a cell cannot break the table


def test_the_mlflow_run_gets_the_divergence_table_and_a_plot(tmp_path: Path) -> None:
    shadow = _shown()
    shadow["outputs"] = [
        {
            "name": "S",
            "kind": "classification",
            "diverged": 5,
            "floor": 0,
            "histogram": {"classes": [0, 1], "serving": [3, 97], "candidate": [8, 92]},
        }
    ]
    write_shadow([shadow], tmp_path)
    table = json.loads((tmp_path / "shadow.json").read_text())
    assert table[0]["diverged"] == 5
    assert "histogram" not in table[0]["outputs"][0]
    assert (tmp_path / "shadow_m.png").read_bytes()[:4] == b"\x89PNG"
