"""Capture of production requests for the shadow replay (``pipelines/promote/replay.py``).

Triton's trace extension records, per sampled request, its inputs (``TENSOR_QUEUE_INPUT``) and the
serving version's outputs (``TENSOR_BACKEND_OUTPUT``) with model, version, request id and
timestamps: no mesh, no restart, switched on per model at run time (FACTS.md, 2.51).  An
environment opts in:

[environments.production.shadow]
rate = 1000              # one request in every 1000 is captured (Triton's trace_rate)
count = 500              # at most this many per model between two promotions (trace_count)
captures = "/var/lib/triton-traces"   # where the replicas' trace files are read: a folder or s3://
max_bytes = 268435456    # trace files kept (the oldest go first), and...
max_age_hours = 168      # ...none older than this
tolerance = 0.001        # regression outputs: |candidate - serving| <= tolerance x (1 + |serving|)
max_divergence = 0.005   # share of requests the candidate may diverge on above the noise floor
max_floor = 0.2          # above this the serving version disagrees with itself too often to judge
top_k = 5                # classification outputs: top-k agreement
exclude = ["table_data_model"]   # models never captured (their tensors hold personal data)

``shadow = false`` in the environment's section says the same as no table: nothing is ever
captured there.  Triton must run with ``--trace-config triton,file=<captures>/<replica>.json``
(compose, Kubernetes and the local stack do); it writes ``<file>.<n>`` every ``log_frequency``
traces.  Tensors may hold personal data: ``mlreg shadow purge`` switches capture off on every
replica and deletes every captured file.

Trace files are parsed, never run: a file that is not Triton's JSON, a tensor whose data does not
match its shape, or one over ``MAX_TENSOR_BYTES`` is skipped and counted, not trusted.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from registry.errors import MlregError, UsageError

if TYPE_CHECKING:
    from pipelines.storage.s3 import S3Store

log = logging.getLogger(__name__)

SHADOW_KEYS = frozenset(
    {"rate", "count", "captures", "max_bytes", "max_age_hours", "tolerance", "max_divergence"}
    | {"max_floor", "top_k", "exclude", "log_frequency"}
)
LEVELS = ["TIMESTAMPS", "TENSORS"]
MAX_TENSOR_BYTES = 64 << 20  # a captured tensor larger than this is not replayed
# a trace file larger than this is not read (nor parsed): its JSON alone would hold more than a
# tensor mlreg replays (64 MiB of float32 is ~160 MB of Triton's text)
MAX_FILE_BYTES = 256 << 20
DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class Shadow:
    """An environment's capture and replay settings (``[environments.X.shadow]``)."""

    rate: int = 1000
    count: int = 500
    captures: str = ""
    max_bytes: int = 256 << 20
    max_age_hours: float = 168.0
    tolerance: float = 1e-3
    max_divergence: float = 0.005
    max_floor: float = 0.2
    top_k: int = 5
    exclude: tuple[str, ...] = ()
    log_frequency: int = 1  # a file per trace: nothing captured waits in memory (a purge is complete)

    def captures_model(self, model: str) -> bool:
        return model not in self.exclude

    def trace_settings(self) -> dict[str, Any]:
        """Triton's per-model trace settings that switch capture on."""
        return {
            "trace_level": LEVELS,
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(min(self.log_frequency, self.count)),
        }


OFF: dict[str, Any] = {"trace_level": ["OFF"]}


