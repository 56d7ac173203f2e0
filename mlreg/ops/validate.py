"""``mlreg validate PATH`` and ``mlreg diff OLD NEW``: the offline contract checks.

Both read files only (``registry.contracts``: protobuf, no network, no TensorFlow); the command's
start-up is measured (``benchmarks/startup.py``), so this module imports the contracts when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from registry.errors import UsageError

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from registry.contracts.diff import ContractDiff
    from registry.contracts.validate import Report


def validate(path: Path, gpus: int | None = None) -> Report:
    """Every finding of the repository (or one model folder) at ``path``; a path that does not
    exist is a UsageError."""
    from registry.contracts.validate import validate_path  # lazy: ~9 ms, this verb only

    if not path.exists():
        raise UsageError(f"'{path}' does not exist", fix="pass a model repository or model folder")
    return validate_path(path, gpus=gpus)


def diff(old: Path, new: Path, repository: Path | None = None) -> ContractDiff:
    """The tensor-contract changes from ``old`` to ``new`` (model folders or config.pbtxt files),
    and what they break in ``repository``'s ensembles when one is given."""
    from registry.contracts.diff import diff_model  # lazy: ~9 ms, this verb only
    from registry.contracts.repository import read_repository  # lazy: with the line above

    repo = read_repository(repository) if repository else None
    return diff_model(config_of(old), config_of(new), repo)


def config_of(path: Path) -> ModelConfig:
    """The config a model folder holds, or a config.pbtxt file's (a UsageError for anything else)."""
    from registry.contracts.config import CONFIG_NAME, load_config  # lazy: ~9 ms, this verb only

    file = path / CONFIG_NAME if path.is_dir() else path
    if not file.is_file():
        raise UsageError(
            f"'{path}' is neither a config.pbtxt nor a model folder holding one",
            fix="pass two model folders (or two config.pbtxt files)",
        )
    return load_config(file)


__all__ = ["config_of", "diff", "validate"]
