"""A Triton model repository on disk, read for validation (configs parsed, folders listed)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from registry.contracts.autocomplete import Resolved, resolve
from registry.contracts.config import CONFIG_NAME, load_config
from registry.contracts.findings import Finding, error, printable, warning
from registry.errors import ContractError

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

MAX_LISTED = 5


@dataclass
class ModelEntry:
    name: str
    path: Path
    config: ModelConfig | None

    @cached_property
    def resolved(self) -> Resolved:
        """platform / backend / model file name as Triton's auto-complete fills them."""
        assert self.config is not None
        return resolve(self.name, self.config, self.path)

    @property
    def exporter(self) -> Path | None:
        """The template's exporter for this model, when the folder is a template source."""
        path = self.path / f"{self.name}_exporter.py"
        return path if path.is_file() else None

    def versions(self) -> list[str]:
        """Numeric version folders, ascending."""
        try:
            children = list(self.path.iterdir())
        except OSError:
            return []
        found = []
        for child in children:
            try:
                if child.name.isdigit() and child.is_dir():
                    found.append(child.name)
            except OSError:  # a symlink loop or unreadable entry is not a version
                continue
        return sorted(found, key=int)


@dataclass
class Repository:
    root: Path
    models: dict[str, ModelEntry] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _has_config(path: Path) -> bool:
    try:
        return (path / CONFIG_NAME).is_file()
    except OSError:
        return False


def read_model(path: Path, repo: Repository) -> None:
    name = os.fsdecode(path.name)
    try:
        config = load_config(path / CONFIG_NAME)
    except ContractError as exc:
        repo.findings.append(
            error("config-parse", printable(name), exc.message, exc.fix or "", file=str(path / CONFIG_NAME))
        )
        config = None
    repo.models[name] = ModelEntry(name, path, config)


def read_repository(path: Path) -> Repository:
    """``path`` is a repository (folders of models) or one model folder."""
    if not _is_dir(path):
        raise ContractError(
            f"'{path}' is not a folder", fix="pass a model repository folder or one model folder"
        )
    if _has_config(path):
        repo = Repository(path.parent)
        read_model(path, repo)
        return repo
    repo = Repository(path)
    without_config = []
    try:
        children = sorted(path.iterdir())
    except OSError as exc:
        raise ContractError(f"cannot list '{path}': {exc}", fix="check the folder's permissions") from exc
    for child in children:
        if not _is_dir(child) or child.name == "__pycache__":  # Python's bytecode cache, never a model
            continue
        if _has_config(child):
            read_model(child, repo)
        else:
            without_config.append(printable(os.fsdecode(child.name)))
    if without_config:
        shown = ", ".join(without_config[:MAX_LISTED])
        more = f" and {len(without_config) - MAX_LISTED} more" if len(without_config) > MAX_LISTED else ""
        repo.findings.append(
            warning(
                "no-config",
                "(repository)",
                f"{len(without_config)} folder(s) hold no {CONFIG_NAME}: {shown}{more}",
                "mlreg checks only models with a config.pbtxt (Triton may auto-complete one); add one "
                "or remove the folder",
                origin="mlreg",
            )
        )
    if not repo.models and not without_config:
        repo.findings.append(
            error(
                "empty-repository",
                "(repository)",
                f"'{path}' holds no model folders",
                "point at a repository: one folder per model, each with config.pbtxt",
            )
        )
    return repo