def parse_shadow(where: str, raw: object, base: Path) -> Shadow | None:
    """``raw``: the environment's ``shadow`` value (absent or false: None)."""
    if raw is None or raw is False:
        return None
    if raw is True:
        raw = {}
    fix = (
        "write e.g. [environments.X.shadow] rate = 1000, count = 500, "
        'captures = "/var/lib/triton-traces" (or shadow = false)'
    )
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where}: shadow must be a table or false, not {raw!r}", fix=fix)
    unknown = sorted(set(raw) - SHADOW_KEYS)
    if unknown:
        raise UsageError(
            f"{where} shadow: unknown key(s) {', '.join(map(repr, unknown))}",
            fix=f"the valid keys are: {', '.join(sorted(SHADOW_KEYS))}",
        )
    defaults = Shadow()
    try:
        captures = raw.get("captures", "")
        if not isinstance(captures, str):
            raise ValueError(f"captures must be a folder or an s3:// URI, not {captures!r}")
        if captures and "://" not in captures:
            captures = str(base / Path(captures).expanduser())
        exclude = raw.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(m, str) for m in exclude):
            raise ValueError(f"exclude must be a list of model names, not {exclude!r}")
        return Shadow(
            rate=_whole(raw, "rate", defaults.rate),
            count=_whole(raw, "count", defaults.count),
            captures=captures,
            max_bytes=_whole(raw, "max_bytes", defaults.max_bytes),
            max_age_hours=_real(raw, "max_age_hours", defaults.max_age_hours, 0.0, math.inf),
            tolerance=_real(raw, "tolerance", defaults.tolerance, 0.0, math.inf),
            max_divergence=_real(raw, "max_divergence", defaults.max_divergence, 0.0, 1.0),
            max_floor=_real(raw, "max_floor", defaults.max_floor, 0.0, 1.0),
            top_k=_whole(raw, "top_k", defaults.top_k),
            exclude=tuple(exclude),
            log_frequency=_whole(raw, "log_frequency", defaults.log_frequency),
        )
    except ValueError as exc:
        raise UsageError(f"{where} shadow: {exc}", fix=fix) from exc


