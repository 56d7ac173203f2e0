"""One trace file, as Triton 2.51 writes it, read as untrusted input (issue 44).

mlreg arms capture with ``log_frequency = 1`` (``capture.py``): Triton then writes each sampled
request to its own file ``<file>.<n>``, a JSON list of that one trace's records, all with its trace
id (seen on the wheel's 2.51, gRPC and HTTP alike; the order of the records varies)::

    [{"id":2,"timestamps":[{"name":"HTTP_RECV_START","ns":1}]},
     {"id":2,"model_name":"m","model_version":1,"request_id":"c7"},
     {"id":2,"timestamps":[{"name":"REQUEST_START","ns":2}]},
     {"id":2,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":"X","data":"1,2","shape":"1,2","dtype":"FP32"}},
     {"id":2,"activity":"TENSOR_BACKEND_OUTPUT","tensor":{"name":"Y","data":"3","shape":"1,1","dtype":"FP32"}},
     ...]

Triton writes the client's ``request_id`` *unescaped*: an id such as ``x"},{"id":77,...`` closes
the string and adds records of the client's choosing.  So a file is judged by its structure before
anything in it is trusted -- an allow-list of what Triton writes for one request:

- exactly one record naming the model per trace id (with its version and, when the client sent
  one, the request id), and one trace id per file but for an ensemble's family (below);
- timestamp records of one stamp each, named by an activity Triton 2.51 has, each at most once;
- tensor records of the three tensor activities, each tensor name at most once per activity (a
  second input or output set is never Triton's);
- no other key anywhere, and no key written twice in one record (``json.loads`` would keep the
  last: an id adding ``"model_name":...`` again would relabel another model's request);
- a request to an *armed ensemble* is one family in one file (seen on the wheel's 2.51:
  ``tests/fixtures/ensemble_trace.json``): the request sent (the root, no ``parent_id``) and a
  child trace per step, whose model record adds ``"parent_id":<its parent's id>`` (numbered after
  the parent) with the same request id.  Each trace is held to the rules above; only the root is
  replayed -- a child is checked and counted, never judged (a client's id can forge a whole
  child that fits these rules: nothing tells it from Triton's own).  mlreg arms models, not ensembles:
  then a request through an ensemble writes no file at all (seen on 2.51), one sent to the model
  its own.

A file that breaks it is **forged**: none of its records is replayed, and each record that broke
it (another trace id, a repeated tensor or stamp, a record of an unknown shape) is counted.  JSON
nested deeper than the parser's bound (Python's recursion limit; Triton writes 4 levels) is
skipped with its reason, never a ``RecursionError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np  # at run time imported where used: the settings loader imports this module


MAX_TENSOR_BYTES = 64 << 20  # a captured tensor larger than this is not replayed
OPEN_KEYS = frozenset({"id", "model_name", "model_version", "request_id", "parent_id"})
TENSOR_FIELDS = frozenset({"name", "data", "shape", "dtype"})
_TOP_KEYS = tuple(f'"{k}"'.encode() for k in sorted(OPEN_KEYS | {"activity", "tensor", "timestamps"}))
INPUT, OUTPUT = "TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"
SIDES = (INPUT, OUTPUT)
TENSOR_ACTIVITIES = frozenset({INPUT, OUTPUT, "TENSOR_BACKEND_INPUT"})
# TRITONSERVER_InferenceTraceActivityString's timestamp activities and the frontends' own stamps
STAMPS = frozenset(
    {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"}
    | {"COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE"}
    | {"HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"}
    | {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"}
)
NOT_JSON = "trace file not readable as Triton's JSON (being written, or not a trace)"
TOO_DEEP = "trace file nested deeper than the parser's bound (Triton writes 4 levels): not parsed"
DUPLICATE_KEY = "trace file with a key written twice in one record (Triton never does): not parsed"
CHILDREN = "child traces of an ensemble request (checked, not replayed: the request sent is)"
FORGED = "forged records from request ids that break Triton's trace format"
NOT_REPLAYABLE = "a tensor that is not replayable (BYTES, or data not matching its shape)"
NOT_WHOLE = "trace file without a whole request (no model record, or no inputs or outputs)"
DTYPES = {  # Triton's data type -> numpy's name for it (numpy is imported where a tensor is built)
    "BOOL": "bool",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}


@dataclass
class Captured:
    """One captured request: its inputs, what the serving version answered, how long it took."""

    model: str
    version: str
    request_id: str
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    latency_us: float = 0.0
    source: str = ""  # file#trace id
    when: float = 0.0  # the file's modification time: capture order


@dataclass
class Reading:
    requests: list[Captured] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many (files or requests)
    files: int = 0  # files parsed
    forged: int = 0  # records that broke Triton's format (in ``forged_files`` files)
    forged_files: int = 0
    captured: int = 0  # honest captures of the version read (``requests``: one per distinct input)
    own: int = 0  # this promotion's own requests, left out

    def skip(self, why: str, count: int = 1) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + count

    def forgery(self, records: int) -> None:
        self.forged += records
        self.forged_files += 1
        self.skip(FORGED, records)


class _DuplicateKey(ValueError):
    """A key written twice in one object: json.loads would keep the last silently."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: an object whose keys are each written once (Triton writes no key
    twice; a request id that adds ``"model_name":...`` again would relabel the capture)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _DuplicateKey
    return found


