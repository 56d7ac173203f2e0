"""What a swap does besides the swap: the peak-batch warmup a stored config carries, and when a
load must re-create the version that serves.

Triton runs a config's ``model_warmup`` samples while it loads a version, before READY, and refuses
the load when one fails -- so a candidate that fails only at its peak batch is refused at load
instead of answering HTTP 500 to the first full batch.  ``peak_sample`` adds one at
``max_batch_size`` (registry/contracts/warmup.py) where zeros are a sample; never for the python
backend, whose failing warmup crashes Triton 2.51's whole server (stages' peak request instead).
Triton re-creates every loaded version when a load's config differs from the served one beyond
``version_policy``/``instance_group`` (core ``ConfigChangeRequiresReload``): ``recreating_fields``
names those fields, and ``plan.swap_notes`` puts both facts in the plan.
"""

from __future__ import annotations

from typing import Any

from registry.contracts.config import model_config_pb2, parse_config
from registry.contracts.warmup import peak_warmup

PYTHON_WARMUP = (
    "python backend: a warmup sample that fails can crash Triton 2.51's whole server (seen here: "
    "every time on error responses, about one load in four on a raised exception), so mlreg sends "
    "the peak batch itself before traffic instead"
)
WARMUP_BYTES = 64 << 20  # a peak-batch request moving more than this is left to the model's owner
PAYLOAD_TYPES = {"TYPE_UINT8", "TYPE_STRING"}  # with a variable dim: encoded bytes, zeros decode to nothing


def peak_sample(text: str) -> tuple[str, str]:
    """The registered config ``text`` with its peak-batch ``model_warmup`` (registry/contracts/
    warmup.py), and "" -- or ``text`` unchanged and why no sample was derived: an input of encoded
    bytes (UINT8/STRING of variable length: zeros are no image, no document), a sample larger than
    WARMUP_BYTES (the model's owner declares a warmup of the size that matters), or none Triton's
    warmup could feed.  A config without batching, an ensemble or a declared warmup: unchanged, ""."""
    config = parse_config(text)
    types = model_config_pb2().DataType
    if config.max_batch_size <= 0 or len(config.model_warmup) or config.platform == "ensemble":
        return text, ""
    size = peak_bytes(config)
    if size > WARMUP_BYTES:
        return text, (
            f"a request at max_batch_size {config.max_batch_size} moves {size / 2**20:.0f} MiB, inputs "
            f"and outputs (over {WARMUP_BYTES >> 20} MiB)"
        )
    if config.backend == "python":
        return text, PYTHON_WARMUP
    inputs = [t for t in config.input if not t.optional]
    payload = [t.name for t in inputs if types.Name(t.data_type) in PAYLOAD_TYPES and -1 in t.dims]
    if payload:
        return text, f"input {payload[0]} holds encoded bytes of variable length (zeros are no sample)"
    warmed = peak_warmup(text)
    return warmed, "" if warmed != text else "Triton's warmup cannot feed its inputs (shape tensors, state)"


def peak_bytes(config: Any) -> int:
    """What one request at ``max_batch_size`` moves: its required inputs and its outputs (a variable
    dimension counted as 1) -- what a peak sample costs the server at every load, or the client."""
    tensors = [t for t in config.input if not t.optional] + list(config.output)
    return int(config.max_batch_size) * sum(_sample_bytes(t) for t in tensors)


def _sample_bytes(tensor: Any) -> int:
    name = model_config_pb2().DataType.Name(tensor.data_type).removeprefix("TYPE_")
    width = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2}.get(name, 4)
    width = 8 if name in {"INT64", "UINT64", "FP64"} else width
    count = 1
    for dim in tensor.dims:
        count *= max(1, int(dim))
    return count * width


def recreating_fields(old: str | None, new: str) -> list[str]:
    """The top-level fields in which ``new`` differs from ``old`` beyond ``version_policy`` and
    ``instance_group`` -- where Triton re-creates every loaded version on the load (core
    ``ConfigChangeRequiresReload``); [] when there is no old config or nothing else changes."""
    if old is None:
        return []
    before, after = parse_config(old), parse_config(new)
    for config in (before, after):
        config.ClearField("version_policy")
        config.ClearField("instance_group")
    fields = {f.name for f, _ in before.ListFields()} | {f.name for f, _ in after.ListFields()}
    return sorted(f for f in fields if _field(before, f) != _field(after, f))


def _field(config: Any, name: str) -> Any:
    value = getattr(config, name)
    return (
        value.SerializeToString(deterministic=True)
        if hasattr(value, "SerializeToString")
        else (
            [v.SerializeToString(deterministic=True) if hasattr(v, "SerializeToString") else v for v in value]
            if hasattr(value, "__len__") and not isinstance(value, str | bytes)
            else value
        )
    )
