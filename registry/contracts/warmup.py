"""Triton's ``model_warmup``: the peak-batch sample mlreg adds to stored configs, and Triton's rules
for a declared one, checked offline.

Why a peak-batch warmup: Triton runs a config's warmup samples while it loads a version, before it
reports it READY, and refuses the load when one fails ("failed to run warmup sample"); a candidate
that cannot take ``max_batch_size`` is then refused at load, while the serving version stays READY,
instead of answering HTTP 500 to the first full batch (FACTS.md, 2026-12-05).

What Triton does with a sample (core r24.10, the release of 2.51: ``backend_model_instance.cc``
``GenerateWarmupData`` and ``WarmUp``, ``infer_request.cc`` ``Normalize``; the python and
onnxruntime backends' batch check) -- nothing of it is checked when the config is read, only
while each instance loads:

- ``batch_size: N`` is N requests of batch 1 in one execution; 0 skips the sample, silently; the
  backend refuses more than ``max_batch_size`` (more than 1 without batching);
- an input's ``dims`` exclude the batch dimension and are the config's ``dims`` (a ``reshape`` is
  applied after): every dimension fixed, each equal to the config's where that one is not -1;
- a name that is a model input is checked (data type, shape, every required input present); any
  other name is handed to the backend as an extra "override" input (the sequence batcher's control
  tensors go that way: ``[1]`` each), unchecked;
- ``zero_data``/``random_data`` are used when set, whatever their value; TYPE_STRING gets empty
  strings from either; ``input_data_file`` is read from the model's ``warmup/`` folder (an
  absolute name too: Triton joins it below that folder), its first bytes used.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from registry.contracts.config import model_config_pb2, parse_config
from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.scheduling import CORRID
from registry.errors import SettingsError

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

PEAK_NAME = "mlreg_peak_batch"
WARMUP_FOLDER = "warmup"  # core constants.h kWarmupDataFolder: beside the version folders
PEAK_COMMENT = "# mlreg: a warmup at max_batch_size, zero data shaped as the inputs above (peak_warmup)"
CONTROL_TYPES = {
    "int32_false_true": "TYPE_INT32",
    "fp32_false_true": "TYPE_FP32",
    "bool_false_true": "TYPE_BOOL",
}
BYTE_SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2}
BYTE_SIZES |= {"UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
STRING = "TYPE_STRING"
MIB = 2**20
MB_VARIABLE, REQUESTS_VARIABLE = "MLREG_WARMUP_LIMIT_MB", "MLREG_WARMUP_LIMIT_REQUESTS"
DEFAULT_WARMUP_MB = 1024.0  # the derived peak warmup moves <= 64 MiB (one request at max_batch_size)
DEFAULT_WARMUP_REQUESTS = 4096  # count x batch_size over the samples; a peak warmup sends max_batch_size

# -- the peak-batch warmup ---------------------------------------------------------------------------


def peak_warmup(config_text: str) -> str:
    """``config_text`` with a ``model_warmup`` at ``max_batch_size`` appended, zero data shaped as
    the config's required inputs (and the sequence batcher's control tensors); the text unchanged
    for an ensemble, a config without batching or one that declares a warmup, and where Triton's
    warmup cannot serve the model (shape tensors, implicit state, incomplete inputs).

    Appended as text: the registered config stays byte for byte above it; the block depends only
    on ``max_batch_size`` and the tensors, so two versions with the same tensors get the same bytes.
    A model that cannot take zeros (image_preprocess: zero bytes are no image) fails this warmup:
    its registered config declares one with real data (``input_data_file``) instead.  Measured on
    the local 2.51: a failing sample at batch 256, or with 2 instances, took the whole server down
    (SIGSEGV) rather than refusing the load (benchmarks/warmup.py).
    """
    block = peak_block(parse_config(config_text))
    if not block:
        return config_text
    joint = "" if not config_text or config_text.endswith("\n") else "\n"
    return f"{config_text}{joint}{block}"


def peak_block(config: ModelConfig) -> str:
    """The peak-batch ``model_warmup`` text for ``config`` ("" where none is due)."""
    tensors = _peak_tensors(config)
    if not tensors:
        return ""
    entries = "".join(
        f'    inputs {{\n      key: "{_escaped(name)}"\n'
        f"      value: {{ data_type: {data_type} dims: {_dims_text(dims)} zero_data: true }}\n    }}\n"
        for name, (data_type, dims) in sorted(tensors.items())
    )
    head = f'    name: "{PEAK_NAME}"\n    batch_size: {config.max_batch_size}\n'
    return f"{PEAK_COMMENT}\nmodel_warmup [\n  {{\n{head}{entries}  }}\n]\n"


def _peak_tensors(config: ModelConfig) -> dict[str, tuple[str, list[int]]]:
    """name -> (data type, warmup dims) of every tensor the sample sends; {} where none is due."""
    if _is_ensemble(config) or config.max_batch_size <= 0 or len(config.model_warmup):
        return {}
    required = [t for t in config.input if not t.optional]
    if not required or any(not _derivable(t) for t in required) or _has_state(config):
        return {}
    tensors = {
        t.name: (_type_name(t.data_type), [1 if d == -1 else int(d) for d in t.dims]) for t in required
    }
    controls = _control_types(config)
    if controls is None:
        return {}
    return tensors | {name: (data_type, [1]) for name, data_type in controls.items()}


def _is_ensemble(config: ModelConfig) -> bool:
    return config.platform == "ensemble" or config.HasField("ensemble_scheduling")


def _derivable(tensor: Any) -> bool:
    """A complete input Triton's warmup can feed: a type, valid dims, not a shape tensor (its
    values are shapes: zeros would be none)."""
    dims = list(tensor.dims)
    valid = bool(dims) and all(d >= 1 or d == -1 for d in dims)
    return valid and tensor.data_type != 0 and not tensor.is_shape_tensor


def _has_state(config: ModelConfig) -> bool:
    """Implicit state: Triton's warmup bypasses the scheduler that would feed the state inputs."""
    return config.HasField("sequence_batching") and len(config.sequence_batching.state) > 0


