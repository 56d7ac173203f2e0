"""Capture of production requests for the shadow replay (``pipelines/checks/replay.py``).

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
(compose, Kubernetes and the local stack do); mlreg arms it with ``log_frequency = 1``, so Triton
writes each sampled request to its own file ``<file>.<n>`` -- the unit the forgery check of
``traces.py`` judges (a request id is written into it unescaped: client input).

``captures`` is required, except on the local stack (an environment whose store is the stack's
repository), where it defaults to every replica's trace folder (``<stack>/traces``,
``<stack>/replica-N/traces``).  A ``captures`` that is, holds or lies inside the store, its archive,
``MLREG_HOME`` or the stack's state folder is refused when the settings load: prune and purge delete
there.  They delete only what Triton writes for mlreg's arming: files named ``<name>.json.<n>``,
directly under a captures folder or one replica folder below it -- never anything else.

Also: ``min_captures`` (default ``min(50, count)``): fewer honest captures than this and the replay
is *inconclusive*, which refuses the promotion unless ``--skip-shadow``; ``record_tensors``
(default false): whether the first divergent requests' tensors (personal data) go into the report
and the MLflow run -- otherwise only their figures do.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.checks.traces import (
    NOT_JSON,
    Captured,
    Reading,
    load_records,
    parse_trace,
)
from registry.errors import MlregError, StorageError, UsageError

if TYPE_CHECKING:
    from pipelines.storage.objects import ObjectStore
    from registry.settings import Settings

log = logging.getLogger(__name__)

SHADOW_KEYS = frozenset(
    {"rate", "count", "captures", "max_bytes", "max_age_hours", "tolerance", "max_divergence"}
    | {"max_floor", "top_k", "exclude", "log_frequency", "min_captures", "record_tensors"}
)
LEVELS = ["TIMESTAMPS", "TENSORS"]
MIN_CAPTURES = 50  # honest captures a verdict needs (default; never more than ``count``)
# a trace file larger than this is not read (nor parsed): its JSON alone would hold more than a
# tensor mlreg replays (64 MiB of float32 is ~160 MB of Triton's text)
MAX_FILE_BYTES = 256 << 20
READ_DEADLINE_S = 60.0  # reading the captures for one replay: past this it fails, named
S3_PATIENCE = (10.0, 1)  # each S3 request on the captures: read timeout (s), retries
# what Triton writes for ``--trace-config triton,file=<x>.json`` armed with log_frequency 1
TRACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.json\.[0-9]{1,12}")
STACK_TRACES = "traces"  # the local stack's trace folder in each replica's state folder


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
    log_frequency: int = 1  # a file per trace: the forgery check's unit, and a purge is complete
    min_captures: int = 0  # honest captures a verdict needs (0: min(MIN_CAPTURES, count))
    record_tensors: bool = False  # the first divergent requests' tensors into reports and MLflow
    stack: str = ""  # the local stack's state folder: its replicas' trace folders are the captures
    # this promotion's own request ids start with this secret (pipelines.triton.control.RequestNonce): set
    # when the promotion starts, never shown (repr) nor recorded
    own: str = field(default="", repr=False, compare=False)

    def captures_model(self, model: str) -> bool:
        return model not in self.exclude

    @property
    def least(self) -> int:
        """Honest captures a verdict needs."""
        return self.min_captures or min(MIN_CAPTURES, self.count)

    def locations(self) -> list[str]:
        """Where the trace files are: ``captures``, or each local-stack replica's trace folder."""
        if self.captures:
            return [self.captures]
        if not self.stack:
            return []
        stack = Path(self.stack)  # the folders of the replicas started so far (`stack up --replicas N`)
        replicas = sorted(stack.glob(f"replica-*/{STACK_TRACES}"), key=lambda p: p.parent.name)
        return [str(p) for p in [stack / STACK_TRACES, *replicas] if p.is_dir() and not p.is_symlink()]

    def where(self) -> str:
        return ", ".join(self.locations()) or "(no captures location)"

    def trace_settings(self) -> dict[str, Any]:
        """Triton's per-model trace settings that switch capture on."""
        return {
            "trace_level": LEVELS,
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": "1",  # one file per trace: what traces.py judges
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
    try:
        return _shadow_of(raw, base)
    except ValueError as exc:
        raise UsageError(f"{where} shadow: {exc}", fix=fix) from exc


def _shadow_of(raw: Mapping[str, Any], base: Path) -> Shadow:
    defaults = Shadow()
    captures = raw.get("captures", "")
    if not isinstance(captures, str):
        raise ValueError(f"captures must be a folder or an s3:// URI, not {captures!r}")
    if captures and "://" not in captures:
        captures = str((base / Path(captures).expanduser()).resolve())
    exclude = raw.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(m, str) for m in exclude):
        raise ValueError(f"exclude must be a list of model names, not {exclude!r}")
    if raw.get("log_frequency", 1) != 1:
        raise ValueError(
            f"log_frequency must be 1 (one file per trace: what the forgery check judges), not "
            f"{raw['log_frequency']!r}"
        )
    record_tensors = raw.get("record_tensors", False)
    if not isinstance(record_tensors, bool):
        raise ValueError(f"record_tensors must be true or false, not {record_tensors!r}")
    shadow = Shadow(
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
        min_captures=_whole(raw, "min_captures", 1) if "min_captures" in raw else 0,
        record_tensors=record_tensors,
    )
    if shadow.least > shadow.count:
        raise ValueError(
            f"min_captures {shadow.least} is more than count {shadow.count} (what one arming captures): "
            "no replay could ever judge"
        )
    return shadow


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


