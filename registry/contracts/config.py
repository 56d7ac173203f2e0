"""Read and write Triton ``config.pbtxt`` files with Triton's own protobuf schema.

The schema is tritonclient's generated ``model_config_pb2``.  It lives in the package
``tritonclient.grpc``, whose ``__init__`` imports gRPC and numpy (~0.3 s, more than the whole
offline validation): ``model_config_pb2()`` loads the generated file alone, registered under its
own module name, so a later ``import tritonclient.grpc`` reuses it (one descriptor, one class).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from registry.errors import ContractError

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

CONFIG_NAME = "config.pbtxt"
_LOCATION = re.compile(r"^(\d+):(\d+) : (.*)$", re.S)
PB2_MODULE = "tritonclient.grpc.model_config_pb2"


@lru_cache(maxsize=1)
def model_config_pb2() -> ModuleType:
    """tritonclient's ``model_config_pb2`` module, without importing ``tritonclient.grpc``.

    The module is published in ``sys.modules`` only once it is complete, so a concurrent
    ``import tritonclient.grpc`` never sees half of it; were the file run twice, protobuf returns
    the same descriptors and classes for the same serialized file.
    """
    if PB2_MODULE in sys.modules:
        return sys.modules[PB2_MODULE]
    path = _pb2_file()
    spec = importlib.util.spec_from_file_location(PB2_MODULE, path) if path else None
    if spec is None or spec.loader is None:  # an unusual layout: the ordinary import
        return importlib.import_module(PB2_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sys.modules.setdefault(PB2_MODULE, module)


def _pb2_file() -> Path | None:
    package = importlib.util.find_spec("tritonclient")
    locations = list(package.submodule_search_locations or []) if package else []
    files = [Path(p) / "grpc" / "model_config_pb2.py" for p in locations]
    return next((f for f in files if f.is_file()), None)


@lru_cache(maxsize=512)
def _parsed(text: str) -> bytes:
    """``text`` parsed, in protobuf's binary form: a promotion reads the same few configs dozens of
    times, and reading the binary form back is ~500x cheaper than parsing the text again."""
    from google.protobuf import text_format  # lazy: ~15 ms, with the schema

    config = model_config_pb2().ModelConfig()
    text_format.Parse(text, config)
    return bytes(config.SerializeToString())


def parse_config(text: str, source: str = CONFIG_NAME) -> ModelConfig:
    """Parse config.pbtxt text (a fresh message each call); a syntax error names file, line and
    column."""
    from google.protobuf import text_format  # lazy: ~15 ms, with the schema

    config = model_config_pb2().ModelConfig()
    try:
        config.ParseFromString(_parsed(text))
    except text_format.ParseError as exc:
        match = _LOCATION.match(str(exc))
        where, why = (f"{source}:{match[1]}:{match[2]}", match[3]) if match else (source, str(exc))
        raise ContractError(
            f"{where}: cannot parse model configuration: {why}",
            fix="correct the syntax; the fields are those of Triton's ModelConfig (model_config.proto)",
            file=source,
        ) from exc
    return config


def config_json(text: str, name: str = "") -> str:
    """A config.pbtxt as the JSON Triton's load API takes as a ``config`` override (optionally
    renamed)."""
    from google.protobuf import json_format  # lazy: ~20 ms, with the schema

    config = parse_config(text)
    if name:
        config.name = name
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def load_config(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(
            f"{path}: cannot read model configuration: {exc}",
            fix="make it a readable UTF-8 text file",
            file=str(path),
        ) from exc
    return parse_config(text, str(path))


def format_config(config: ModelConfig) -> str:
    from google.protobuf import text_format  # lazy: ~15 ms, with the schema

    return str(text_format.MessageToString(config))


def data_type_name(data_type: int) -> str:
    """``TYPE_FP32`` -> ``FP32`` (the names signature readers use)."""
    return str(model_config_pb2().DataType.Name(data_type)).removeprefix("TYPE_")


def full_shape(config: ModelConfig, dims: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape as the model sees it: ``[-1] + dims`` when the model batches."""
    return ((-1,) if config.max_batch_size > 0 else ()) + tuple(int(d) for d in dims)
