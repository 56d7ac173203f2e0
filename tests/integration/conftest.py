"""A real tritonserver (the nvidia-pytriton wheel's binary), started once per session; the session's
MLflow-native stack (tests/integration/nativestack.py) that two modules share."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.devstack import local_triton
from pipelines.triton.control import TritonControl
from registry.settings import Settings
from tests.conftest import TEMPLATE, once_per_run
from tests.integration.nativestack import NativeStack, start_native_stack
from tests.integration.stacks import TEARDOWN_GRACE


@pytest.fixture(autouse=True, scope="module")
def _tracking_uri_kept() -> Iterator[None]:
    """No module hands the next one an MLFLOW_TRACKING_URI (mlflow.set_tracking_uri writes it into
    os.environ): a leak once pointed test_promote's CLI runs at test_mlflow_native's registry."""
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if saved is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = saved


@pytest.fixture(scope="session")
def image_model_seed7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """image_model exported again with another seed (``mlreg export image_model --seed 7``): other
    weights, other answers, the same contract.  The session's second and last TensorFlow export: a
    test that needs only a new version (new bytes) takes one from tests/integration/stacks.py."""
    from registry import template

    with once_per_run(tmp_path_factory, "image-model-seed-7") as (out, first):
        if first:
            template.build(TEMPLATE, out, models=["image_model"], seed=7, device="gpu", force=True)
    return out / "image_model"


@dataclass
class RunningTriton:
    info: local_triton.ServerInfo
    control: TritonControl
    repository: Path


@pytest.fixture(scope="session")
def triton(built_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTriton]:
    """tritonserver on the built template with the whole ensemble loaded."""
    state = tmp_path_factory.mktemp("triton-state")
    standins = Settings.from_env().backends_source
    info, process = local_triton.start_server(built_repository, state, standins)
    control = TritonControl(info.grpc_url, timeout=30.0, load_timeout=300.0)
    try:
        control.load("ensemble_multi_modal_model")
        yield RunningTriton(info, control, built_repository)
    finally:
        control.close()
        local_triton.stop_pid(info.pid, info.shm_prefix, grace=TEARDOWN_GRACE, process=process)


@pytest.fixture(scope="session")
def native_stack(built_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeStack]:
    """test_mlflow_native.py's and test_browser.py's stack (one worker runs both: SAME_WORKER)."""
    home = tmp_path_factory.mktemp("native") / ".mlreg"
    with start_native_stack(built_repository, home) as stack:
        yield stack


@pytest.fixture(scope="session")
def deployed(native_stack: NativeStack) -> subprocess.CompletedProcess[str]:
    """image_model v2 promoted by `mlflow deployments create -t mlreg` (NVIDIA's command shape)."""
    create = ["deployments", "create", "-t", "mlreg", "--name", "image_model", "-m", "models:/image_model/2"]
    return native_stack.mlflow(*create)