def settle(where: str, shadow: Shadow | None, store: str, settings: Settings) -> Shadow | None:
    """``shadow`` where it can be read, or refused: a missing ``captures`` defaults to the local
    stack's trace folders when ``store`` is the stack's repository; a ``captures`` that is, holds
    or lies inside something mlreg keeps (the store, its archive, ``MLREG_HOME``, the stack's
    state) is refused -- prune and purge delete under it."""
    if shadow is None:
        return None
    if not shadow.captures:
        if _local(store) and Path(store).resolve() == Path(settings.local_repository).resolve():
            return replace(shadow, stack=str(settings.stack_dir))
        raise UsageError(
            f"{where} shadow: no captures location: the replay would have nothing to read",
            fix="add captures = \"<the folder or s3:// prefix the replicas' --trace-config file= "
            'writes to>" to the shadow table (only the local stack has a default)',
        )
    kept = {
        "the store": store,
        "MLREG_HOME": str(settings.home),
        "the stack's state": str(settings.stack_dir),
    }
    kept["the store's archive"] = _archive_of(store)
    for what, location in kept.items():
        if location and _overlap(shadow.captures, location):
            raise UsageError(
                f"{where} shadow: captures {shadow.captures} overlaps {what} ({location}): prune and "
                "purge delete trace files there",
                fix="point captures at a folder or prefix of its own, where only the replicas' trace "
                "files are written",
            )
    return shadow


def _local(location: str) -> bool:
    return "://" not in location


def _archive_of(store: str) -> str:
    """Where the store's archive is (``pipelines/storage``: ``.mlreg-archive`` beside it)."""
    from pipelines.storage.objects import ARCHIVE  # lazy: the storage package, for one name

    if _local(store):
        root = Path(store)
        return str(root.parent / ARCHIVE / root.name)
    head, _, name = store.rstrip("/").rpartition("/")
    return f"{head}/{ARCHIVE}/{name}"


def _overlap(one: str, other: str) -> bool:
    """Whether one location is, holds or lies inside the other (folders, or s3:// prefixes of one
    bucket: the endpoint's spelling aside)."""
    if _local(one) != _local(other):
        return False
    if _local(one):
        a, b = Path(one).resolve(), Path(other).resolve()
        return a == b or a in b.parents or b in a.parents
    from pipelines.storage import parse_s3_uri  # lazy: the storage package, s3:// only

    try:
        x, y = parse_s3_uri(one), parse_s3_uri(other)
    except MlregError:
        return False
    p, q = f"{x.prefix}/" if x.prefix else "", f"{y.prefix}/" if y.prefix else ""
    return x.bucket == y.bucket and (p.startswith(q) or q.startswith(p))


# -- switching capture on and off on the replicas ------------------------------------------------


