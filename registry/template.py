"""``mlreg template build``: the template's configs and code plus freshly exported artifacts.

The template (``model_repository_template/``) holds each model's ``config.pbtxt``,
the python-backend code and, for the three Keras models, an exporter
(``<model>/<model>_exporter.py`` with ``export(version_dir, seed) -> dict``).
Building copies everything but the exporters into OUT and runs each exporter
into ``OUT/<model>/1``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from registry.contracts.config import CONFIG_NAME, format_config, load_config, model_config_pb2
from registry.errors import MissingDependencyError, TemplateError

log = logging.getLogger(__name__)

EXPORTER_SUFFIX = "_exporter.py"
VERSION = "1"
SKIP = shutil.ignore_patterns("*" + EXPORTER_SUFFIX, "__pycache__", "*.pyc", ".gitkeep")


@dataclass
class BuildResult:
    out: Path
    models: list[str]
    exported: dict[str, dict[str, object]] = field(default_factory=dict)
    cpu_rewritten: list[str] = field(default_factory=list)


def template_models(template: Path) -> list[Path]:
    if not template.is_dir():
        raise TemplateError(
            f"template folder '{template}' does not exist",
            fix="set MLREG_TEMPLATE_DIR to the model repository template",
        )
    return sorted(p for p in template.iterdir() if (p / CONFIG_NAME).is_file())


def exporter_path(model_dir: Path) -> Path | None:
    path = model_dir / f"{model_dir.name}{EXPORTER_SUFFIX}"
    return path if path.is_file() else None


def load_exporter(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mlreg_exporter_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise TemplateError(f"cannot import exporter {path}", fix="check the file is Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "export", None)):
        raise TemplateError(
            f"exporter {path} defines no export(version_dir, seed) function",
            fix="add `def export(version_dir: Path, seed: int = 0) -> dict`",
        )
    return module


def require_export_extra() -> None:
    for module in ("tensorflow", "tf2onnx"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(module, "export", "Exporting the template's models")


def run_exporter(model_dir: Path, version_dir: Path, seed: int) -> dict[str, object]:
    path = exporter_path(model_dir)
    if path is None:
        return {}
    require_export_extra()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if version_dir.exists():
        shutil.rmtree(version_dir)
    version_dir.mkdir(parents=True)
    log.info("exporting %s (seed %d)", model_dir.name, seed)
    return dict(load_exporter(path).export(version_dir, seed=seed) or {})


def gpu_available() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def rewrite_for_cpu(config_path: Path) -> bool:
    """Turn KIND_GPU instance groups into KIND_CPU; True when the config changed."""
    kinds = model_config_pb2().ModelInstanceGroup
    config = load_config(config_path)
    gpu = kinds.KIND_GPU
    groups = [g for g in config.instance_group if g.kind == gpu]
    if not groups:
        return False
    for group in groups:
        group.kind = kinds.KIND_CPU
        del group.gpus[:]
    header = (
        "# Written by 'mlreg template build --device cpu': the template's KIND_GPU\n"
        "# instance groups run as KIND_CPU on this machine (no GPU).\n"
    )
    config_path.write_text(header + format_config(config))
    return True


def build(
    template: Path,
    out: Path,
    *,
    models: list[str] | None = None,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    on_model: Callable[[str], None] | None = None,
) -> BuildResult:
    """Write the complete, loadable repository to ``out``."""
    available = _chosen(template, models, device)
    if out.exists() and any(out.iterdir()) and not force:
        raise TemplateError(
            f"'{out}' exists and is not empty",
            fix="pass --force to overwrite the models it holds, or choose another OUT",
        )
    cpu = device == "cpu" or (device == "auto" and not gpu_available())
    result = BuildResult(out=out, models=[])
    for model_dir in available:
        if on_model:
            on_model(model_dir.name)
        _build_model(model_dir, out / model_dir.name, seed, cpu, result)
    return result


def chosen_models(template: Path, models: list[str] | None, device: str = "auto") -> list[str]:
    """The names ``build`` would build, in its order (a model or device it does not know: refused)."""
    return [folder.name for folder in _chosen(template, models, device)]


def _chosen(template: Path, models: list[str] | None, device: str) -> list[Path]:
    """The template's model folders to build (all when ``models`` is empty); a model or device
    the template does not know is refused."""
    if device not in {"auto", "cpu", "gpu"}:
        raise TemplateError(f"unknown device '{device}'", fix="use auto, cpu or gpu")
    available = template_models(template)
    names = [p.name for p in available]
    unknown = sorted(set(models or []) - set(names))
    if unknown:
        raise TemplateError(
            f"no model named {', '.join(unknown)} in the template", fix=f"choose from: {', '.join(names)}"
        )
    return [p for p in available if not models or p.name in models]


def _build_model(model_dir: Path, target: Path, seed: int, cpu: bool, result: BuildResult) -> None:
    """One model of the template copied to ``target``, its version exported, noted in ``result``."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model_dir, target, ignore=SKIP)
    (target / VERSION).mkdir(exist_ok=True)  # an ensemble's version folder is empty
    result.exported[model_dir.name] = run_exporter(model_dir, target / VERSION, seed)
    if cpu and rewrite_for_cpu(target / CONFIG_NAME):
        result.cpu_rewritten.append(model_dir.name)
    result.models.append(model_dir.name)