def _maybe_repeated(data: bytes, records: Any) -> bool:
    """Whether a record of ``records`` (parsed from ``data``) may hold a key written twice: the
    cheap test of the usual file, with no ``object_pairs_hook`` call per object.  Without a
    backslash in the file every key is written literally, so the top-level keys written are
    counted in the bytes: more than the records hold (a key repeated, or a value spelling a key
    name) sends the file to the careful parse.  Nested objects are Triton's own (a request id
    can add records, not reach into the tensor or stamp objects Triton writes after it)."""
    if b"\\" in data or type(records) is not list:
        return True
    try:
        held = sum(map(len, records))  # a record that is no object is forged by parse_trace anyway
    except TypeError:
        return True
    return sum(map(data.count, _TOP_KEYS)) != held


def load_records(data: bytes, reading: Reading) -> list[Any] | None:
    """The file's records; None (and why, counted) when it is not Triton's JSON list.  The parser's
    depth is bounded by the interpreter's recursion limit (a ``RecursionError`` is caught here, never
    raised): Triton nests 4 levels, so anything deeper came from a request id and is forged.  A key
    written twice in one record is forged too (``_unique``)."""
    try:
        records = json.loads(data)
        if _maybe_repeated(data, records):  # then parsed again, each object's keys checked
            records = json.loads(data, object_pairs_hook=_unique)
    except RecursionError:
        reading.forgery(1)
        reading.skip(TOO_DEEP)
        return None
    except _DuplicateKey:
        reading.forgery(1)
        reading.skip(DUPLICATE_KEY)
        return None
    except ValueError:
        reading.skip(NOT_JSON)
        return None
    if not isinstance(records, list):
        reading.skip(NOT_JSON)
        return None
    return records


def parse_trace(records: list[Any], source: str, reading: Reading) -> Captured | None:
    """The one request a file holds -- its root trace's; None when the file is forged (counted),
    holds a tensor that cannot be replayed, or no whole request (each counted under its reason).
    The child traces of an ensemble request (``parent_id``) are checked, never replayed."""
    traces, bad, first = _grouped(records)
    root, family_bad = _family(traces, first)
    if bad + family_bad:
        reading.forgery(bad + family_bad)
        return None
    if len(traces) > 1:
        reading.skip(CHILDREN, len(traces) - 1)
    check = traces[root] if root is not None else None
    if check is None:
        return None
    return _request_of(check, source, reading)


def _grouped(records: list[Any]) -> tuple[dict[int, _Check], int, int | None]:
    """Each trace id's records checked; the records that fit no trace; the file's first trace id."""
    traces: dict[int, _Check] = {}
    bad, first = 0, None
    for record in records:
        trace_id = record.get("id") if type(record) is dict else None
        if type(trace_id) is not int:
            bad += 1
            continue
        check = traces.get(trace_id)
        if check is None:
            check = traces[trace_id] = _Check(trace_id)
            first = trace_id if first is None else first
        bad += not check.take(record)
    return traces, bad, first


def _request_of(check: _Check, source: str, reading: Reading) -> Captured | None:
    """The root trace's request, when whole and replayable (else why, counted)."""
    request = check.request
    if request is None or not request.inputs or not request.outputs or check.broken:
        if request is not None or check.broken:
            reading.skip(NOT_REPLAYABLE if check.broken else NOT_WHOLE)
        return None
    request.source = f"{source}#{check.trace_id}"
    if "REQUEST_START" in check.stamps and "REQUEST_END" in check.stamps:
        request.latency_us = (check.stamps["REQUEST_END"] - check.stamps["REQUEST_START"]) / 1000
    return request


def _family(traces: Mapping[int, _Check], first: int | None) -> tuple[int | None, int]:
    """The root trace of a file and how many records break the family Triton 2.51 writes for one
    request (seen on the wheel's server: tests/fixtures/ensemble_trace.json): exactly one trace
    without ``parent_id`` -- the request the client sent (several: the one of the file's first
    record is kept); every other trace a child, whose model record names as ``parent_id`` a trace
    of the file with a smaller id (Triton numbers a child after its parent) and carries the root's
    request id; every trace with its model record.  A trace that breaks it counts all its records."""
    roots = [t for t in traces.values() if t.request is not None and t.parent is None]
    root = next((t for t in roots if t.trace_id == first), roots[0] if roots else None)
    bad = sum(t.records for t in traces.values() if t is not root and not _child(t, traces, root))
    return (root.trace_id if root is not None else None), bad