def arm(
    targets: Sequence[str],
    connect: Callable[[str], Any],
    models: Iterable[str],
    shadow: Shadow,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Capture ``models`` (those the environment lets) on every target; what could not, as notes
    (a replica that cannot capture never fails a promotion: the next replay has less to read).
    ``progress`` is told each replica before it is reached (after-record steps name it)."""
    notes = []
    wanted = [m for m in models if shadow.captures_model(m)]
    for url in targets if wanted else ():
        if progress is not None:
            progress(url)
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
    """The trace files mlreg armed under a folder or an ``s3://bucket/prefix``: named
    ``<name>.json.<n>`` (``TRACE_NAME``), directly under it or one replica folder below."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._s3: ObjectStore | None = None
        if location.startswith("s3://"):
            from pipelines.storage import open_objects  # lazy: store package ~0.15 s, s3:// only

            self._s3 = open_objects(location, patience=S3_PATIENCE)  # a frozen prefix: bounded

    def files(self) -> list[TraceFile]:
        """Every trace file, oldest first (then by name: ``trace.json.9`` before ``trace.json.10``);
        a StorageError when the location cannot be listed."""
        found: list[TraceFile] = []
        if self._s3 is not None:
            found = [TraceFile(name, size, mtime) for name, size, mtime in self._s3.listing()]
        else:
            found = self._local_files()
        return sorted((f for f in found if is_trace_name(f.name)), key=lambda f: (f.mtime, _order(f.name)))

    def _local_files(self) -> list[TraceFile]:
        root = Path(self.location)
        if not root.is_dir():
            raise StorageError(
                f"the captures folder {root} does not exist (or is not a folder)",
                fix="point captures at the folder the replicas' --trace-config file= writes to",
            )
        try:
            return _scan(root, "", depth=2)
        except OSError as exc:
            raise StorageError(f"the captures folder {root} cannot be listed: {exc}") from exc

    def read(self, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
        """The file's bytes, at most ``limit`` + 1 (more: over its bound); OSError when it is gone
        (rotated or pruned since it was listed) or is no longer a regular file: a local name is
        opened without following a link or blocking on a FIFO, and judged by what was opened."""
        if self._s3 is not None:
            data = self._s3.read(name)
            if data is None:
                raise FileNotFoundError(f"{self.location}: '{name}' is gone")
            return data
        return read_regular(Path(self.location) / name, limit)

    def delete(self, names: Sequence[str]) -> None:
        """Delete the trace files ``names`` (any other name is left: never anything else)."""
        names = [n for n in names if is_trace_name(n)]
        if self._s3 is not None:
            self._s3.delete_keys(names)
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


def _scan(folder: Path, prefix: str, depth: int) -> list[TraceFile]:
    """The trace files in ``folder`` and, ``depth`` allowing, its sub-folders (no symlink followed);
    one ``scandir`` per folder, a stat only for a trace file's name."""
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            name = f"{prefix}{entry.name}"
            if entry.is_symlink():
                continue
            if entry.is_file(follow_symlinks=False) and TRACE_NAME.fullmatch(entry.name):
                stat = entry.stat(follow_symlinks=False)
                found.append(TraceFile(name, stat.st_size, stat.st_mtime))
            elif depth > 1 and entry.is_dir(follow_symlinks=False):
                found.extend(_scan(Path(entry.path), f"{name}/", depth - 1))
    return found


def read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of the regular file ``path``: opened with ``O_NOFOLLOW |
    O_NONBLOCK`` (a symlink or a FIFO swapped in after the listing is refused, never followed nor
    waited on) and checked with ``fstat`` on the descriptor read; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_trace_name(name: str) -> bool:
    """``x.json.<n>`` (what ``--trace-config triton,file=x.json`` writes with log_frequency 1),
    directly under the location or in one replica folder below it."""
    parts = name.split("/")
    if len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
        return False
    return TRACE_NAME.fullmatch(parts[-1]) is not None


def _order(name: str) -> tuple[str, int]:
    stem, _, index = name.rpartition(".")
    return (stem, int(index)) if index.isdigit() else (name, -1)


# -- reading what Triton wrote ---------------------------------------------------------------------


def read_captures(
    location: str | Sequence[str],
    model: str,
    version: str,
    limit: int,
    deadline_s: float = READ_DEADLINE_S,
    own: str = "",
) -> Reading:
    """Up to ``limit`` honest captured requests of ``model`` ``version`` under ``location`` (one or
    several folders or prefixes) with *distinct* inputs, sampled across its files -- replica by
    replica in turn, each replica's files in an order no client can predict -- and returned in
    capture order.  Each distinct input is judged once (one client repeating a request cannot
    fill the sample: ``Reading.captured`` counts them all); request ids starting with ``own``
    (this promotion's secret nonce) are mlreg's own, left out.  A file that does not name the
    model is not parsed; a forged one is counted (``traces.py``).  A StorageError when a location
    cannot be listed, or the reading outlives ``deadline_s``."""
    reading = Reading()
    locations = [location] if isinstance(location, str) else list(location)
    began = time.monotonic()
    named = json.dumps(model).encode()  # the name, quoted: a file without it holds none of its traces
    listed = [(captures, f) for captures in map(Captures, filter(None, locations)) for f in captures.files()]
    seen: set[tuple[tuple[str, str, tuple[int, ...], bytes], ...]] = set()
    for captures, file in _sampled(listed):
        if len(reading.requests) >= limit:
            break
        if time.monotonic() - began > deadline_s:
            raise StorageError(
                f"reading the captures under {', '.join(locations)} took over {deadline_s:g} s "
                f"({reading.files} of {len(listed)} files read): the location is slow or unreachable",
                fix="check the captures location (or promote with --skip-shadow, said in the report)",
            )
        found = _read_file(captures, file, named, reading)
        if found is None or found.model != model or found.version != version:
            continue
        if own and found.request_id.startswith(own):
            reading.own += 1
            continue
        reading.captured += 1
        key = input_key(found)
        if key not in seen:
            seen.add(key)
            reading.requests.append(found)
    reading.requests.sort(key=lambda r: (r.when, _order(r.source.partition("#")[0])))
    return reading


def input_key(request: Captured) -> tuple[tuple[str, str, tuple[int, ...], bytes], ...]:
    """What identifies a request's inputs, exactly (no digest to collide): each tensor's name,
    type, shape and bytes (the captures kept hold them anyway)."""
    return tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(request.inputs.items()))


def _sampled(listed: list[tuple[Captures, TraceFile]]) -> list[tuple[Captures, TraceFile]]:
    """The files replica by replica in turn (a replica: a location and a trace file's stem), each
    replica's in a random order (seeded from the system's entropy each read: no client can aim at
    the sample, and no file read costs a system call for its place)."""
    rng = random.Random(secrets.randbits(128))
    groups: dict[tuple[str, str], list[tuple[Captures, TraceFile]]] = {}
    for captures, file in listed:
        groups.setdefault((captures.location, _order(file.name)[0]), []).append((captures, file))
    queues = list(groups.values())
    rng.shuffle(queues)
    for queue in queues:
        rng.shuffle(queue)
    order: list[tuple[Captures, TraceFile]] = []
    for turn in range(max((len(q) for q in queues), default=0)):
        order.extend(q[turn] for q in queues if turn < len(q))
    return order


def _read_file(captures: Captures, file: TraceFile, named: bytes, reading: Reading) -> Captured | None:
    if file.size > MAX_FILE_BYTES:
        reading.skip(f"trace file over {MAX_FILE_BYTES >> 20} MiB: not read")
        return None
    try:
        data = captures.read(file.name)
    except (OSError, MlregError):
        reading.skip(NOT_JSON)
        return None
    if len(data) > MAX_FILE_BYTES:  # grown or swapped since it was listed
        reading.skip(f"trace file over {MAX_FILE_BYTES >> 20} MiB: not read")
        return None
    if named not in data:
        return None
    records = load_records(data, reading)
    if records is None:
        return None
    reading.files += 1
    found = parse_trace(records, file.name, reading)
    if found is not None:
        found.when = file.mtime
    return found


def parse_traces(records: list[Any], source: str, reading: Reading) -> list[Captured]:
    """The records of one trace file (Triton's list) as its request: none when it is forged, holds
    a tensor that cannot be replayed, or no whole request (each counted in ``reading``)."""
    found = parse_trace(records, source, reading)
    return [found] if found is not None else []


@dataclass
class Purged:
    deleted: list[str]  # location/name of each file deleted
    unreached: list[str]  # the locations (and why) that could not be listed or emptied


def purge(locations: str | Sequence[str]) -> Purged:
    """Delete every trace file mlreg armed under ``locations``; what went and what was not reached."""
    purged = Purged([], [])
    for location in [locations] if isinstance(locations, str) else locations:
        try:
            captures = Captures(location)
            names = [f.name for f in captures.files()]
            captures.delete(names)
        except (OSError, MlregError) as exc:
            purged.unreached.append(f"{location}: {getattr(exc, 'message', exc)}")
            continue
        purged.deleted.extend(f"{location.rstrip('/')}/{name}" for name in names)
    return purged


def prune_all(shadow: Shadow) -> list[str]:
    """Each captures location pruned to its bounds; notes for those that could not be."""
    notes = []
    for location in shadow.locations():
        try:
            Captures(location).prune(shadow)
        except (OSError, MlregError) as exc:
            notes.append(
                f"captured files under {location} could not be pruned: {getattr(exc, 'message', exc)}"
            )
    return notes
