"""MLflow, natively: versions as MLflow Models, where they run, and `mlflow deployments -t mlreg`.

One session-scoped local stack (a real tritonserver, the embedded registry, the MLflow UI as a
real `mlflow server` on it: tests/integration/nativestack.py, its fixtures in conftest.py) serves
these tests and tests/integration/test_browser.py: the
template exported and its ensemble promoted, then image_model v2 exported (``--seed 7``) and
deployed with the real `mlflow deployments create -t mlreg` in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.core.plan import fetch_version
from pipelines.triton.control import TritonControl
from registry.contracts.config import load_config
from registry.lineage import contract_of
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from tests.conftest import TEMPLATE
from tests.integration.nativestack import NativeStack
from tests.integration.stacks import ENSEMBLE, golden

pytestmark = pytest.mark.integration


@pytest.fixture
def in_project(native_stack: NativeStack, monkeypatch: pytest.MonkeyPatch) -> NativeStack:
    """This process sees the stack's project (for the plugin's Python API)."""
    monkeypatch.setenv("MLREG_HOME", native_stack.env["MLREG_HOME"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return native_stack


def tensors(specs: list[dict]) -> list[dict]:
    """A contract's tensors as the MLmodel signature's JSON writes them."""
    dtypes = {"FP32": "float32", "INT8": "int8", "UINT8": "uint8", "STRING": "object"}
    return [
        {
            "name": t["name"],
            "type": "tensor",
            "tensor-spec": {"dtype": dtypes[t["dtype"]], "shape": tuple(t["shape"])},
        }
        for t in specs
    ]


# -- every version is an MLflow Model ----------------------------------------------------------------


def check_mlflow_model(registry: MlflowRegistry, name: str, version: str, config: Path) -> None:
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        _check_mlflow_model(registry, name, version, config)
    finally:  # mlflow.set_tracking_uri writes MLFLOW_TRACKING_URI: later modules must not inherit it
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def _check_mlflow_model(registry: MlflowRegistry, name: str, version: str, config: Path) -> None:
    import mlflow
    from mlflow.models import Model

    mlflow.set_tracking_uri(registry.uri)
    mv = registry.models.version(name, version)
    assert mv.source.startswith("models:/m-")
    model_id = mv.source.removeprefix("models:/")
    model = Model.load(f"models:/{name}/{version}")
    contract = contract_of(load_config(config))
    assert model.signature.inputs.to_dict() == tensors(contract["inputs"])
    assert model.signature.outputs.to_dict() == tensors(contract["outputs"])
    assert model.flavors["triton"]["data"] == name
    assert model.flavors["tensorflow"]["saved_model_dir"] == f"{name}/1/model"
    assert (model.model_id, model.run_id) == (model_id, mv.run_id)
    logged = registry.connection.client.get_logged_model(model_id)
    assert logged.source_run_id == mv.run_id
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": name, "version": version}]
    run = registry.connection.client.get_run(mv.run_id)
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    files = {f.path for f in mlflow.artifacts.list_artifacts(f"models:/{name}/{version}/{name}")}
    assert files == {f"{name}/config.pbtxt", f"{name}/1"}


def test_a_version_is_an_mlflow_model_with_the_config_signature_embedded(native_stack: NativeStack) -> None:
    exports = native_stack.settings.home / "v2" / "image_model"
    check_mlflow_model(native_stack.registry, "image_model", "2", exports / "config.pbtxt")


def test_a_version_is_an_mlflow_model_on_a_real_server(
    native_stack: NativeStack, mlflow_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    folder = tmp_path / "image_model"
    shutil.copytree(native_stack.settings.home / "v2" / "image_model", folder)
    registry = MlflowRegistry(Settings.from_env())
    first = register(registry, find_candidate(folder))
    assert first.created
    check_mlflow_model(registry, "image_model", first.version, folder / "config.pbtxt")
    again = register(registry, find_candidate(folder))  # idempotent by digest, as before
    assert (again.version, again.created) == (first.version, False)
    # the promotion's reader (a remote registry: no local files) gets the Triton folder back
    got, _ = fetch_version(registry.models, "image_model", first.version, tmp_path / "fetched")
    assert (got / "config.pbtxt").read_bytes() == (folder / "config.pbtxt").read_bytes()
    assert (got / first.version / "model" / "saved_model.pb").is_file()


def test_versions_registered_before_mlflow_models_are_read_as_before(
    native_stack: NativeStack, tmp_path: Path
) -> None:
    """The old layout, written as mlreg wrote it: the run holds config.pbtxt and model/."""
    registry, client = native_stack.registry, native_stack.registry.connection.client
    folder = native_stack.settings.home / "v2" / "image_model"
    run = client.create_run(registry.runs.experiment_id(), run_name="old-layout")
    client.log_artifact(run.info.run_id, str(folder / "config.pbtxt"))
    client.log_artifacts(run.info.run_id, str(folder / "1"), "model")
    client.create_registered_model("old_image_model")
    source = f"{run.info.artifact_uri}/model"
    client.create_model_version(
        "old_image_model", source, run_id=run.info.run_id, tags={"validation": "passed"}
    )
    got, tags = fetch_version(registry.models, "old_image_model", "1", tmp_path)
    assert tags["validation"] == "passed"
    assert (got / "config.pbtxt").read_bytes() == (folder / "config.pbtxt").read_bytes()
    assert (got / "1" / "model" / "saved_model.pb").is_file()


# -- where each version runs -------------------------------------------------------------------------


def test_record_deployment_tags_the_version_links_the_run_and_describes_the_model(
    mlflow_server, native_stack: NativeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    registry = MlflowRegistry(Settings.from_env())
    folder = tmp_path / "table_data_preprocess_rd"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "table_data_preprocess"', f'name: "{folder.name}"'))
    v1 = register(registry, find_candidate(folder)).version
    v2 = register(registry, find_candidate(folder), force=True).version
    runs = [registry.runs.start_run("mlreg-promotions", f"promote-{v}", {}) for v in (v1, v2)]
    registry.deployed.record_deployment(
        folder.name, v1, "staging", runs[0], ("triton-0:8001", "triton-1:8001")
    )
    registry.deployed.record_deployment(folder.name, v1, "production", runs[0], ("triton-p:8001",))
    registry.deployed.record_deployment(
        folder.name, v2, "staging", runs[1], ("triton-0:8001", "triton-1:8001")
    )

    old, new = registry.models.version(folder.name, v1).tags, registry.models.version(folder.name, v2).tags
    assert "serving_staging" not in old  # v2 replaced it in staging
    assert old["serving_production"] == "triton-p:8001"
    assert new["serving_staging"] == "triton-0:8001,triton-1:8001"
    assert new["promotion_run_staging"] == runs[1]
    assert new["promoted_staging"].endswith("Z")
    run = registry.connection.client.get_run(runs[1])
    assert run.data.tags["mlreg_model_version"] == f"models:/{folder.name}/{v2}"
    model_id = registry.models.version(folder.name, v2).source.removeprefix("models:/")
    assert [i.model_id for i in run.inputs.model_inputs] == [model_id]
    description = registry.connection.client.get_registered_model(folder.name).description
    assert f"| production | {v1} |" in description
    assert f"| staging | {v2} |" in description
    assert description.count("**Environments**") == 1
    assert set(registry.deployed.deployments(folder.name)) == {"production", "staging"}


# -- mlflow deployments -t mlreg ---------------------------------------------------------------------


def test_mlflow_deployments_create_promotes_on_the_local_stack(
    native_stack: NativeStack, deployed: subprocess.CompletedProcess[str]
) -> None:
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    assert "image_model" in deployed.stdout + deployed.stderr
    assert native_stack.serving("image_model") == ["2"]
    registry = native_stack.registry
    assert registry.models.aliases("image_model")["local"] == "2"
    assert registry.deployed.deployments("image_model")["local"]["version"] == "2"
    tags = registry.models.version("image_model", "2").tags
    assert tags["serving_local"] == native_stack.grpc_url
    assert "| local | 2 |" in registry.connection.client.get_registered_model("image_model").description


def test_get_and_list_report_what_the_environment_serves(
    in_project: NativeStack, deployed: subprocess.CompletedProcess[str]
) -> None:
    from mlflow.deployments import get_deploy_client

    got = in_project.mlflow("deployments", "get", "-t", "mlreg", "--name", "image_model")
    assert got.returncode == 0, got.stderr[-3000:]
    assert "\nversion: 2\n" in got.stdout
    assert f"serving: {{'{in_project.grpc_url}': ['2']}}" in got.stdout
    assert "environment: local" in got.stdout
    listed = {d["name"]: d for d in get_deploy_client("mlreg").list_deployments()}
    assert listed["image_model"]["desired"] == ["2"]
    # the re-pointed ensemble is a registered version of its own, served from the Triton folder of its number
    assert listed[ENSEMBLE]["serving"] == {in_project.grpc_url: [listed[ENSEMBLE]["version"]]}
    assert all(d["drift"] == [] for d in listed.values())


def test_predict_answers_the_seed_request(
    in_project: NativeStack, deployed: subprocess.CompletedProcess[str]
) -> None:
    import pandas as pd
    from mlflow.deployments import get_deploy_client

    client = get_deploy_client("mlreg")
    answer = client.predict(ENSEMBLE, golden().ensemble_inputs())
    output = np.asarray(answer["outputs"]["multi_modal_output"])
    with TritonControl(in_project.grpc_url) as triton:
        direct = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    np.testing.assert_allclose(output, direct["multi_modal_output"], rtol=1e-6)
    table = golden().model_inputs("table_data_model")
    frame = pd.DataFrame({name: list(array) for name, array in table.items()})
    scores = client.predict("table_data_model", frame)["outputs"]["table_model_output"]
    assert np.asarray(scores).shape == (len(frame), 10)


def _requests(url: str, model: str) -> int:
    """Every inference request ``model`` received on ``url`` (succeeded or failed)."""
    with TritonControl(url) as triton:
        stats = triton.statistics(model)
    counts = [s["inference_stats"][k].get("count", 0) for s in stats for k in ("success", "fail")]
    return sum(int(c) for c in counts)


def test_predict_checks_input_names_and_dtypes_against_the_deployed_config(
    in_project: NativeStack, deployed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    from mlflow.deployments import get_deploy_client
    from mlflow.exceptions import MlflowException

    client = get_deploy_client("mlreg")
    before = _requests(in_project.grpc_url, "table_data_model")
    valid = "its inputs: categorical_col_1 TYPE_FP32 [-1,3], categorical_col_2 TYPE_FP32 [-1,3]"
    with pytest.raises(MlflowException, match=rf"(?s)has no input 'nope'; {re.escape(valid)}.*fix: name"):
        client.predict("table_data_model", {"categorical_col_1": [[1, 2, 3]], "nope": [[1, 2, 3]]})
    with pytest.raises(MlflowException, match=r"needs input 'categorical_col_2', not sent"):
        client.predict("table_data_model", {"categorical_col_1": [[1, 2, 3]]})
    strings = {"categorical_col_1": [["a", "b", "c"]], "categorical_col_2": [[1, 2, 3]]}
    path = tmp_path / "strings.json"
    path.write_text(json.dumps(strings))
    done = in_project.mlflow(
        "deployments", "predict", "-t", "mlreg", "--name", "table_data_model", "--input-path", str(path)
    )
    assert done.returncode != 0
    assert (
        "error: input 'categorical_col_1' of table_data_model in 'local' is TYPE_FP32 [-1,3], "
        "but the values sent are strings (e.g. 'a')"
    ) in done.stderr
    assert "fix: send numbers for 'categorical_col_1' (dims [3] per item)" in done.stderr
    assert "TypeError" not in done.stderr
    assert "ValueError" not in done.stderr
    assert _requests(in_project.grpc_url, "table_data_model") == before  # nothing reached Triton
    assert in_project.serving("table_data_model") == ["1"]


def test_a_contract_breaking_version_is_refused_with_the_reason(
    in_project: NativeStack, deployed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 3 ]", "dims: [ 4 ]", 1))
    version = register(in_project.registry, find_candidate(folder)).version
    uri = f"models:/table_data_preprocess/{version}"
    before = _untouched(in_project)
    assert "table_data_preprocess/config.pbtxt" in before["files"]  # the snapshot sees the store
    refused = in_project.mlflow(
        "deployments", "create", "-t", "mlreg", "--name", "table_data_preprocess", "-m", uri
    )
    assert refused.returncode != 0
    assert "error: promotion of table_data_preprocess version" in refused.stderr
    assert "contract check failed" in refused.stderr
    assert "fix: " in refused.stderr
    assert _untouched(in_project) == before  # the store's configs and bytes, every alias, Triton
    assert in_project.serving("table_data_preprocess") == ["1"]
    assert in_project.registry.models.aliases("table_data_preprocess")["local"] == "1"
    assert not (in_project.settings.local_repository / "table_data_preprocess" / version).exists()


def _untouched(stack: NativeStack) -> dict[str, Any]:
    """What a refused promotion must leave alone: the store's files (configs, version files,
    manifests: sha256 each; locks and the python stub's bytecode cache left out), every alias of
    the refused model and of the ensemble that uses it, and what Triton serves of both."""
    root = stack.settings.local_repository
    files = {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".mlreg-lock.") and "__pycache__" not in p.parts
    }
    models = ("table_data_preprocess", ENSEMBLE)
    return {
        "files": files,
        "aliases": {m: stack.registry.models.aliases(m) for m in models},
        "serving": {m: stack.serving(m) for m in models},
    }


def test_dry_run_delete_and_bad_requests(
    in_project: NativeStack, deployed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    from mlflow.deployments import get_deploy_client
    from mlflow.exceptions import MlflowException

    client = get_deploy_client("mlreg")
    plan = client.create_deployment("image_model", "models:/image_model@local", config={"dry_run": "true"})
    assert (plan["dry_run"], plan["version"]) == (True, "2")
    with pytest.raises(MlflowException, match=r"(?s)used by ensemble\(s\) ensemble_multi_modal_model.*fix: "):
        client.delete_deployment("image_model")
    assert in_project.serving("image_model") == ["2"]
    with pytest.raises(MlflowException, match="(?s)unknown config key.*fix: use only"):
        client.create_deployment("image_model", "models:/image_model/2", config={"envv": "staging"})
    with pytest.raises(MlflowException, match="differs from the model URI's model 'table_data_model'"):
        client.create_deployment("image_model", "models:/table_data_model/1")
    with pytest.raises(MlflowException, match="(?s)unknown environment 'nowhere'.*fix: use one of: local"):
        client.create_deployment("image_model", "models:/image_model/2", config={"env": "nowhere"})
    # run-local: the local stack runs already, so it promotes there (a no-op: v1 serves)
    from mlreg.deployments import run_local, target_help

    run_local("mlreg", "table_data_model", "models:/table_data_model/1")
    assert in_project.serving("table_data_model") == ["1"]
    assert "models:/NAME/VERSION or models:/NAME@ALIAS" in target_help()
    # a model no ensemble uses is retired: unloaded, its desired state gone, its alias removed
    folder = tmp_path / "solo_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "table_data_preprocess"', 'name: "solo_preprocess"'))
    version = register(in_project.registry, find_candidate(folder)).version
    client.create_deployment(
        "solo_preprocess", f"models:/solo_preprocess/{version}", config={"skip_quality": "1"}
    )
    assert in_project.serving("solo_preprocess") == [version]
    client.delete_deployment("solo_preprocess")
    assert in_project.serving("solo_preprocess") == []
    assert not (in_project.settings.local_repository / "solo_preprocess" / "config.pbtxt").exists()
    assert "local" not in in_project.registry.models.aliases("solo_preprocess")
    assert "local" not in in_project.registry.deployed.deployments("solo_preprocess")
