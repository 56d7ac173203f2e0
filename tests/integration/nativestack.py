"""The session's MLflow-native stack, shared by test_mlflow_native.py and test_browser.py (their
fixtures ``native_stack`` and ``deployed`` live in tests/integration/conftest.py): a real
tritonserver, the embedded registry and the MLflow UI as a real `mlflow server` on it, the
template registered and its ensemble promoted, image_model v2 registered.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlreg.ops.promote import promote
from pipelines.core.options import Options
from pipelines.devstack.stack import stack_down, stack_up
from pipelines.triton.control import TritonControl
from registry.export import member_versions
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from registry.template import exporter_path
from tests.conftest import ROOT, TEMPLATE
from tests.integration.stacks import ENSEMBLE, MODELS, seed_registry


@dataclass
class NativeStack:
    settings: Settings
    registry: MlflowRegistry
    grpc_url: str
    ui_url: str
    env: dict[str, str]  # the environment of a user's shell on this project

    def mlflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The real `mlflow` CLI in a subprocess."""
        return subprocess.run(
            [sys.executable, "-m", "mlflow", *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=ROOT,
            env=self.env,
        )

    def serving(self, model: str) -> list[str]:
        with TritonControl(self.grpc_url) as triton:
            states = triton.model_states().get(model, {})
        return sorted((v for v, s in states.items() if s == "READY"), key=int)


def register_template(registry: MlflowRegistry, built: Path) -> None:
    """The built template's six models, members before the ensemble, with their exporters' lineage."""
    for name in (*sorted(m for m in MODELS if m != ENSEMBLE), ENSEMBLE):
        folder = built / name
        members = member_versions(registry.models, folder) if name == ENSEMBLE else None
        register(registry, find_candidate(folder), exporter=exporter_path(TEMPLATE / name), members=members)


def image_model_v2(built: Path, dest: Path) -> Path:
    """image_model with other bytes and the same contract (a new version, as a re-export makes)."""
    folder = dest / "image_model"
    shutil.copytree(built / "image_model", folder)
    (folder / "1" / "model" / "assets").mkdir(exist_ok=True)
    (folder / "1" / "model" / "assets" / "release.txt").write_text("image_model, second release\n")
    return folder


@contextlib.contextmanager
def start_native_stack(built: Path, home: Path) -> Iterator[NativeStack]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLREG_HOME"] = str(home)
    settings = Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    seed_registry(settings)  # the UI's server and the client open it: neither migrates it
    status = stack_up(settings, ui=True)
    registry = MlflowRegistry(settings)
    try:
        register_template(registry, built)
        promote(settings, "local", ENSEMBLE, "1", Options(skip_quality=True))
        exporter = exporter_path(TEMPLATE / "image_model")
        v2 = register(registry, find_candidate(image_model_v2(built, home / "v2")), exporter=exporter)
        assert v2.version == "2"
        assert status.info is not None
        yield NativeStack(settings, registry, status.info.grpc_url, status.mlflow_url, env)
    finally:
        stack_down(settings)
