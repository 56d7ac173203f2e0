"""NVIDIA's mlflow-triton flows, switched to ``-t mlreg``, on a real tritonserver and a real MLflow.

The flows are those NVIDIA documents for its plugin (triton-inference-server/server
``deploy/mlflow-triton-plugin`` README and ``qa/L0_mlflow``): its example model
``onnx_float32_int32_int32`` published in the ``triton`` flavor and deployed with the
``mlflow deployments`` CLI, and the same ONNX file logged with ``mlflow.onnx.log_model(model,
"triton", registered_model_name=...)`` (with and without a ``config.pbtxt`` logged beside it) and
deployed with ``flavor="onnx"`` through ``get_deploy_client``.  Every answer must equal NVIDIA's
``expected_output.json`` (tests/fixtures/nvidia_mlflow_triton, NVIDIA's files unchanged).

The registry is a real ``mlflow server`` (the session's ``mlflow_server``); the environment is
mlreg's ``local`` one, a real tritonserver started once for this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.devstack.stack import stack_down, stack_up
from pipelines.triton.control import TritonControl
from registry.contracts.config import CONFIG_NAME
from registry.mlflow import MlflowRegistry
from registry.mlflow.environ import global_tracking_uri
from registry.settings import Settings
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.integration,
    # mlflow.onnx.log_model's own signature inference warns about its type hints (MLflow 3.17)
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]

EXAMPLES = ROOT / "tests" / "fixtures" / "nvidia_mlflow_triton"
EXAMPLE_MODEL = EXAMPLES / "onnx_float32_int32_int32"


@dataclass
class Project:
    settings: Settings
    registry: MlflowRegistry
    grpc_url: str
    env: dict[str, str]  # a user's shell: MLREG_HOME and MLFLOW_TRACKING_URI

    def mlflow(self, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        """The real ``mlflow`` CLI, as NVIDIA's test.sh runs it."""
        return subprocess.run(
            [sys.executable, "-m", "mlflow", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=cwd,
            env=self.env,
        )

    def serving(self, model: str) -> list[str]:
        with TritonControl(self.grpc_url) as triton:
            states = triton.model_states().get(model, {})
        return sorted((v for v, s in states.items() if s == "READY"), key=int)

    def served_config(self, model: str) -> dict[str, Any]:
        with TritonControl(self.grpc_url) as triton:
            return triton.model_config(model)

    def stored_config(self, model: str) -> Path:
        return self.settings.local_repository / model / CONFIG_NAME


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def project(mlflow_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """mlreg's local stack (a real tritonserver) on the session's real MLflow server; this process
    sees the project as a user's shell does (MLREG_HOME, MLFLOW_TRACKING_URI)."""
    home = tmp_path_factory.mktemp("nvidia") / ".mlreg"
    env = {
        "MLREG_HOME": str(home),
        "MLFLOW_TRACKING_URI": mlflow_server.url,
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    settings = Settings.from_env(env={**env, "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    status = stack_up(settings, ui=False)
    try:
        assert status.info is not None
        # os.environ and MLflow's global tracking URI as a user's shell has them, put back after
        with _environ(env), global_tracking_uri(mlflow_server.url):
            yield Project(settings, MlflowRegistry(settings), status.info.grpc_url, {**os.environ, **env})
    finally:
        stack_down(settings)


def _fluent(project: Project) -> Any:
    """MLflow's fluent API pointed at the project's registry (what NVIDIA's users call)."""
    import mlflow

    mlflow.set_tracking_uri(project.env["MLFLOW_TRACKING_URI"])
    return mlflow


def _expected() -> dict[str, Any]:
    return json.loads((EXAMPLES / "expected_output.json").read_text())


def _inputs() -> dict[str, np.ndarray]:
    """input.json's tensors as NVIDIA's Python flow sends them (float32 arrays)."""
    document = json.loads((EXAMPLES / "input.json").read_text())
    return {name: np.array(value, dtype=np.float32) for name, value in document["inputs"].items()}


def test_the_example_files_are_the_add_sub_model() -> None:
    """The expected file is what the model computes: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    import onnx
    import onnxruntime as ort

    inputs = _inputs()
    expected = _expected()["outputs"]
    np.testing.assert_array_equal(expected["OUTPUT0"], (inputs["INPUT0"] + inputs["INPUT1"]).astype(np.int32))
    np.testing.assert_array_equal(expected["OUTPUT1"], (inputs["INPUT0"] - inputs["INPUT1"]).astype(np.int32))
    onnx.checker.check_model(onnx.load(str(EXAMPLE_MODEL / "1" / "model.onnx")))
    session = ort.InferenceSession(
        str(EXAMPLE_MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs), strict=True))
    assert {k: v.tolist() for k, v in got.items()} == expected


# -- triton flavor, the mlflow deployments CLI (NVIDIA's test.sh) -------------------------------------


def _triton_flavor() -> types.ModuleType:
    """A flavor module with NVIDIA's documented ``triton`` layout: the Triton model folder copied
    under the logged model, ``MLmodel`` flavor ``triton`` with ``data`` naming the folder."""
    from mlflow.models.model import MLMODEL_FILE_NAME

    def save_model(path: str, mlflow_model: Any, triton_model_path: str) -> None:
        folder = Path(triton_model_path)
        Path(path).mkdir(parents=True)
        shutil.copytree(folder, Path(path) / folder.name)
        mlflow_model.add_flavor("triton", data=folder.name)
        mlflow_model.save(str(Path(path) / MLMODEL_FILE_NAME))

    module = types.ModuleType("triton_flavor")
    module.save_model = save_model  # type: ignore[attr-defined]
    return module


def test_triton_flavor_with_the_mlflow_cli(project: Project, tmp_path: Path) -> None:
    name = EXAMPLE_MODEL.name
    mlflow = _fluent(project)
    from mlflow.models import Model

    with mlflow.start_run():  # NVIDIA's publish_model_to_mlflow.py --flavor triton
        Model.log(
            "triton",  # the artifact path NVIDIA's script logs under
            flavor=_triton_flavor(),
            triton_model_path=str(EXAMPLE_MODEL),
            registered_model_name=name,
        )

    create = project.mlflow(
        "deployments",
        "create",
        "-t",
        "mlreg",
        "--flavor",
        "triton",
        "--name",
        name,
        "-m",
        f"models:/{name}/1",
    )
    assert create.returncode == 0, create.stderr[-3000:]
    registry = project.registry
    assert registry.models.version_tags(name, "1")["mlreg_version"] == "2"
    tags = registry.models.version_tags(name, "2")
    assert (tags["derived_from"], tags["derived_flavor"], tags["derived_config"]) == (
        "1",
        "triton",
        "model folder",
    )
    assert tags["validation"] == "passed"
    assert project.serving(name) == ["2"]
    assert registry.models.aliases(name)["local"] == "2"
    assert project.served_config(name)["max_batch_size"] == 8  # NVIDIA's config, served as logged

    listed = project.mlflow("deployments", "list", "-t", "mlreg")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert [line for line in listed.stdout.splitlines() if f"'name': '{name}'" in line and "READY" in line]

    got = project.mlflow("deployments", "get", "-t", "mlreg", "--name", name)
    assert got.returncode == 0, got.stderr[-3000:]
    assert f"\nname: {name}\n" in "\n" + got.stdout
    assert f"mlflow_model_uri: models:/{name}/1" in got.stdout
    assert "flavor: triton" in got.stdout

    output = tmp_path / "output.json"
    predict = project.mlflow(
        "deployments", "predict", "-t", "mlreg", "--name", name,
        "--input-path", str(EXAMPLES / "input.json"), "--output-path", str(output),
    )  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert json.loads(output.read_text()) == _expected()

    delete = project.mlflow("deployments", "delete", "-t", "mlreg", "--name", name)
    assert delete.returncode == 0, delete.stderr[-3000:]
    assert project.serving(name) == []
    assert not project.stored_config(name).exists()
    assert "local" not in registry.models.aliases(name)


# -- onnx flavor, the Python API (NVIDIA's plugin_test.py) ---------------------------------------------


def _deploy_and_check(project: Project, name: str) -> dict[str, Any]:
    """create, list, get, predict (== expected_output.json), as NVIDIA's flow; returns the served
    config before delete removes the deployment."""
    from mlflow.deployments import get_deploy_client

    client = get_deploy_client("mlreg")
    before = client.list_deployments()  # another test's deployment may stay (tests run in any order)
    created = client.create_deployment(name, f"models:/{name}/1", flavor="onnx")
    assert (created["flavor"], created["source_version"], created["version"]) == ("onnx", "1", "2")
    assert [d["name"] for d in client.list_deployments()].count(name) == 1
    found = client.get_deployment(name)
    assert (found["name"], found["version"], found["state"]) == (name, "2", "READY")
    assert found["mlflow_model_uri"] == f"models:/{name}/1"
    output = client.predict(name, _inputs())
    assert json.loads(json.dumps(output)) == _expected()
    # NVIDIA's input document as it is, too
    document = json.loads((EXAMPLES / "input.json").read_text())
    assert client.predict(name, document) == output
    served = project.served_config(name)
    assert project.serving(name) == ["2"]
    client.delete_deployment(name)
    assert client.list_deployments() == before  # NVIDIA's flow ends with the list it began with
    assert project.serving(name) == []
    repository = project.settings.local_repository
    assert not (repository / name).exists()  # the folder gone from the store ...
    archived = repository.parent / ".mlreg-archive" / repository.name / name
    assert sorted(p.name for p in archived.iterdir()) == ["2"]  # ... its version in the archive
    assert sorted(int(v.version) for v in project.registry.models.versions(name)) == [1, 2]  # and MLflow
    return served


def _registered_config(project: Project, name: str, version: str, dest: Path) -> str:
    project.registry.models.fetch_version(name, version, dest)
    return (dest / CONFIG_NAME).read_text()


def test_onnx_flavor_without_a_config_gets_the_config_triton_would_autocomplete(
    project: Project, tmp_path: Path
) -> None:
    import onnx

    mlflow = _fluent(project)
    mlflow.onnx.log_model(
        onnx.load(str(EXAMPLE_MODEL / "1" / "model.onnx")), "triton", registered_model_name="onnx_model"
    )

    served = _deploy_and_check(project, "onnx_model")
    # the ONNX Runtime backend's auto-complete: every tensor's first dim is variable -> batching,
    # max_batch_size = the default 4, dynamic batching on; the dims without the batch dim
    assert served["platform"] == "onnxruntime_onnx"
    assert served["max_batch_size"] == 4
    assert "dynamic_batching" in served
    tensors = {t["name"]: (t["data_type"], t["dims"]) for t in [*served["input"], *served["output"]]}
    assert tensors == {
        "INPUT0": ("TYPE_FP32", ["16"]),
        "INPUT1": ("TYPE_FP32", ["16"]),
        "OUTPUT0": ("TYPE_INT32", ["16"]),
        "OUTPUT1": ("TYPE_INT32", ["16"]),
    }
    tags = project.registry.models.version_tags("onnx_model", "2")
    assert (tags["derived_from"], tags["derived_flavor"], tags["derived_config"]) == (
        "1",
        "onnx",
        "generated",
    )
    assert project.registry.models.version_tags("onnx_model", "1")["mlreg_version"] == "2"


def test_onnx_flavor_with_a_logged_config_serves_that_config(project: Project, tmp_path: Path) -> None:
    import onnx

    mlflow = _fluent(project)
    name = "onnx_model_with_files"
    with mlflow.start_run():
        mlflow.onnx.log_model(
            onnx.load(str(EXAMPLE_MODEL / "1" / "model.onnx")), "triton", registered_model_name=name
        )
        mlflow.log_artifact(str(EXAMPLE_MODEL / CONFIG_NAME), "triton")

    served = _deploy_and_check(project, name)
    assert served["max_batch_size"] == 8  # the logged config, not the autocompleted 4
    assert "dynamic_batching" not in served
    assert (
        _registered_config(project, name, "2", tmp_path / name) == (EXAMPLE_MODEL / CONFIG_NAME).read_text()
    )
    assert project.registry.models.version_tags(name, "2")["derived_config"] == "logged"
    # deploying the same source again reuses the version made of it (same bytes): no third version
    from mlflow.deployments import get_deploy_client

    again = get_deploy_client("mlreg").create_deployment(name, f"models:/{name}/1", flavor="onnx")
    assert again["version"] == "2"
    assert sorted(int(v.version) for v in project.registry.models.versions(name)) == [1, 2]
    get_deploy_client("mlreg").delete_deployment(name)


def test_a_logged_config_that_does_not_fit_the_graph_is_refused_before_anything_serves(
    project: Project, tmp_path: Path
) -> None:
    import onnx
    from mlflow.deployments import get_deploy_client
    from mlflow.exceptions import MlflowException

    mlflow = _fluent(project)
    name = "onnx_model_bad_config"
    config = tmp_path / CONFIG_NAME
    config.write_text((EXAMPLE_MODEL / CONFIG_NAME).read_text().replace("dims: [ 16 ]", "dims: [ 8 ]", 1))
    with mlflow.start_run():
        mlflow.onnx.log_model(
            onnx.load(str(EXAMPLE_MODEL / "1" / "model.onnx")), "triton", registered_model_name=name
        )
        mlflow.log_artifact(str(config), "triton")

    with pytest.raises(
        MlflowException, match=r"(?s)is not a valid Triton model: .*INPUT0.*fix: log a config"
    ):
        get_deploy_client("mlreg").create_deployment(name, f"models:/{name}/1", flavor="onnx")
    assert project.serving(name) == []
    assert not project.stored_config(name).exists()
    assert project.registry.models.version_tags(name, "2")["validation"] == "failed"  # kept, as any export
    assert "local" not in project.registry.models.aliases(name)


EMPTY_NAMES = ["", "     ", " ", "\n", "\t", "\r", "\v", "\f"]
ESCAPING_NAMES = ["/opt/sys/", "../../etc/passwd", "../outside/repo", "test_models/../identity_py", ".."]


def test_names_that_are_empty_or_escape_the_repository_are_refused(project: Project) -> None:
    from mlflow.deployments import get_deploy_client
    from mlflow.exceptions import MlflowException

    client = get_deploy_client("mlreg")
    repository = project.settings.local_repository
    archive = repository.parent / ".mlreg-archive" / repository.name

    def where_they_lead() -> dict[str, object]:
        """What lies where each escaping name points, from the repository and from its archive (an
        absolute name: anywhere): a file's bytes, a folder's entries, or None when nothing is there."""
        found: dict[str, object] = {}
        for root, name in ((r, n) for r in (repository, archive) for n in ESCAPING_NAMES):
            path = Path(os.path.normpath(root / name))
            if path.is_file():
                found[str(path)] = path.read_bytes()
            else:
                found[str(path)] = sorted(c.name for c in path.iterdir()) if path.is_dir() else None
        return found

    before = sorted(p.name for p in repository.iterdir())
    outside = where_they_lead()
    assert outside[str(repository.parents[1] / "etc" / "passwd")] is None
    for name in EMPTY_NAMES:
        with pytest.raises(
            MlflowException, match="Model name cannot be empty. Please enter a valid name to deploy."
        ):
            client.create_deployment(name, f"models:/{name}/1", flavor="onnx")
    for name in ESCAPING_NAMES:
        message = f"Path traversal is not allowed in model's name: {name}"
        with pytest.raises(MlflowException, match=message.replace(".", r"\.")):
            client.create_deployment(name, f"models:/{name}/1", flavor="onnx")
        with pytest.raises(MlflowException, match="Path traversal is not allowed"):
            client.delete_deployment(name)
    with pytest.raises(
        MlflowException, match="(?s)flavor 'sklearn' is not deployable by mlreg.*fix: use --flavor"
    ):
        client.create_deployment("onnx_model", "models:/onnx_model/1", flavor="sklearn")
    assert sorted(p.name for p in repository.iterdir()) == before
    assert where_they_lead() == outside  # nothing written where they point either
