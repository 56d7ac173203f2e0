"""The runtime gate: what each replica runs, judged before any load (issue 49 item 4).

Three questions, each answered with one ``CheckRecord`` per finding:

1. **Known-bad releases.** Each replica's server version and extensions are read through gRPC
   ServerMetadata (``read_replica``); the environment says what Triton's metadata cannot: where its
   repository lives (``store``: an ``s3://`` URI is ``s3``, anything else ``local``) and which
   frontends its replicas enable (``[environments.X.runtime] frontends``, default gRPC + HTTP: Triton
   reports no frontend, so this is the operator's word, not a measurement -- the record says so).
   Every row of ``runtime_tables.HAZARDS`` that matches is a failing record naming the hazard, its
   sources, the release that fixes it and the upgrade.
2. **ONNX a replica cannot load.** An ONNX model's IR version and opsets (default domain and
   ``ai.onnx.ml``), read from the file's protobuf without its weights, against the ONNX Runtime
   that replica's release ships (``runtime_tables.CONTAINERS`` / ``ORT_LIMITS``).
3. **SavedModels.** A replica past 2.55 (container 25.02) has no TensorFlow backend: a SavedModel
   is refused there; elsewhere its ``tensorflow_version`` (saved_model.pb's MetaInfoDef) is
   recorded and left uncompared (the table holds no confirmed backend TF version).

Policy per environment (``RuntimeSettings``, ``[environments.X.runtime]``): ``policy = "refuse"``
refuses a promotion on every failing hazard record whose severity is at least ``refuse_at``
(default ``high``), on a model its replica cannot load (an ONNX opset or IR version past its ONNX
Runtime, a SavedModel with no TensorFlow backend), and on what it cannot judge (``inconclusive``: a
version string it cannot read, a release whose ONNX Runtime the tables do not hold -- never a
pass); below ``refuse_at``, for a hazard id listed in ``accept``, or with ``policy = "note"`` the
record is kept with ``enforced = False`` ("observed: would have refused").  The default is
``note``: the only tritonserver a development machine has (the nvidia-pytriton wheel's 2.51, whose
onnxruntime backend here is a stand-in running the venv's onnxruntime) carries thirteen of the
table's hazards on any store and frontend, so a refusing default would refuse every local and test
promotion; a production environment sets ``policy = "refuse"`` (infra/README.md).

In the promotion (``CHECK``, registered in pipelines/promote/registered.py through issue 47's
seam, phase "preflight"): the engine's preflight stage (pipelines/promote/preflight.py) runs it once
per promotion, after ``convert`` (a SavedModel served as ONNX is judged as the ONNX it became) and
before the upload and any load (a dry run's scratch server's too): every target's release, once per
distinct release, and every model file of the plan's steps against it; a refusal changes nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pipelines.checks.runtime_tables import (
    CONTAINERS,
    FRONTENDS,
    HAZARDS,
    ORT_LIMITS,
    SEVERITIES,
    TF_BACKEND_LAST,
    Hazard,
    OrtLimits,
    Release,
    first_container_from,
    release_text,
)
from pipelines.core.check import Phase, Place, Trial, Verdict
from registry.errors import PromotionError, UsageError

NAME = "runtime"
RESULTS = ("pass", "fail", "inconclusive", "skipped")
POLICIES = ("note", "refuse")  # the first is the default
DEFAULT_FRONTENDS = frozenset({"grpc", "http"})
SETTINGS_KEYS = frozenset({"policy", "refuse_at", "frontends", "accept"})
VERSION_RE = re.compile(r"(\d{1,3})\.(\d{1,4})\.(\d{1,4})(?:dev)?")
MAX_VERSION_CHARS = 64  # ServerMetadata is the replica's word: bounded before it is read
MAX_FIELDS = 100_000  # protobuf fields read per message of an untrusted model file
ML_DOMAIN = "ai.onnx.ml"
UNKNOWN_STORE = "unknown"  # the environment's store was not given: every store's rows apply


# -- the record --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckRecord:
    """One finding of one check, in the shape every check of the verdicts issue returns: what was
    measured from which source, the threshold, the result and, for a failure, the fix."""

    name: str  # the check ("runtime")
    subject: str  # what was judged: "hazard s3-sigpipe", "model m/3 opset"
    replica: str  # the replica's gRPC address ("" for the environment as a whole)
    measured: str  # the value read, e.g. "Triton 2.51.0"
    source: str  # where it was read: "gRPC ServerMetadata", "model.onnx opset_import"
    threshold: str  # e.g. "fixed in 2.70.0 (container 26.06)"
    result: str  # pass | fail | inconclusive | skipped
    line: str  # one sentence for a person
    fix: str = ""
    enforced: bool = True  # False: recorded, never refuses (observed: would have refused)

    def refuses(self) -> bool:
        return self.enforced and self.result in ("fail", "inconclusive")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _record(subject: str, replica: str, **values: Any) -> CheckRecord:
    return CheckRecord(name=NAME, subject=subject, replica=replica, **values)


# -- the environment's settings ------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeSettings:
    """``[environments.X.runtime]``: what refuses, and what the replicas enable."""

    policy: str = POLICIES[0]
    refuse_at: str = "high"
    store: str = UNKNOWN_STORE  # the environment's store kind, filled in where it is parsed (CHECK)
    frontends: frozenset[str] = DEFAULT_FRONTENDS
    accept: frozenset[str] = frozenset()  # hazard ids this environment knowingly runs with

    def enforces(self, hazard: Hazard) -> bool:
        return (
            self.policy == "refuse"
            and hazard.id not in self.accept
            and SEVERITIES.index(hazard.severity) >= SEVERITIES.index(self.refuse_at)
        )


def _one_of(value: object, allowed: Sequence[str], key: str, where: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise UsageError(
            f"{where}: runtime.{key} = {value!r} is not one of {', '.join(allowed)}",
            fix=f"set runtime.{key} to one of: {', '.join(allowed)}",
        )
    return value


def _names(value: object, allowed: Iterable[str], key: str, where: str) -> frozenset[str]:
    known = tuple(allowed)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: runtime.{key} must be a list of strings", fix=f'runtime.{key} = ["..."]')
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise UsageError(
            f"{where}: runtime.{key} names {', '.join(unknown)}, not one of {', '.join(known)}",
            fix=f"use only: {', '.join(known)}",
        )
    return frozenset(value)


def parse_runtime(table: Mapping[str, object], where: str) -> RuntimeSettings:
    """The ``runtime`` table of an environment (``where``: for the error, e.g. "mlreg.toml
    [environments.production.runtime]"); an unknown key or value is refused, naming it."""
    if not isinstance(table, Mapping):
        raise UsageError(
            f"{where}: runtime must be a table", fix='[environments.<name>.runtime] policy = "refuse"'
        )
    unknown = sorted(set(table) - SETTINGS_KEYS)
    if unknown:
        raise UsageError(
            f"{where}: unknown runtime key(s) {', '.join(unknown)}",
            fix=f"the runtime table takes: {', '.join(sorted(SETTINGS_KEYS))}",
        )
    defaults = RuntimeSettings()
    return RuntimeSettings(
        policy=_one_of(table.get("policy", defaults.policy), POLICIES, "policy", where),
        refuse_at=_one_of(table.get("refuse_at", defaults.refuse_at), SEVERITIES, "refuse_at", where),
        frontends=_names(table.get("frontends", sorted(defaults.frontends)), FRONTENDS, "frontends", where),
        accept=_names(table.get("accept", []), (h.id for h in HAZARDS), "accept", where),
    )


def store_kind(store: str) -> str:
    """Where Triton reads the repository: ``s3`` for an ``s3://`` URI, else ``local``."""
    return "s3" if store.strip().lower().startswith("s3://") else "local"


# -- what a replica runs --------------------------------------------------------------------------


class MetadataSource(Protocol):
    """A replica as this check reads it (``TritonControl``, a stand-in in the unit tests)."""

    url: str

    def server_metadata(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ReplicaRuntime:
    url: str
    version_text: str
    version: Release | None  # None: not a version this gate can read
    extensions: tuple[str, ...] = ()


def parse_version(text: object) -> Release | None:
    """``"2.51.0"`` -> ``(2, 51, 0)``; anything else (bounded first) -> None."""
    if not isinstance(text, str) or len(text) > MAX_VERSION_CHARS:
        return None
    match = VERSION_RE.fullmatch(text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def read_replica(target: MetadataSource) -> ReplicaRuntime:
    """The replica's server version and extensions, from its gRPC ServerMetadata."""
    meta = target.server_metadata()
    raw = meta.get("version", "")
    text = raw[:MAX_VERSION_CHARS] if isinstance(raw, str) else repr(raw)[:MAX_VERSION_CHARS]
    extensions = meta.get("extensions") or []
    kept = tuple(str(e)[:64] for e in list(extensions)[:64]) if isinstance(extensions, list) else ()
    return ReplicaRuntime(target.url, text, parse_version(raw), kept)


def _upgrade(fixed_in: Release) -> str:
    container = first_container_from(fixed_in)
    where = f" (container {container}, nvcr.io/nvidia/tritonserver:{container}-py3)" if container else ""
    return f"upgrade the replicas to Triton >= {'.'.join(map(str, fixed_in))}{where}"


def _unknown_release(replica: ReplicaRuntime, subject: str, settings: RuntimeSettings) -> CheckRecord:
    known = f"{min(v for v, _ in CONTAINERS.values())}..{max(v for v, _ in CONTAINERS.values())}"
    return _record(
        subject,
        replica.url,
        measured=f"Triton {replica.version_text!r}",
        source="gRPC ServerMetadata",
        threshold=f"a release the tables know ({known})",
        result="inconclusive",
        line=f"replica {replica.url} reports version {replica.version_text!r}: not a release the tables know",
        fix="run a release the tables know, or add its row (with its source) to runtime_tables.py",
        enforced=settings.policy == "refuse",
    )


# -- 1. hazards ------------------------------------------------------------------------------------


def hazard_records(replica: ReplicaRuntime, store: str, settings: RuntimeSettings) -> list[CheckRecord]:
    """One failing record per hazard that matches the replica, or one passing record."""
    if replica.version is None:
        return [_unknown_release(replica, "hazards", settings)]
    version = replica.version
    frontends = settings.frontends
    where = f"store {store}, frontends {', '.join(sorted(frontends))} (the environment's setting)"
    found = [h for h in HAZARDS if h.affects(version, store, frontends)]
    measured = f"Triton {replica.version_text} ({where})"
    records = [
        _record(
            f"hazard {h.id}",
            replica.url,
            measured=measured,
            source="gRPC ServerMetadata + the environment",
            threshold=f"fixed in {release_text(h.fixed_in)}",
            result="fail",
            line=f"replica {replica.url} runs Triton {replica.version_text}: {h.what} [{h.severity}; "
            f"{', '.join(h.sources)}]; fixed in {release_text(h.fixed_in)}",
            fix=_upgrade(h.fixed_in),
            enforced=settings.enforces(h),
        )
        for h in found
    ]
    if records:
        return records
    return [
        _record(
            "hazards",
            replica.url,
            measured=measured,
            source="gRPC ServerMetadata + the environment",
            threshold=f"none of the {len(HAZARDS)} known hazards",
            result="pass",
            line=f"replica {replica.url} (Triton {replica.version_text}) matches no known hazard",
        )
    ]


# -- reading model files (protobuf wire format, weights never read) --------------------------------


class ModelFileError(ValueError):
    """A model file whose protobuf cannot be read (truncated, not protobuf, unsupported)."""


def _varint(stream: BinaryIO) -> int:
    value = 0
    for shift in range(0, 70, 7):
        byte = stream.read(1)
        if not byte:
            raise ModelFileError("truncated varint")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
    raise ModelFileError("varint over 10 bytes")


def _fields(stream: BinaryIO, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, wire type, value) for each field up to offset ``end``: the value of a varint,
    the length of a length-delimited field (the stream then at its first byte: whatever the caller
    does not read is skipped), 0 for fixed-size fields (skipped)."""
    for _ in range(MAX_FIELDS):
        if stream.tell() >= end:
            return
        key = _varint(stream)
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, _varint(stream)
        elif wire == 2:
            length = _varint(stream)
            start = stream.tell()
            if start + length > end:
                raise ModelFileError(f"field {number} runs past its message")
            yield number, wire, length
            stream.seek(start + length)
        elif wire in (1, 5):
            stream.seek(8 if wire == 1 else 4, 1)
        else:
            raise ModelFileError(f"unsupported wire type {wire} (field {number})")
    raise ModelFileError(f"over {MAX_FIELDS} fields in one message")


def _text(stream: BinaryIO, length: int, limit: int = 256) -> str:
    if length > limit:
        raise ModelFileError(f"a {length}-byte string where at most {limit} are expected")
    return stream.read(length).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class OnnxVersions:
    ir: int
    opsets: dict[str, int] = field(default_factory=dict)  # domain ("" default) -> version


def read_onnx_versions(path: Path) -> OnnxVersions:
    """The IR version and opset imports of an ONNX file; its graph (weights included) is skipped
    by seeking past it, so a model of any size costs a few reads."""
    ir, opsets = 0, dict[str, int]()
    with path.open("rb") as stream:
        end = stream.seek(0, 2)
        stream.seek(0)
        for number, wire, value in _fields(stream, end):
            if number == 1 and wire == 0:
                ir = value
            elif number == 8 and wire == 2:
                domain, version = _opset_import(stream, stream.tell() + value)
                opsets[domain] = max(version, opsets.get(domain, 0))
    if not ir:
        raise ModelFileError("no ir_version: not an ONNX ModelProto")
    return OnnxVersions(ir, opsets)


def _opset_import(stream: BinaryIO, end: int) -> tuple[str, int]:
    domain, version = "", 0
    for number, wire, value in _fields(stream, end):
        if number == 1 and wire == 2:
            domain = _text(stream, value)
        elif number == 2 and wire == 0:
            version = value
    return ("" if domain == "ai.onnx" else domain), version


def read_tf_versions(path: Path) -> list[str]:
    """Each meta graph's ``tensorflow_version`` in saved_model.pb (SavedModel.meta_graphs = 2,
    MetaGraphDef.meta_info_def = 1, MetaInfoDef.tensorflow_version = 5: tensorflow's
    saved_model.proto / meta_graph.proto), without TensorFlow."""
    pb = path / "saved_model.pb" if path.is_dir() else path
    found: list[str] = []
    with pb.open("rb") as stream:
        end = stream.seek(0, 2)
        stream.seek(0)
        for number, wire, value in _fields(stream, end):
            if number == 2 and wire == 2:
                found.append(_meta_graph_tf_version(stream, stream.tell() + value))
    return found


def _meta_graph_tf_version(stream: BinaryIO, end: int) -> str:
    for number, wire, value in _fields(stream, end):
        if number == 1 and wire == 2:
            info_end = stream.tell() + value
            for inner, inner_wire, inner_value in _fields(stream, info_end):
                if inner == 5 and inner_wire == 2:
                    return _text(stream, inner_value, 64)
            return ""
    return ""


# -- 2. ONNX against the replica's ONNX Runtime ------------------------------------------------


def ort_of(version: Release) -> tuple[str, str] | None:
    """(container, ONNX Runtime version) of a Triton release, when the tables hold it."""
    return next(((c, ort) for c, (v, ort) in CONTAINERS.items() if v == version), None)


def ort_limits(ort: str) -> OrtLimits | None:
    """What ONNX Runtime ``ort`` ("1.19.2") loads, when the tables hold its minor release."""
    major, minor = (int(p) for p in ort.split(".")[:2])
    return ORT_LIMITS.get((major, minor))


def _onnx_excess(found: OnnxVersions, ir: int, opset: int, ml_opset: int) -> list[str]:
    over = []
    if found.ir > ir:
        over.append(f"IR version {found.ir} > {ir}")
    if found.opsets.get("", 0) > opset:
        over.append(f"opset {found.opsets['']} > {opset}")
    if found.opsets.get(ML_DOMAIN, 0) > ml_opset:
        over.append(f"{ML_DOMAIN} opset {found.opsets[ML_DOMAIN]} > {ml_opset}")
    return over


def onnx_record(replica: ReplicaRuntime, model: str, path: Path, settings: RuntimeSettings) -> CheckRecord:
    """The ONNX file at ``path`` against the ONNX Runtime of the replica's release."""
    subject = f"model {model} ONNX"
    if replica.version is None:
        return _unknown_release(replica, subject, settings)
    try:
        found = read_onnx_versions(path)
    except (OSError, ModelFileError) as exc:
        return _record(
            subject,
            replica.url,
            measured=str(path),
            source="the model file",
            threshold="a readable ONNX model",
            result="fail",
            line=f"{path}: not a readable ONNX model ({exc})",
            fix="re-export the model and check the file is complete",
            enforced=settings.policy == "refuse",
        )
    measured = f"IR {found.ir}, opsets " + ", ".join(
        f"{d or 'ai.onnx'} {v}" for d, v in sorted(found.opsets.items())
    )
    shipped = ort_of(replica.version)
    limits = ort_limits(shipped[1]) if shipped else None
    if shipped is None or limits is None:
        return _record(
            subject,
            replica.url,
            measured=measured,
            source=f"{path.name} (read without weights)",
            threshold=f"the ONNX Runtime of Triton {replica.version_text}: not in the tables",
            result="inconclusive",
            line=f"the ONNX Runtime of Triton {replica.version_text} is not in the tables: {model} unjudged",
            fix="add the release's ONNX Runtime row (pipelines/checks/runtime_tables.py) with its source",
            enforced=settings.policy == "refuse",
        )
    container, ort = shipped
    where = f"ONNX Runtime {ort} of Triton {replica.version_text} (container {container})"
    threshold = (
        f"IR <= {limits.ir}, opset <= {limits.opset}, {ML_DOMAIN} <= {limits.ml_opset} ({limits.source})"
    )
    over = _onnx_excess(found, limits.ir, limits.opset, limits.ml_opset)
    if not over:
        line = f"{model} ({measured}) loads on {where}"
        return _record(
            subject,
            replica.url,
            measured=measured,
            source=path.name,
            threshold=threshold,
            result="pass",
            line=line,
        )
    return _record(
        subject,
        replica.url,
        measured=measured,
        source=f"{path.name} (read without weights)",
        threshold=threshold,
        result="fail",
        line=f"{model}: model {'; '.join(over)}: {where} supports up to {threshold.split(' (')[0]}",
        fix=f"re-export {model} at opset <= {limits.opset}, IR <= {limits.ir}; or {_upgrade_for_onnx(found)}",
        enforced=settings.policy == "refuse",
    )


def _upgrade_for_onnx(found: OnnxVersions) -> str:
    """The first container whose ONNX Runtime loads ``found``, as an upgrade."""
    for container, (version, ort) in CONTAINERS.items():
        limits = ort_limits(ort)
        if limits and not _onnx_excess(found, limits.ir, limits.opset, limits.ml_opset):
            release = ".".join(map(str, version))
            return f"upgrade the replicas to Triton >= {release} (container {container}, ONNX Runtime {ort})"
    return "no release in the tables loads it: re-export it"


# -- 3. SavedModels against the TensorFlow backend ---------------------------------------------


def saved_model_record(
    replica: ReplicaRuntime, model: str, path: Path, settings: RuntimeSettings
) -> CheckRecord:
    subject = f"model {model} SavedModel"
    if replica.version is None:
        return _unknown_release(replica, subject, settings)
    try:
        versions = sorted({v for v in read_tf_versions(path) if v})
    except (OSError, ModelFileError) as exc:
        versions, unreadable = [], str(exc)
    else:
        unreadable = ""
    measured = (
        f"TensorFlow {', '.join(versions) or '(not recorded)'}"
        if not unreadable
        else f"unreadable ({unreadable})"
    )
    common = {"measured": measured, "source": "saved_model.pb MetaInfoDef.tensorflow_version"}
    if replica.version > TF_BACKEND_LAST:
        return _record(
            subject,
            replica.url,
            **common,
            threshold=f"a TensorFlow backend (last in {release_text(TF_BACKEND_LAST)})",
            result="fail",
            line=f"{model} is a SavedModel ({measured}); Triton {replica.version_text} has no TensorFlow "
            f"backend (the last is in {release_text(TF_BACKEND_LAST)})",
            fix="promote it with --serve-as onnx (or auto): mlreg converts it to ONNX and checks the answers",
            enforced=settings.policy == "refuse",
        )
    return _record(
        subject,
        replica.url,
        **common,
        threshold="the TensorFlow backend's version: not in the tables",
        result="skipped",
        line=f"{model} ({measured}) on Triton {replica.version_text}: the TensorFlow version of its "
        "backend is not in the tables, so it is recorded, not compared",
        enforced=False,
    )


# -- the gate -------------------------------------------------------------------------------------


def refusal(records: Iterable[CheckRecord]) -> CheckRecord | None:
    """The first record that refuses the promotion (its line is the promotion's reason)."""
    return next((r for r in records if r.refuses()), None)


def enforce(records: Sequence[CheckRecord]) -> None:
    """Raise for the first refusing record; nothing has been loaded when this runs."""
    first = refusal(records)
    if first is not None:
        others = sum(1 for r in records if r.refuses()) - 1
        more = f" (and {others} more runtime finding(s))" if others else ""
        raise PromotionError(
            f"runtime gate: {first.line}{more}", fix=first.fix, records=[r.to_dict() for r in records]
        )


# -- one pass over an environment -------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFile:
    """A model the promotion would load: ``kind`` "onnx" (a model.onnx file) or "savedmodel" (a
    SavedModel folder); other kinds (python, ensembles) carry no runtime version to judge."""

    name: str
    kind: str
    path: Path


class PlannedStep(Protocol):
    """A promotion step as this check reads it (``pipelines.core.plan.Step``)."""

    model: str
    version: str
    folder: Path | None
    config_text: str


MODEL_KINDS = {
    "onnxruntime_onnx": ("onnx", "model.onnx"),
    "tensorflow_savedmodel": ("savedmodel", "model.savedmodel"),
}


def model_files(steps: Iterable[PlannedStep]) -> list[ModelFile]:
    """The ONNX files and SavedModels a promotion's steps would load (their config's platform, or
    backend, and ``default_model_filename``); a re-pointed ensemble or a python model has none."""
    from registry.contracts.config import parse_config  # lazy: the config parser (protobuf), ~20 ms

    found: list[ModelFile] = []
    for step in steps:
        if step.folder is None:
            continue
        config = parse_config(step.config_text)
        platform = config.platform or {"onnxruntime": "onnxruntime_onnx"}.get(config.backend, "")
        if platform not in MODEL_KINDS:
            continue
        kind, default = MODEL_KINDS[platform]
        path = step.folder / step.version / (config.default_model_filename or default)
        found.append(ModelFile(f"{step.model}/{step.version}", kind, path))
    return found


def judge(
    targets: Sequence[MetadataSource], store: str, settings: RuntimeSettings, models: Sequence[ModelFile] = ()
) -> list[CheckRecord]:
    """Every record of the runtime gate for an environment: each replica's metadata read once
    (an unreachable replica's error propagates: the caller names it), its hazards, then each model
    against it.  Nothing is loaded."""
    kind = store_kind(store)
    records: list[CheckRecord] = []
    for target in targets:
        replica = read_replica(target)
        records += hazard_records(replica, kind, settings)
        for model in models:
            if model.kind == "onnx":
                records.append(onnx_record(replica, model.name, model.path, settings))
            elif model.kind == "savedmodel":
                records.append(saved_model_record(replica, model.name, model.path, settings))
    return records


# -- the promotion's check (issue 47's seam: pipelines/core/check.py) ---------------------------------


def to_verdict(record: CheckRecord, window: str = "") -> Verdict:
    """A record in the seam's shape: a noted failure is an observed one ("would have refused")."""
    would_refuse = record.result in ("fail", "inconclusive")
    return Verdict(
        NAME,
        record.result,  # type: ignore[arg-type]  # one of RESULTS, as the seam's Result
        record.subject,
        measured=f"{record.measured}; {record.source}; threshold: {record.threshold}",
        window=window,
        replicas=(record.replica,) if record.replica else (),
        why=record.line,
        fix=record.fix,
        observed=would_refuse and not record.enforced,
        findings=(record.line,) if would_refuse else (),
    )


def _hazards_judged(report: Any, url: str) -> bool:
    """Whether an earlier candidate's trial already judged this replica's release (once per replica)."""
    return any(
        v.name == NAME and url in v.replicas and v.subject.startswith(("hazard", "hazards"))
        for v in getattr(report, "verdicts", ())
    )


@dataclass(frozen=True)
class RuntimeCheck:
    """The runtime gate as a registered ``Check``: ``[environments.X.runtime]`` parsed here; run
    ONCE per promotion by the preflight (pipelines/promote/preflight.py), before any load: every
    target's release (``trial.targets``; replicas of one release and extensions judged together)
    and each model file of the plan's steps (``trial.steps``) against it.  Given one candidate's
    trial instead (``trial.candidate``, no targets), that one server and the trial's step."""

    name: str = NAME
    phase: Phase = "preflight"
    where: frozenset[str] = frozenset()  # in no gate: the preflight judges every target, once
    owns: frozenset[str] = frozenset({"runtime"})
    aliases: tuple[str, ...] = ()

    def parse(self, place: Place, raw: Mapping[str, Any]) -> RuntimeSettings:
        parsed = parse_runtime(raw.get("runtime", {}), f"{place.where} runtime")
        return dataclasses.replace(parsed, store=store_kind(place.store))

    def judge(self, trial: Trial) -> list[Verdict]:
        if trial.skip:
            return [Verdict(NAME, "skipped", trial.subject, why=f"skipped ({trial.skip})")]
        settings = trial.setting if isinstance(trial.setting, RuntimeSettings) else RuntimeSettings()
        if trial.store:
            settings = dataclasses.replace(settings, store=store_kind(trial.store))
        preflight = trial.where == "preflight"
        targets = trial.targets if preflight else (trial.candidate,)
        releases: dict[tuple[str, tuple[str, ...]], list[ReplicaRuntime]] = {}
        for target in targets:  # each replica's metadata read once; an unreachable one's error propagates
            replica = read_replica(target)
            releases.setdefault((replica.version_text, replica.extensions), []).append(replica)
        window = "before any load (preflight)" if preflight else f"the {trial.where}, before traffic"
        files = model_files(trial.steps if preflight else (trial.step,))
        verdicts: list[Verdict] = []
        for same in releases.values():
            verdicts += _release_verdicts(same, files, settings, trial.report, window)
        return verdicts


def _release_verdicts(
    same: list[ReplicaRuntime], files: list[ModelFile], settings: RuntimeSettings, report: Any, window: str
) -> list[Verdict]:
    """The replicas of one release: its hazards (once per promotion), each model file against it."""
    replica, urls = same[0], tuple(r.url for r in same)
    records = (
        [] if _hazards_judged(report, replica.url) else hazard_records(replica, settings.store, settings)
    )
    verdicts = _hazard_verdicts([r for r in records if r.subject.startswith("hazard ")], window, urls)
    verdicts += [to_verdict(r, window) for r in records if not r.subject.startswith("hazard ")]
    for model in files:
        judge_one = onnx_record if model.kind == "onnx" else saved_model_record
        verdicts.append(to_verdict(judge_one(replica, model.name, model.path, settings), window))
    return [dataclasses.replace(v, replicas=urls, sample=len(urls)) for v in verdicts]  # replicas judged


def _hazard_verdicts(found: list[CheckRecord], window: str, urls: tuple[str, ...] = ()) -> list[Verdict]:
    """A replica's hazards as at most two verdicts (those that refuse, those noted), each naming
    every hazard in ``findings`` and the release past all of them in ``fix``: one line, not fifteen."""
    verdicts = []
    by_id = {h.id: h for h in HAZARDS}
    for enforced in (True, False):
        group = [r for r in found if r.enforced is enforced]
        if not group:
            continue
        fixed = max(by_id[r.subject.removeprefix("hazard ")].fixed_in for r in group)
        first = group[0]
        ids = ", ".join(r.subject.removeprefix("hazard ") for r in group)
        release = first.measured.split(" (")[0]
        who = f"replica {first.replica}" if len(urls) < 2 else f"{len(urls)} replicas ({', '.join(urls[:3])}"
        who += "" if len(urls) < 2 else (", ...)" if len(urls) > 3 else ")")
        summary = f"{who} runs {release}: {len(group)} known hazard(s) ({ids})"
        record = dataclasses.replace(
            first,
            subject="hazards",
            threshold=f"past every known hazard: {release_text(fixed)}",
            line=f"{summary}; the last fixed in {release_text(fixed)}",
            fix=_upgrade(fixed),
        )
        made = to_verdict(record, window)
        verdicts.append(  # the figures: the release's known hazards (value), none allowed (threshold)
            dataclasses.replace(
                made,
                measured=f"known hazards (count) of {made.measured}",
                value=float(len(group)),
                threshold=0.0,
                findings=tuple(r.line for r in group),
            )
        )
    return verdicts


CHECK = RuntimeCheck()