def _child(trace: _Check, traces: Mapping[int, _Check], root: _Check | None) -> bool:
    """Whether ``trace`` is an honest child of the file's ``root`` family."""
    if root is None or root.request is None or trace.request is None or trace.parent is None:
        return False
    parent = traces.get(trace.parent)
    if parent is None or parent.request is None or trace.parent >= trace.trace_id:
        return False
    return trace.request.request_id == root.request.request_id


class _Check:
    """The allow-list of one trace's records (the module's docstring), applied record by record;
    ``take`` says whether the record fits it."""

    def __init__(self, trace_id: int) -> None:
        self.trace_id = trace_id
        self.parent: int | None = None  # a child trace's parent_id
        self.request: Captured | None = None
        self.stamps: dict[str, int] = {}
        self.tensors: dict[str, set[str]] = {a: set() for a in TENSOR_ACTIVITIES}
        self.pending: list[tuple[str, Mapping[str, Any]]] = []  # tensors before the model record
        self.broken = False
        self.records = 0  # records that fit

    def take(self, record: dict[str, Any]) -> bool:
        fits = False
        if len(record) == 2:  # {"id", "timestamps"}: most of a file
            fits = self._stamp(record.get("timestamps"))
        elif "model_name" in record:
            fits = self._open(record, record.keys())
        elif len(record) == 3 and "activity" in record and "tensor" in record:
            fits = self._tensor(record["activity"], record["tensor"])
        self.records += fits
        return fits

    def _open(self, record: dict[str, Any], keys: Any) -> bool:
        name, version = record["model_name"], record.get("model_version")
        request_id, parent = record.get("request_id", ""), record.get("parent_id")
        if self.request is not None or not keys <= OPEN_KEYS or not isinstance(name, str):
            return False
        if type(version) is not int or not isinstance(request_id, str):
            return False
        if "parent_id" in record and (type(parent) is not int or parent == self.trace_id):
            return False
        self.parent = parent
        self.request = Captured(name, str(version), request_id)
        for activity, tensor in self.pending:
            self._add(activity, tensor)
        self.pending.clear()
        return True

    def _stamp(self, stamps: Any) -> bool:
        if type(stamps) is not list or len(stamps) != 1:
            return False
        stamp = stamps[0]
        if type(stamp) is not dict or len(stamp) != 2:
            return False
        name, ns = stamp.get("name"), stamp.get("ns")
        if type(name) is not str or name not in STAMPS or type(ns) is not int or name in self.stamps:
            return False
        self.stamps[name] = ns
        return True

    def _tensor(self, activity: Any, tensor: Any) -> bool:
        if type(activity) is not str or activity not in TENSOR_ACTIVITIES:
            return False
        if type(tensor) is not dict or tensor.keys() != TENSOR_FIELDS:
            return False
        if not all(type(v) is str for v in tensor.values()):
            return False  # Triton writes each field as a string
        name = tensor["name"]
        if name in self.tensors[activity]:
            return False  # a second input or output set: never Triton's for one request
        self.tensors[activity].add(name)
        if activity in SIDES:
            if self.request is None:
                self.pending.append((activity, tensor))
            else:
                self._add(activity, tensor)
        return True

    def _add(self, activity: str, tensor: Mapping[str, Any]) -> None:
        assert self.request is not None
        array = tensor_of(tensor)
        if array is None:
            self.broken = True
            return
        side = self.request.inputs if activity == INPUT else self.request.outputs
        side[str(tensor["name"])] = array


def tensor_of(tensor: Mapping[str, Any]) -> np.ndarray | None:
    """A traced tensor (``data`` "1,2,3", ``shape`` "1,3", ``dtype`` "FP32") as an array; None when
    it cannot be replayed faithfully (BYTES, a size that does not match, too large)."""
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    name = DTYPES.get(str(tensor.get("dtype", "")))
    dtype = None if name is None else np.dtype(name)
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
    import numpy as np  # lazy: ~0.15 s, off the settings loader's path (the module's TYPE_CHECKING note)

    if np.dtype(dtype).kind == "b":
        return np.array([v.strip() in ("1", "true") for v in values], dtype=dtype).reshape(shape)
    if np.dtype(dtype).kind == "f":
        return np.array([float(v) for v in values]).astype(dtype).reshape(shape)
    return np.array([int(v) for v in values]).astype(dtype).reshape(shape)
