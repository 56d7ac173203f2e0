"""Packaging hook: the wheel carries the template and the stand-in backends as package data.

``model_repository_template/`` and ``infra/backends/`` stay at the top of the checkout (the
source of truth, used as they are by a source checkout or an editable install).  Building a
wheel copies them into ``registry/_resources/``, where ``registry/resources.py`` finds them
with ``importlib.resources``.  Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# packaged name (under registry/_resources/) -> source folder
RESOURCES = {
    "model_repository_template": "model_repository_template",
    "backends": "infra/backends",
}
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".mlreg")


class BuildPyWithResources(build_py):
    """build_py, then the resource folders copied into the build tree (not in editable mode)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the source folders themselves
        for name, source in RESOURCES.items():
            target = Path(self.build_lib) / "registry" / "_resources" / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(HERE / source, target, ignore=SKIP)


setup(cmdclass={"build_py": BuildPyWithResources})
