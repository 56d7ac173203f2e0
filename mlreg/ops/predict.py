"""``mlflow deployments predict -t mlreg``: send inputs to a deployed model, checked against the
config the environment's store serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import environment, fleet
from registry.errors import PromotionError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    import numpy as np


def predict(settings: Settings, env_name: str, name: str, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Send ``inputs`` (input name -> array-like) to ``name`` on the environment's first target,
    checked against the config the store serves (names, dtypes: a UsageError naming the valid
    inputs) and cast to its dtypes; one item gets the batch dimension added."""
    from pipelines.storage import open_store  # lazy: boto3 for an S3 store
    from registry.contracts.config import parse_config  # lazy: protobuf

    env = environment(settings, env_name)
    text = open_store(env.store).read_config(name)
    if text is None:
        raise PromotionError(f"{name} is not deployed in '{env.name}'", fix="create the deployment first")
    config = parse_config(text)
    arrays = _typed(config, inputs, f"{name} in '{env.name}'")
    outputs = [t.name for t in config.output]
    with fleet(settings, env) as servers:
        return servers.target(servers.urls[0]).infer(name, arrays, outputs)


def _typed(config: Any, inputs: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """``inputs`` as arrays of the config's dtypes (a batching model's single item: batch of one);
    an unknown or missing input, or values of another kind than the input's, is a UsageError."""
    tensors = {t.name: t for t in config.input}
    valid = ", ".join(f"{t.name} {_describe(config, t)}" for t in config.input)
    unknown = sorted(str(key) for key in inputs if str(key) not in tensors)
    if unknown:
        raise UsageError(
            f"{where} has no input {', '.join(map(repr, unknown))}; its inputs: {valid}",
            fix="name the columns (or dict keys) after the model's inputs",
        )
    missing = [t.name for t in config.input if t.name not in inputs and not t.optional]
    if missing:
        raise UsageError(
            f"{where} needs input {', '.join(map(repr, missing))}, not sent; its inputs: {valid}",
            fix="send every input the model's config declares",
        )
    return {str(key): _cast(config, tensors[str(key)], value, where) for key, value in inputs.items()}


def _describe(config: Any, tensor: Any) -> str:
    """``TYPE_FP32 [-1,3]``: an input's type and shape as its config declares them."""
    from registry.contracts.config import data_type_name, full_shape  # lazy: protobuf

    shape = ",".join(map(str, full_shape(config, list(tensor.dims))))
    return f"TYPE_{data_type_name(tensor.data_type)} [{shape}]"


def _cast(config: Any, tensor: Any, value: Any, where: str) -> np.ndarray:
    """``value`` as an array of ``tensor``'s dtype: strings for a number or a bool, numbers that do
    not fit (1.5 or 300 for an INT8) and ragged rows are refused, naming the input."""
    import numpy as np  # lazy: ~0.1 s only predict pays
    from tritonclient.utils import triton_to_np_dtype  # lazy: ~0.5 s only predict pays

    from registry.contracts.config import data_type_name  # lazy: protobuf

    triton_type = data_type_name(tensor.data_type)
    wanted = np.dtype(triton_to_np_dtype("BYTES" if triton_type == "STRING" else triton_type))

    def refuse(what: str) -> UsageError:
        return UsageError(
            f"input '{tensor.name}' of {where} is {_describe(config, tensor)}, but {what}",
            fix=f"send {'numbers' if wanted.kind != 'b' else 'true/false'} for '{tensor.name}' "
            f"(dims {list(tensor.dims)} per item)",
        )

    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise refuse(f"its values do not form an array (rows of different lengths?): {exc}") from exc
    if wanted.kind != "O":
        text = (v for v in array.flat if isinstance(v, (str, bytes))) if array.dtype.kind in "USO" else ()
        first = next(iter(text), None)  # np.str_ and np.bytes_ are str and bytes
        if first is not None:
            raise refuse(f"the values sent are strings (e.g. {str(first)!r})")
        try:
            with np.errstate(all="ignore"):
                cast = array.astype(wanted)
        except (ValueError, TypeError) as exc:
            raise refuse(f"the values sent cannot be {wanted.name}: {exc}") from exc
        if wanted.kind in "biu" and not np.array_equal(cast, array):
            raise refuse(f"the values sent do not fit {wanted.name} (e.g. fractions or out of range)")
        array = cast
    else:
        array = array.astype(wanted)
    if config.max_batch_size > 0 and array.ndim == len(tensor.dims):
        array = array[None, ...]  # one item: add the batch dim
    return array


__all__ = ["predict"]
