"""Triton's server-side auto-complete of ``platform`` / ``backend`` / ``default_model_filename``.

Core ``AutoCompleteBackendFields`` (model_config_utils.cc) fills the fields a config leaves out
from the files of the *first* version folder (folders sorted as strings), one backend after the
other: TensorFlow, TensorRT, ONNX Runtime, OpenVINO, PyTorch, Python, then a custom backend named
by the model folder (``model.<backend>``).  Auto-complete is on by default, so a config without
``platform`` loads when a model file tells the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAVEDMODEL, GRAPHDEF = "model.savedmodel", "model.graphdef"
TF_PLATFORMS = {"tensorflow_savedmodel": SAVEDMODEL, "tensorflow_graphdef": GRAPHDEF}


@dataclass(frozen=True)
class Resolved:
    """The fields Triton serves the model with, and where auto-complete took them from."""

    platform: str
    backend: str
    filename: str
    filled_from: str | None = None  # e.g. "1/model.onnx" when a field was filled from a file
    error: str | None = None  # Triton's refusal when nothing tells the backend


class _Folder:
    """The first version folder's entries, listed once and only when needed."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path
        self._entries: dict[str, bool] | None = None
        self.version = ""

    def entries(self) -> dict[str, bool]:
        if self._entries is None:
            self._entries = {}
            try:
                subdirs = sorted(p.name for p in self.model_path.iterdir() if p.is_dir())
            except OSError:
                subdirs = []
            if subdirs:
                self.version = subdirs[0]
                try:
                    self._entries = {p.name: p.is_dir() for p in (self.model_path / self.version).iterdir()}
                except OSError:
                    self._entries = {}
        return self._entries

    def has_file(self, name: str) -> bool:
        return self.entries().get(name) is False

    def has_dir(self, name: str) -> bool:
        return self.entries().get(name) is True

    def has(self, name: str) -> bool:
        return name in self.entries()

    def where(self, name: str) -> str:
        return f"{self.version}/{name}"


@dataclass
class _Fields:
    platform: str
    backend: str
    filename: str
    runtime: str
    filled_from: str | None = None

    @property
    def bare(self) -> bool:
        """Nothing but the files can tell the backend."""
        return not self.platform and not self.filename


def _tensorflow(f: _Fields, folder: _Folder) -> bool:
    if not f.platform and f.backend in ("", "tensorflow"):
        by_name = {v: k for k, v in TF_PLATFORMS.items()}
        if f.filename in by_name:
            f.platform = by_name[f.filename]
        elif not f.filename and folder.has_dir(SAVEDMODEL):
            f.platform, f.filled_from = "tensorflow_savedmodel", folder.where(SAVEDMODEL)
        elif not f.filename and folder.has_file(GRAPHDEF):
            f.platform, f.filled_from = "tensorflow_graphdef", folder.where(GRAPHDEF)
    if f.platform not in TF_PLATFORMS:
        return False
    f.backend = f.backend or "tensorflow"
    f.filename = f.filename or TF_PLATFORMS[f.platform]
    return True


def _simple(
    backend: str, platform: str, filename: str, file_only: bool
) -> Callable[[_Fields, _Folder], bool]:
    """TensorRT, ONNX Runtime, OpenVINO and PyTorch follow one pattern (``platform`` may be "")."""

    def fill(f: _Fields, folder: _Folder) -> bool:
        if not f.backend:
            if (platform and f.platform == platform) or f.filename == filename:
                f.backend = backend
            elif f.bare and (folder.has_file(filename) if file_only else folder.has(filename)):
                f.backend, f.filled_from = backend, folder.where(filename)
        if f.backend != backend:
            return False
        f.platform = f.platform or platform
        if not f.filename and not (backend == "pytorch" and f.runtime == "model.py"):
            f.filename = filename
        return True

    return fill


def _python(f: _Fields, folder: _Folder) -> bool:
    if not f.backend:
        if f.filename == "model.py":
            f.backend = "python"
        elif f.bare and folder.has("model.py"):
            f.backend, f.filled_from = "python", folder.where("model.py")
    if f.backend != "python":
        return False
    f.filename = f.filename or "model.py"
    return True


FILLERS = (
    _tensorflow,
    _simple("tensorrt", "tensorrt_plan", "model.plan", file_only=True),
    _simple("onnxruntime", "onnxruntime_onnx", "model.onnx", file_only=False),
    _simple("openvino", "", "model.xml", file_only=False),
    _simple("pytorch", "pytorch_libtorch", "model.pt", file_only=True),
    _python,
)


def resolve(name: str, config: Any, model_path: Path) -> Resolved:
    """What Triton's auto-complete makes of ``config`` for the model folder ``model_path``."""
    fields = _Fields(config.platform, config.backend, config.default_model_filename, config.runtime)
    folder = _Folder(model_path)
    for fill in FILLERS:
        if fill(fields, folder):
            return Resolved(fields.platform, fields.backend, fields.filename, fields.filled_from)
    if not fields.backend and fields.bare:
        if "." not in name:
            return Resolved(
                "",
                "",
                "",
                error=f"Invalid model name: Could not determine backend for model '{name}' with no backend "
                "in model configuration. Expected model name of the form 'model.<backend_name>'.",
            )
        backend = name.split(".", 1)[1]
        return Resolved("", backend, f"model.{backend}", f"the folder name '{name}'")
    return Resolved(fields.platform, fields.backend, fields.filename)
