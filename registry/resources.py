"""The data files mlreg ships: the model repository template and the stand-in backends.

The source folders ``model_repository_template/`` and ``infra/backends/`` at the top of the
checkout are the source of truth.  Building a wheel copies them into the package, under
``registry/_resources/`` (see ``setup.py``), and an installed mlreg reads them from there
with ``importlib.resources``.  A source checkout (or an editable install) has no copy and
falls back to the folders themselves.

Both must be real folders on disk (Triton and ``shutil.copytree`` read them), which they are
for every wheel pip installs; a zipped install gets a clear error instead.
"""

from __future__ import annotations

from pathlib import Path

from registry.errors import TemplateError

PACKAGE = "registry"
PACKAGED = "_resources"
SOURCE_ROOT = Path(__file__).resolve().parents[1]
# resource name -> its source folder, relative to the checkout's root
SOURCES = {
    "model_repository_template": "model_repository_template",
    "backends": "infra/backends",
}


def packaged_dir(name: str) -> Path | None:
    """The copy shipped in the installed package, if this is an installed (built) mlreg."""
    from importlib.resources import files  # lazy: it imports zipfile and tempfile: only when asked

    found = files(PACKAGE) / PACKAGED / name
    if not found.is_dir():
        return None
    if not isinstance(found, Path):
        raise TemplateError(
            f"mlreg's packaged '{name}' is not a folder on disk ({found})",
            fix="install mlreg from its wheel into a virtual environment (pip install mlreg)",
        )
    return found


def resource_dir(name: str) -> Path:
    """The packaged ``name`` folder, else its source folder in the checkout."""
    if name not in SOURCES:
        raise KeyError(name)
    return packaged_dir(name) or SOURCE_ROOT / SOURCES[name]


def template_dir() -> Path:
    """The model repository template (``model_repository_template/``)."""
    return resource_dir("model_repository_template")


def backends_dir() -> Path:
    """The local CPU stand-ins for Triton's onnxruntime and TensorFlow backends (``infra/backends/``)."""
    return resource_dir("backends")