def _whole(raw: Mapping[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a whole number of at least 1, not {value!r}")
    return value


def _real(raw: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{key} must be a number within {low:g}..{high:g}, not {value!r}")
    return float(value)


# -- switching capture on and off on the replicas ------------------------------------------------


def arm(
    targets: Sequence[str], connect: Callable[[str], Any], models: Iterable[str], shadow: Shadow
) -> list[str]:
    """Capture ``models`` (those the environment lets) on every target; what could not, as notes
    (a replica that cannot capture never fails a promotion: the next replay has less to read)."""
    notes = []
    wanted = [m for m in models if shadow.captures_model(m)]
    for url in targets if wanted else ():
        try:
            with connect(url) as triton:
                for model in wanted:
                    triton.trace_settings(model, shadow.trace_settings())
        except MlregError as exc:
            notes.append(f"capture not switched on at {url}: {exc.message}")
    return notes


def disarm(targets: Sequence[str], connect: Callable[[str], Any], models: Iterable[str]) -> list[str]:
    """Capture off for ``models`` on every target; the replicas that could not be reached."""
    failed = []
    for url in targets:
        try:
            with connect(url) as triton:
                for model in models:
                    triton.trace_settings(model, OFF)
        except MlregError as exc:
            failed.append(f"{url}: {exc.message}")
    return failed


# -- the trace files: where they are, their bounds, purge -------------------------------------------


@dataclass(frozen=True)
class TraceFile:
    name: str  # relative to the captures location
    size: int
    mtime: float


class Captures:
    """The trace files under a folder or an ``s3://bucket/prefix`` (what Triton or its sidecar wrote)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._s3: S3Store | None = None
        if location.startswith("s3://"):
            from pipelines.storage import open_store  # lazy: store package ~0.15 s, s3:// only
            from pipelines.storage.s3 import S3Store  # lazy: loaded by open_store just above

            store = open_store(location)
            assert isinstance(store, S3Store)  # an s3:// URI opens one
            self._s3 = store

    def files(self) -> list[TraceFile]:
        """Every trace file, oldest first (then by name: ``trace.json.9`` before ``trace.json.10``)."""
        found: list[TraceFile] = []
        if self._s3 is not None:
            found = [TraceFile(name, size, mtime) for name, size, mtime in self._s3.listing()]
        else:
            root = Path(self.location)
            if root.is_dir():
                for path in root.rglob("*"):
                    if path.is_file() and not path.is_symlink():
                        stat = path.stat()
                        found.append(
                            TraceFile(path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime)
                        )
        return sorted((f for f in found if is_trace_name(f.name)), key=lambda f: (f.mtime, _order(f.name)))

    def read(self, name: str) -> bytes:
        """The file's bytes; OSError when it is gone (rotated or pruned since it was listed)."""
        if self._s3 is not None:
            data = self._s3.read(name)
            if data is None:
                raise FileNotFoundError(f"{self.location}: '{name}' is gone")
            return data
        return (Path(self.location) / name).read_bytes()

    def delete(self, names: Sequence[str]) -> None:
        if self._s3 is not None:
            self._s3.delete_keys(list(names))
            return
        for name in names:
            (Path(self.location) / name).unlink(missing_ok=True)

    def prune(self, shadow: Shadow, now: float | None = None) -> list[str]:
        """Keep the files within ``max_age_hours`` and ``max_bytes`` (the oldest go first)."""
        now = time.time() if now is None else now
        files = self.files()
        old = [f for f in files if now - f.mtime > shadow.max_age_hours * 3600]
        kept = [f for f in files if f not in old]
        total = sum(f.size for f in kept)
        over = []
        for f in kept:
            if total <= shadow.max_bytes:
                break
            over.append(f)
            total -= f.size
        gone = [f.name for f in old + over]
        self.delete(gone)
        return gone


def is_trace_name(name: str) -> bool:
    """``x.json`` or ``x.json.<n>`` (what ``--trace-config triton,file=x.json`` writes)."""
    base = name.rsplit("/", 1)[-1]
    stem, _, index = base.rpartition(".")
    return base.endswith(".json") or (stem.endswith(".json") and index.isdigit())


def _order(name: str) -> tuple[str, int]:
    stem, _, index = name.rpartition(".")
    return (stem, int(index)) if index.isdigit() else (name, -1)


# -- parsing what Triton wrote -------------------------------------------------------------------------


@dataclass
class Captured:
    """One captured request: its inputs, what the serving version answered, how long it took."""

    model: str
    version: str
    request_id: str
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    latency_us: float = 0.0
    source: str = ""  # file:trace id


@dataclass
class Reading:
    requests: list[Captured] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many (files or requests)
    files: int = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def read_captures(location: str, model: str, version: str, limit: int) -> Reading:
    """The captured requests of ``model`` ``version`` under ``location``, in capture order (the
    newest ``limit`` of them: files are read newest first, and no further once enough are found;
    a file that does not name the model is not parsed)."""
    reading = Reading()
    if not location:
        return reading
    captures = Captures(location)
    named = json.dumps(model).encode()  # the name, quoted: a file without it holds none of its traces
    found: list[list[Captured]] = []  # per file, newest file first
    count = 0
    for file in reversed(captures.files()):
        if count >= limit:
            break
        if file.size > MAX_FILE_BYTES:
            reading.skip(f"trace file over {MAX_FILE_BYTES >> 20} MiB: not read")
            continue
        try:
            data = captures.read(file.name)
            records = json.loads(data) if named in data else []
        except (OSError, ValueError, MlregError):
            reading.skip("trace file not readable as Triton's JSON (being written, or not a trace)")
            continue
        if not isinstance(records, list):
            reading.skip("trace file not readable as Triton's JSON (being written, or not a trace)")
            continue
        reading.files += 1
        mine = [
            r for r in parse_traces(records, file.name, reading) if r.model == model and r.version == version
        ]
        found.append(mine)
        count += len(mine)
    reading.requests = [r for mine in reversed(found) for r in mine][-limit:]
    return reading


def parse_traces(records: list[Any], source: str, reading: Reading) -> list[Captured]:
    """Triton's trace records (one list per file), grouped by trace id, as requests in id order."""
    traces: dict[int, Captured] = {}
    times: dict[int, dict[str, int]] = {}
    broken: set[int] = set()
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("id"), int):
            _take_record(record, source, traces, times, broken)
    out = []
    for trace_id, request in sorted(traces.items()):
        if trace_id in broken:
            reading.skip("a tensor that is not replayable (BYTES, or data not matching its shape)")
        elif request.inputs and request.outputs:  # else an ensemble's own trace, or a refused request
            _set_latency(request, times.get(trace_id, {}))
            out.append(request)
    return out


def _take_record(
    record: dict[str, Any],
    source: str,
    traces: dict[int, Captured],
    times: dict[int, dict[str, int]],
    broken: set[int],
) -> None:
    """One trace record into its trace: the request it opens, a tensor, or timestamps."""
    trace_id = record["id"]
    if "model_name" in record:
        traces[trace_id] = Captured(
            str(record["model_name"]),
            str(record.get("model_version", "")),
            str(record.get("request_id", "")),
            source=f"{source}#{trace_id}",
        )
    elif record.get("activity") in SIDES and isinstance(record.get("tensor"), dict):
        if not _add_tensor(traces.get(trace_id), record["activity"], record["tensor"]):
            broken.add(trace_id)
    elif isinstance(record.get("timestamps"), list):
        stamps = times.setdefault(trace_id, {})
        stamps.update(
            (str(s.get("name")), s["ns"])
            for s in record["timestamps"]
            if isinstance(s, dict) and isinstance(s.get("ns"), int)
        )


def _set_latency(request: Captured, stamps: dict[str, int]) -> None:
    if "REQUEST_START" in stamps and "REQUEST_END" in stamps:
        request.latency_us = (stamps["REQUEST_END"] - stamps["REQUEST_START"]) / 1000


SIDES = ("TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT")


def _add_tensor(request: Captured | None, activity: str, tensor: Mapping[str, Any]) -> bool:
    """``tensor`` added to ``request``'s inputs or outputs; False when it cannot be replayed."""
    array = tensor_of(tensor)
    if array is None:
        return False
    if request is not None:
        side = request.inputs if activity == SIDES[0] else request.outputs
        side[str(tensor.get("name", ""))] = array
    return True


def tensor_of(tensor: Mapping[str, Any]) -> np.ndarray | None:
    """A traced tensor (``data`` "1,2,3", ``shape`` "1,3", ``dtype`` "FP32") as an array; None when
    it cannot be replayed faithfully (BYTES, a size that does not match, too large)."""
    dtype = DTYPES.get(str(tensor.get("dtype", "")))
    data, shape_text = tensor.get("data"), tensor.get("shape")
    if dtype is None or not isinstance(data, str) or not isinstance(shape_text, str):
        return None
    try:
        shape = tuple(int(d) for d in shape_text.split(",")) if shape_text else ()
        size = math.prod(shape)
        if any(d < 0 for d in shape) or size * np.dtype(dtype).itemsize > MAX_TENSOR_BYTES:
            return None
        values = [v for v in data.split(",") if v != ""]
        return _array_of(values, dtype, shape) if len(values) == size else None
    except (ValueError, OverflowError):
        return None


def _array_of(values: list[str], dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Traced values as an array of ``dtype`` (raises ValueError, OverflowError)."""
    if dtype is np.bool_:
        return np.array([v.strip() in ("1", "true") for v in values], dtype=dtype).reshape(shape)
    if np.dtype(dtype).kind == "f":
        return np.array([float(v) for v in values]).astype(dtype).reshape(shape)
    return np.array([int(v) for v in values]).astype(dtype).reshape(shape)


def purge(location: str) -> list[str]:
    """Delete every captured file under ``location``; their names."""
    if not location:
        return []
    captures = Captures(location)
    names = [f.name for f in captures.files()]
    captures.delete(names)
    return names
