"""The forgery check's cost (issue 44): reading 20,000 trace files with every file judged against
Triton's format (``pipelines/checks/traces.py``), beside today's read -- the reading path as it
was before issue 44 (``read_captures`` newest first, ``json.loads`` and ``parse_traces`` grouping
records by trace id, no structure check), kept below as the baseline -- in one run.

The files are written byte for byte as Triton 2.51 writes one sampled HTTP request with
``log_frequency 1`` (``tests/component/test_shadow_forgery.triton_file``: 15 records, a ``[1, 4]`` FP32
input and a ``[1, 1]`` output), ``--forged`` of them (default 1 %) forged through their request id
(10 fake requests each).  Both sides read every file (limit above the file count: the old early
stop would otherwise read fewer), in interleaved rounds (ABAB...), on a warm page cache.  Each
side's wall and CPU seconds (``time.process_time``: what this process spent, which the other
helpers' load on a shared machine tilts less), the medians, and the ratio both ways: of the medians
and the median of the per-round ratios (target <= 1.1x).  A third side, ``checked_in_order``, runs
the same check with the files read newest first as today (``_sampled`` patched to that order): the
check's cost apart from the sample's random order (which, on a cold page cache, costs seeks).
Both must find the same honest requests.

    .venv/bin/python benchmarks/shadow_forgery.py [--files 20000] [--rounds 5] [--forged 0.01]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.checks import capture  # noqa: E402
from pipelines.checks.capture import Captures, read_captures  # noqa: E402
from pipelines.checks.traces import (  # noqa: E402
    Captured,
    Reading,
    tensor_of,
)

FORGERY: Any = importlib.import_module("tests.component.test_shadow_forgery")


# -- today's read (before issue 44), kept as the baseline ------------------------------------------------


def old_read_captures(location: str, model: str, version: str, limit: int) -> Reading:
    reading = Reading()
    captures = Captures(location)
    named = json.dumps(model).encode()
    found: list[list[Captured]] = []
    count = 0
    for file in reversed(captures.files()):
        if count >= limit:
            break
        try:
            data = captures.read(file.name)
            records = json.loads(data) if named in data else []
        except (OSError, ValueError):
            reading.skip("not readable")
            continue
        if not isinstance(records, list):
            reading.skip("not readable")
            continue
        reading.files += 1
        mine = [
            r
            for r in old_parse_traces(records, file.name, reading)
            if r.model == model and r.version == version
        ]
        found.append(mine)
        count += len(mine)
    reading.requests = [r for mine in reversed(found) for r in mine][-limit:]
    return reading


def old_parse_traces(records: list[Any], source: str, reading: Reading) -> list[Captured]:
    traces: dict[int, Captured] = {}
    times: dict[int, dict[str, int]] = {}
    broken: set[int] = set()
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("id"), int):
            _old_take(record, source, traces, times, broken)
    out = []
    for trace_id, request in sorted(traces.items()):
        if trace_id in broken:
            reading.skip("not replayable")
        elif request.inputs and request.outputs:
            stamps = times.get(trace_id, {})
            if "REQUEST_START" in stamps and "REQUEST_END" in stamps:
                request.latency_us = (stamps["REQUEST_END"] - stamps["REQUEST_START"]) / 1000
            out.append(request)
    return out


def _old_take(
    record: dict[str, Any],
    source: str,
    traces: dict[int, Captured],
    times: dict[int, dict[str, int]],
    broken: set[int],
) -> None:
    trace_id = record["id"]
    if "model_name" in record:
        traces[trace_id] = Captured(
            str(record["model_name"]),
            str(record.get("model_version", "")),
            str(record.get("request_id", "")),
            source=f"{source}#{trace_id}",
        )
    elif record.get("activity") in ("TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT") and isinstance(
        record.get("tensor"), dict
    ):
        array = tensor_of(record["tensor"])
        request = traces.get(trace_id)
        if array is None:
            broken.add(trace_id)
        elif request is not None:
            side = request.inputs if record["activity"] == "TENSOR_QUEUE_INPUT" else request.outputs
            side[str(record["tensor"].get("name", ""))] = array
    elif isinstance(record.get("timestamps"), list):
        stamps = times.setdefault(trace_id, {})
        stamps.update(
            (str(s.get("name")), s["ns"])
            for s in record["timestamps"]
            if isinstance(s, dict) and isinstance(s.get("ns"), int)
        )


# -- the run -------------------------------------------------------------------------------------------


def write_files(folder: Path, files: int, forged_share: float) -> int:
    rng = np.random.default_rng(5)
    folder.mkdir(parents=True)
    every = int(1 / forged_share) if forged_share > 0 else 0
    forged = 0
    for n in range(files):
        x = rng.random((1, 4), dtype=np.float32)
        request_id = f"c{n}"
        if every and n % every == every - 1:
            request_id, forged = FORGERY.forging_id(1_000_000 + 100 * n, 10), forged + 1
        path = folder / f"trace.json.{n}"
        path.write_bytes(FORGERY.triton_file(n + 1, request_id, x, x.sum(axis=1, keepdims=True)))
        os.utime(path, (1000 + n, 1000 + n))
    return forged


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forged", type=float, default=0.01)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-forgery-") as tmp:
        folder = Path(tmp) / "traces"
        forged = write_files(folder, args.files, args.forged)
        limit = args.files * 20  # above every request the files hold: both sides read them all
        old_read_captures(str(folder), "m", "1", limit)  # warm the page cache
        names = ["today", "checked", "checked_in_order"]
        sides: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        found: dict[str, Reading] = {}
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for side in order:
                began, began_cpu = time.perf_counter(), time.process_time()
                if side == "today":
                    found[side] = old_read_captures(str(folder), "m", "1", limit)
                elif side == "checked":
                    found[side] = read_captures(str(folder), "m", "1", limit, deadline_s=3600)
                else:  # the check without the sample's random order: files read newest first, as today
                    with patch.object(capture, "_sampled", lambda listed: listed[::-1]):
                        found[side] = read_captures(str(folder), "m", "1", limit, deadline_s=3600)
                sides[side].append(time.perf_counter() - began)
                cpu[side].append(time.process_time() - began_cpu)
                print(
                    f"round {round_} {side}: {sides[side][-1]:.3f} s wall, {cpu[side][-1]:.3f} s cpu",
                    file=sys.stderr,
                    flush=True,
                )
    today, checked = found["today"], found["checked"]
    honest = {r.request_id for r in checked.requests}
    assert honest == {f"c{n}" for n in range(args.files)} - {
        f"c{n}"
        for n in range(args.files)
        if args.forged and n % int(1 / args.forged) == int(1 / args.forged) - 1
    }
    assert checked.forged_files == forged
    print(f"trace files  {args.files} files")
    print(f"forged files  {forged} files ({checked.forged} forged records found by the check)")
    print(f"requests read today  {len(today.requests)} requests (fakes included: no check)")
    print(f"requests read checked  {len(checked.requests)} requests (honest only)")
    for label, times in (("wall", sides), ("cpu", cpu)):
        medians = {side: statistics.median(values) for side, values in times.items()}
        for side in names:
            print(f"{side} read, {label} (median of {args.rounds})  {medians[side]:.3f} s")
        for side in names[1:]:
            paired = statistics.median(c / t for c, t in zip(times[side], times["today"], strict=True))
            print(f"ratio {side} / today, {label}, of the medians  {medians[side] / medians['today']:.3f} x")
            print(f"ratio {side} / today, {label}, median per round  {paired:.3f} x (target <= 1.1)")


if __name__ == "__main__":
    main()
