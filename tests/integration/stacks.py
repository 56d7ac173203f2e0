"""What the integration stacks share: the template registered as ``mlreg export`` registers it, new
versions without running an exporter again, and the snapshot a refused promotion must leave alone.

One TensorFlow export per session (``built_repository`` in tests/conftest.py, plus image_model
re-exported once with another seed where a test needs other *answers*).  A test that needs only a
new *version* (other bytes, same contract) gets one from :func:`new_bytes`: what a re-export of the
same weights makes, seconds cheaper than running the exporter.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.contracts.config import CONFIG_NAME
from registry.export import member_versions
from registry.mlflow import MlflowRegistry
from registry.register import RegisterResult, find_candidate, register
from registry.template import BuildResult, exporter_path
from tests.conftest import TEMPLATE

ENSEMBLE = "ensemble_multi_modal_model"
MEMBERS = (
    "image_model",
    "image_preprocess",
    "multi_modal_model",
    "table_data_model",
    "table_data_preprocess",
)
MODELS = (*MEMBERS, ENSEMBLE)


def exported_folder(built: Path, model: str, dest: Path) -> Path:
    """``model`` as ``mlreg export`` stages it: the built folder with the template's own config
    (KIND_GPU kept: devices are adapted at deploy; the session build rewrote them for this CPU)."""
    folder = dest / model
    shutil.copytree(built / model, folder)
    shutil.copy2(TEMPLATE / model / CONFIG_NAME, folder / CONFIG_NAME)
    return folder


def register_template(
    registry: MlflowRegistry, build: BuildResult, dest: Path, models: tuple[str, ...] = MODELS
) -> list[RegisterResult]:
    """What ``export_models`` registers, members before the ensemble, with the exporters' lineage and
    the export's information, from the session's build instead of a second export."""
    results = []
    for name in sorted(models, key=lambda m: (m == ENSEMBLE, m)):
        folder = exported_folder(build.out, name, dest)
        members = member_versions(registry, folder) if name == ENSEMBLE else None
        results.append(
            register(
                registry,
                find_candidate(folder),
                exporter=exporter_path(TEMPLATE / name),
                export_info=dict(build.exported.get(name) or {}),
                members=members,
            )
        )
    return results


def new_bytes(source: Path, dest: Path, release: str) -> Path:
    """A copy of the model folder ``source`` with other bytes, the same contract and the same answers:
    a SavedModel gains an asset, an ONNX model a metadata entry, python code a comment."""
    folder = dest / source.name
    shutil.copytree(source, folder)
    version = folder / "1"
    saved = next(version.rglob("saved_model.pb"), None)
    onnx_file = next(version.rglob("*.onnx"), None)
    if saved is not None:
        (saved.parent / "assets").mkdir(exist_ok=True)
        (saved.parent / "assets" / "release.txt").write_text(f"{source.name}, release {release}\n")
    elif onnx_file is not None:
        import onnx

        model = onnx.load(str(onnx_file))
        model.metadata_props.add(key="release", value=release)
        onnx.save(model, str(onnx_file))
    elif (version / "model.py").is_file():
        code = version / "model.py"
        code.write_text(f"{code.read_text()}\n# release {release}\n")
    else:
        raise AssertionError(f"no model file to vary in {version}")
    return folder


def register_new_bytes(registry: MlflowRegistry, source: Path, dest: Path, release: str) -> str:
    """:func:`new_bytes` registered (with the exporter's lineage, as a re-export); its version."""
    folder = new_bytes(source, dest, release)
    exporter = exporter_path(TEMPLATE / source.name)
    return register(registry, find_candidate(folder), exporter=exporter).version


@dataclass
class Snapshot:
    """Everything a refused promotion must leave alone."""

    files: dict[str, str]  # the store's bytes and configs (locks left out)
    aliases: dict[str, dict[str, str]]  # every alias of every model, every environment's
    serving: dict[str, list[str]]  # what Triton serves


def store_files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".mlreg-lock.")
    }


def snapshot(
    root: Path, registry: MlflowRegistry, serving: Any, models: tuple[str, ...] = MODELS
) -> Snapshot:
    return Snapshot(
        files=store_files(root),
        aliases={m: registry.aliases(m) for m in models},
        serving={m: serving(m) for m in models},
    )