def _control_types(config: ModelConfig) -> dict[str, str] | None:
    """The sequence batcher's control tensors and their data types; None if one is incomplete."""
    if not config.HasField("sequence_batching"):
        return {}
    found: dict[str, str] = {}
    for control_input in config.sequence_batching.control_input:
        data_type = _control_type(control_input.control[0]) if len(control_input.control) else ""
        if not control_input.name or not data_type:
            return None
        found[control_input.name] = data_type
    return found


def _control_type(control: Any) -> str:
    """What the sequence batcher sends for one control: CORRID its data_type, the others the type
    of the ``*_false_true`` pair given."""
    kind = model_config_pb2().ModelSequenceBatching.Control.Kind.Name(control.kind)
    if kind == CORRID:
        return _type_name(control.data_type) if control.data_type else ""
    return next((t for field, t in CONTROL_TYPES.items() if len(getattr(control, field))), "")


def _type_name(data_type: int) -> str:
    return str(model_config_pb2().DataType.Name(data_type))


def _dims_text(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _escaped(name: str) -> str:
    from google.protobuf import text_encoding  # lazy: ~1 ms, protobuf loads with the schema (config.py)

    return str(text_encoding.CEscape(name, as_utf8=True))


# -- Triton's rules for a declared warmup -------------------------------------------------------------


@dataclass(frozen=True)
class WarmupBound:
    """How much work a declared ``model_warmup`` may ask of a load: Triton runs every sample
    ``count`` times (0: once) at ``batch_size`` requests each, inside the load, before READY, with
    no deadline of its own (a ``count: 1000000000`` load never ends and its python stub burns a
    core).  ``megabytes``: the sample data all runs move together (count x batch_size x bytes of
    one request, summed over the samples); ``requests``: the requests they send (count x batch_size).
    Settings: ``MLREG_WARMUP_LIMIT_MB`` and ``MLREG_WARMUP_LIMIT_REQUESTS``."""

    megabytes: float = DEFAULT_WARMUP_MB
    requests: int = DEFAULT_WARMUP_REQUESTS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WarmupBound:
        env = os.environ if env is None else env
        return cls(
            megabytes=_positive(env, MB_VARIABLE, DEFAULT_WARMUP_MB),
            requests=int(_positive(env, REQUESTS_VARIABLE, DEFAULT_WARMUP_REQUESTS)),
        )


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        raise SettingsError(f"{name}={raw!r} is not a positive number", fix=f"set {name} to e.g. {default:g}")
    return value


def check_warmup(
    config: ModelConfig, *, model: str = "", model_dir: Path | None = None, bound: WarmupBound | None = None
) -> list[Finding]:
    """Every ``model_warmup`` sample of ``config`` against Triton's rules (see the module's
    docstring), and all of them together against ``bound`` (None: the settings'); ``model``: its
    name (default ``config.name``); ``model_dir``: its folder, where an ``input_data_file`` is
    looked for (None: files are not looked at).  Ensembles: ensemble.py reports their warmup
    (Triton refuses any)."""
    if _is_ensemble(config):
        return []
    name = model or config.name
    findings: list[Finding] = []
    for index, sample in enumerate(config.model_warmup):
        found = Sample(config, name, sample.name or f"#{index}", sample, model_dir)
        findings.extend(found.findings())
    findings.extend(_over_bound(config, name, model_dir, bound or WarmupBound.from_env()))
    return findings


def _over_bound(config: ModelConfig, model: str, model_dir: Path | None, bound: WarmupBound) -> list[Finding]:
    """One error when the samples together ask more than ``bound`` of a load, naming the largest."""
    copies = instances(config) * versions_loaded(config, model_dir)  # each instance of each version
    work = [
        (
            sample.name or f"#{i}",
            max(int(sample.count), 1),
            int(sample.batch_size),
            _request_bytes(sample, model_dir),
        )
        for i, sample in enumerate(config.model_warmup)
    ]
    total_bytes = copies * sum(runs * batch * size for _, runs, batch, size in work)
    total_requests = copies * sum(runs * batch for _, runs, batch, _ in work)
    limit_bytes = int(bound.megabytes * MIB)
    if total_bytes <= limit_bytes and total_requests <= bound.requests:
        return []
    label, runs, batch, size = max(work, key=lambda w: (w[1] * w[2] * w[3], w[1] * w[2]))
    return [
        error(
            "warmup-bound",
            model,
            f"model_warmup asks {total_requests} requests moving {_size(total_bytes)} of sample data "
            f"while it loads (count x batch_size x bytes per request, over its samples, x {copies} "
            "model instance(s) of every version it loads: Triton warms each instance up), "
            f"over the bound of {bound.requests} requests and {_size(limit_bytes)} "
            f"({REQUESTS_VARIABLE}, {MB_VARIABLE}): Triton runs them all before READY, and the load "
            "does not end before they do",
            f"lower count or batch_size of sample '{label}' (count {runs} x batch_size {batch} x "
            f"{_size(size)} a request), or raise {MB_VARIABLE}/{REQUESTS_VARIABLE} for a model whose "
            "warmup needs it (and load_timeout with it: the load's deadline covers its warmup)",
            origin="mlreg",
            expected=f"<= {bound.requests} requests, <= {_size(limit_bytes)}",
            actual=f"{total_requests} requests, {_size(total_bytes)}",
        )
    ]


def instances(config: ModelConfig) -> int:
    """The model instances Triton makes of one version, each warmed up in turn: over
    ``instance_group``, count (0: 1) x the GPUs it names (none named: 1; the host's GPU count is
    not known here, so a GPU group without ``gpus`` is counted once per count); none: 1."""
    groups = list(config.instance_group)
    if not groups:
        return 1
    return sum(max(int(g.count), 1) * max(len(g.gpus), 1) for g in groups)


def versions_loaded(config: ModelConfig, model_dir: Path | None) -> int:
    """The versions ``version_policy`` loads (each warmed up): specific's count; ``all``: the
    numbered folders in ``model_dir`` (the model's folder) when known; latest's num_versions
    (default 1), at most those folders when known.  Unknown: 1 (validate sees one model folder)."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "specific":
        return max(len(set(policy.specific.versions)), 1)
    found = _version_folders(model_dir)
    if which == "all":
        return max(found or 1, 1)
    wanted = max(int(policy.latest.num_versions), 1) if which == "latest" else 1
    return min(wanted, found) if found else wanted


def _version_folders(model_dir: Path | None) -> int:
    """The numbered folders in ``model_dir`` (0: none, or not known)."""
    if model_dir is None:
        return 0
    try:
        return sum(1 for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir())
    except OSError:
        return 0


def _request_bytes(sample: Any, model_dir: Path | None) -> int:
    """The bytes of one warmup request of ``sample``: each input's elements x its size; an
    ``input_data_file`` of any type: its file's size when the file is there (Triton reads the
    whole file whatever the type), else elements x size."""
    total = 0
    for name in sample.inputs:
        value = sample.inputs[name]
        elements = math.prod(max(int(d), 1) for d in value.dims)
        type_name = _type_name(value.data_type)
        if value.WhichOneof("input_data_type") == "input_data_file" and model_dir:
            try:
                total += (model_dir / WARMUP_FOLDER / value.input_data_file.lstrip("/")).stat().st_size
                continue
            except OSError:
                pass
        total += elements * BYTE_SIZES.get(type_name.removeprefix("TYPE_"), 4)
    return total


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MIB), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


class Sample:
    """One warmup sample of one model, checked as Triton checks it at load."""

    def __init__(self, config: ModelConfig, model: str, label: str, sample: Any, model_dir: Path | None):
        self.config, self.model, self.label, self.sample = config, model, label, sample
        self.model_dir = model_dir
        self.declared = {t.name: t for t in config.input}
        self.controls = {c.name for c in config.sequence_batching.control_input if c.name}
        self.controls |= {s.input_name for s in config.sequence_batching.state if s.input_name}

    def fail(self, rule: str, text: str, fix: str, **where: Any) -> Finding:
        return error(rule, self.model, f"model_warmup '{self.label}': {text}", fix, **where)

    def warn(self, rule: str, text: str, fix: str, **where: Any) -> Finding:
        where.setdefault("origin", "mlreg")
        return warning(rule, self.model, f"model_warmup '{self.label}': {text}", fix, **where)

    def findings(self) -> list[Finding]:
        batch = self.sample.batch_size
        if batch == 0:
            return [
                self.warn(
                    "warmup-batch-size",
                    "batch_size 0: Triton skips the sample ('Skipping batch 0 warmup sample'), "
                    "nothing is warmed",
                    f"set batch_size: {max(self.config.max_batch_size, 1)} (1 to max_batch_size)",
                    actual="0",
                )
            ]
        found = list(self._batch_size(batch))
        for tensor in sorted(self.sample.inputs):
            found.extend(self._input(tensor, self.sample.inputs[tensor]))
        found.extend(self._missing())
        return found

    def _batch_size(self, batch: int) -> Iterator[Finding]:
        limit = max(self.config.max_batch_size, 1)
        if batch > limit:
            yield self.fail(
                "warmup-batch-size",
                f"failed to run warmup sample '{self.label}': batch size {batch} for "
                f"'{self.model}', max allowed is {self.config.max_batch_size}",
                f"set batch_size: {limit} (Triton sends batch_size requests of batch 1 in one "
                "execution; the backend takes at most max_batch_size)",
                expected=f"<= {limit}",
                actual=str(batch),
            )

    def _input(self, tensor: str, value: Any) -> Iterator[Finding]:
        where = {"tensor": tensor}
        if value.WhichOneof("input_data_type") is None:
            yield self.fail(
                "warmup-data",
                f"warmup setting expects input '{tensor}' to have input_data_type set",
                'set one of zero_data: true, random_data: true or input_data_file: "<file in warmup/>"',
                **where,
            )
        if any(d < 0 for d in value.dims):
            yield self.fail(
                "warmup-dims",
                f"warmup setting expects all variable-size dimensions are specified for input '{tensor}'",
                f"give every dimension a size, e.g. dims: {_dims_text(self._suggested(tensor, value))}",
                expected="no -1",
                actual=shape_text(list(value.dims)),
                **where,
            )
            return
        if tensor in self.declared:
            yield from self._declared(tensor, value)
        elif tensor not in self.controls:
            allowed = ", ".join(sorted(self.declared) + sorted(self.controls))
            yield self.fail(
                "warmup-input",
                f"input '{tensor}' is not an input of model '{self.model}' (nor a sequence control "
                "or state tensor): Triton hands it to the backend as an extra input, unchecked",
                f"rename it to one of [{allowed}] or remove it",
                origin="mlreg",
                expected=allowed,
                actual=tensor,
                **where,
            )
        yield from self._data(tensor, value)

    def _suggested(self, tensor: str, value: Any) -> list[int]:
        config_dims = list(self.declared[tensor].dims) if tensor in self.declared else list(value.dims)
        return [1 if d < 0 else int(d) for d in config_dims] or [1]

    def _declared(self, tensor: str, value: Any) -> Iterator[Finding]:
        declared = self.declared[tensor]
        if value.data_type != declared.data_type:
            has, want = _protocol(value.data_type), _protocol(declared.data_type)
            yield self.fail(
                "warmup-data-type",
                f"inference input '{tensor}' data-type is '{has}', but model '{self.model}' expects '{want}'",
                f"set data_type: {_type_name(declared.data_type)} in the warmup input",
                tensor=tensor,
                expected=_type_name(declared.data_type),
                actual=_type_name(value.data_type),
            )
        sent, compared = self._shapes(declared, list(value.dims))
        config_dims = list(declared.dims)
        if len(compared) != len(config_dims) or any(
            c != -1 and c != w for c, w in zip(config_dims, compared, strict=False)
        ):
            expected = ([-1] if self.config.max_batch_size > 0 else []) + config_dims
            yield self.fail(
                "warmup-shape",
                f"unexpected shape for input '{tensor}' for model '{self.model}'. Expected "
                f"{shape_text(expected)}, got {shape_text(sent)}",
                f"set dims: {_dims_text(self._suggested(tensor, value))} (the input's dims, without "
                "the batch dimension, before any reshape; each -1 given a size)",
                tensor=tensor,
                expected=shape_text(config_dims),
                actual=shape_text(list(value.dims)),
            )

    def _shapes(self, declared: Any, dims: list[int]) -> tuple[list[int], list[int]]:
        """The shape the warmup request carries (batch 1 prepended when the model batches) and
        the part Triton compares with the config's dims (all of it for a shape tensor)."""
        if self.config.max_batch_size <= 0:
            return dims, dims
        sent = [1, *dims]
        return sent, sent if declared.is_shape_tensor else dims

    def _missing(self) -> Iterator[Finding]:
        required = [t.name for t in self.config.input if not t.optional]
        given = [n for n in sorted(self.sample.inputs) if n in self.declared]
        missing = [n for n in required if n not in self.sample.inputs]
        if not missing:
            return
        total, least = len(self.config.input), len(required)
        expected = f"{total}" if total == least else f"number of inputs between {least} and {total}"
        text = (
            f"expected {expected} inputs but got {len(given)} inputs for model '{self.model}'. Got "
            f"input(s) {_quoted(given)}, but missing required input(s) {_quoted(missing)}. Please "
            "provide all required input(s)."
        )
        for tensor in missing:
            declared = self.declared[tensor]
            dims = _dims_text([1 if d < 0 else int(d) for d in declared.dims])
            yield self.fail(
                "warmup-missing-input",
                text,
                f'add inputs {{ key: "{tensor}" value: {{ data_type: {_type_name(declared.data_type)} '
                f"dims: {dims} zero_data: true }} }}",
                tensor=tensor,
                expected=tensor,
                actual=", ".join(given) or "none",
            )

    def _data(self, tensor: str, value: Any) -> Iterator[Finding]:
        case = value.WhichOneof("input_data_type")
        if case in ("zero_data", "random_data") and not getattr(value, case):
            yield self.warn(
                "warmup-data",
                f"{case}: false still selects {case.removesuffix('_data')} data: Triton reads which "
                "field is set, not its value",
                f"write {case}: true, or choose the other kind of data",
                tensor=tensor,
                actual=f"{case}: false",
            )
        if case == "random_data" and _type_name(value.data_type) == STRING:
            yield self.warn(
                "warmup-data",
                "random_data for a TYPE_STRING input sends empty strings (Triton falls back to zero data)",
                'write zero_data: true, or give real strings with input_data_file: "<file in warmup/>"',
                tensor=tensor,
            )
        if case == "input_data_file":
            yield from self._file(tensor, value)

    def _file(self, tensor: str, value: Any) -> Iterator[Finding]:
        name = value.input_data_file
        if ".." in PurePosixPath(name).parts:
            yield self.fail(
                "warmup-file",
                f"input_data_file '{name}' leaves the model's {WARMUP_FOLDER}/ folder",
                f"put the file in the model's {WARMUP_FOLDER}/ folder and give its name there",
                origin="mlreg",
                tensor=tensor,
                actual=name,
            )
            return
        if self.model_dir is None:
            return
        path = self.model_dir / WARMUP_FOLDER / name.lstrip("/")  # Triton's JoinPath keeps it below
        try:
            data = path.read_bytes()
        except OSError as exc:
            yield self.fail(
                "warmup-file",
                f"failed to open text file for read {path}: {exc.strerror or exc}",
                f"put the raw input (row-major bytes) at {path}, or use zero_data: true",
                tensor=tensor,
                file=str(path),
            )
            return
        yield from self._file_size(tensor, value, data, path)

    def _file_size(self, tensor: str, value: Any, data: bytes, path: Path) -> Iterator[Finding]:
        count = math.prod(int(d) for d in value.dims) if all(d >= 0 for d in value.dims) else -1
        type_name = _type_name(value.data_type)
        where = {"tensor": tensor, "file": str(path)}
        if count < 0:
            return
        if type_name == STRING:
            yield from self._strings(tensor, data, count, where)
            return
        need = count * BYTE_SIZES.get(type_name.removeprefix("TYPE_"), 4)
        if len(data) < need:
            yield self.fail(
                "warmup-file",
                f"warmup setting expects {need} bytes, but the data provided from "
                f"{value.input_data_file} only has {len(data)} bytes",
                f"write {need} bytes ({count} {type_name} elements, row-major) to {path}",
                expected=str(need),
                actual=str(len(data)),
                **where,
            )
        elif len(data) > need:
            yield self.warn(
                "warmup-file",
                f"{value.input_data_file} holds {len(data)} bytes; Triton sends its first {need} "
                "and ignores the rest",
                f"trim the file to {need} bytes, or check the warmup's dims and data_type",
                expected=str(need),
                actual=str(len(data)),
                **where,
            )

    def _strings(self, tensor: str, data: bytes, count: int, where: dict[str, str]) -> Iterator[Finding]:
        """Triton's ValidateBytesInputs: 4-byte little-endian lengths, each followed by its bytes."""
        elements, offset = 0, 0
        while offset < len(data):
            if len(data) - offset < 4:
                yield self.fail(
                    "warmup-file",
                    f"incomplete string length indicator for inference input '{tensor}' for model "
                    f"'{self.model}', expecting 4 bytes but only {len(data) - offset} bytes available",
                    "end the file after the last element's bytes (4-byte length, then the bytes)",
                    **where,
                )
                return
            (length,) = struct.unpack_from("<I", data, offset)
            offset, elements = offset + 4 + length, elements + 1
            if elements > count:
                yield self.fail(
                    "warmup-file",
                    f"unexpected number of string elements {elements} for inference input '{tensor}' "
                    f"for model '{self.model}', expecting {count}",
                    f"write {count} elements (each a 4-byte little-endian length, then its bytes)",
                    expected=str(count),
                    actual=f"more than {count}",
                    **where,
                )
                return
        if elements < count:
            yield self.fail(
                "warmup-file",
                f"expected {count} string elements for inference input '{tensor}' for model "
                f"'{self.model}', got {elements}",
                f"write {count} elements (each a 4-byte little-endian length, then its bytes)",
                expected=str(count),
                actual=str(elements),
                **where,
            )


def _protocol(data_type: int) -> str:
    """Triton's DataTypeToProtocolString: FP32, BYTES (TYPE_STRING), <invalid>."""
    if data_type == 0:
        return "<invalid>"
    name = _type_name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _quoted(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
