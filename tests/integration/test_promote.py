"""Promotion on the real stack: Triton, the embedded MLflow registry, the local store.

The tests run in file order on one module-scoped stack, like an operator's day: first deployment
of the whole ensemble, a swap under traffic, a breaking version refused, a version that fails to
load rolled back, a killed promotion, contention and unreachable parts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipelines.promote.environments import environment
from pipelines.promote.plan import serving_versions
from pipelines.promote.runner import Options, Promotion
from pipelines.promote.status import model_status
from pipelines.stack import stack_down, stack_up
from pipelines.storage import open_store
from pipelines.triton import TritonControl
from registry.errors import MlregError, PromotionError
from registry.export import export_models
from registry.mlflow_registry import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from tests.conftest import ROOT, TEMPLATE, failing_python_model
from tests.integration.test_serving import ENSEMBLE, golden

pytestmark = pytest.mark.integration

FAILING_INIT = failing_python_model("cannot open the vocabulary file")


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    url: str
    env_vars: dict[str, str]
    log: Path

    def instance_starts(self, model: str) -> int:
        """How many instances of ``model`` (any version) the server has initialized so far."""
        return self.log.read_text(errors="replace").count(f"ModelInstanceInitialize: {model}_")

    def promote(self, model: str, version: str, **options: object) -> object:
        env = environment(self.settings, "local")
        return Promotion(self.settings, env, self.registry, Options(**options)).run(model, version)

    def serving(self, model: str) -> list[str]:
        with TritonControl(self.url) as triton:
            return sorted(
                (v for v, s in triton.model_states().get(model, {}).items() if s == "READY"), key=int
            )

    def desired(self, model: str) -> list[str]:
        return serving_versions(open_store(self.settings.local_repository).read_config(model))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("promote") / ".mlreg"
    env_vars = {"MLREG_HOME": str(home)}
    settings = Settings.from_env(env={**env_vars, "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    status = stack_up(settings, ui=False)
    registry = MlflowRegistry(settings)
    try:
        export_models(settings, registry)
        assert status.info is not None
        yield Stack(settings, registry, status.info.grpc_url, env_vars, Path(status.info.log_path))
    finally:
        stack_down(settings)


def test_first_deployment_promotes_the_ensemble_and_its_members(stack: Stack) -> None:
    result = stack.promote(ENSEMBLE, "1")
    assert [s["stage"] for s in result.stages] == [
        "resolve",
        "validate",
        "quality",
        "assemble",
        "deploy",
        "verify",
        "finalize",
        "record",
    ]
    for model in (
        "table_data_preprocess",
        "table_data_model",
        "image_preprocess",
        "image_model",
        "multi_modal_model",
        ENSEMBLE,
    ):
        assert stack.serving(model) == ["1"], model
        assert stack.registry.aliases(model)["local"] == "1"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert out["multi_modal_output"].shape == (1, 1)
    again = stack.promote(ENSEMBLE, "1")
    assert [s["stage"] for s in again.stages] == ["noop"]  # the fast path: nothing was touched


class Traffic:
    """Ensemble requests from 4 threads while a promotion runs; every answer counted."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "failed": 0}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.send) for _ in range(4)]

    def send(self) -> None:
        inputs = golden().ensemble_inputs()
        with TritonControl(self.url, timeout=30) as triton:
            deadline = time.monotonic() + 300
            while not self.stop.is_set() and time.monotonic() < deadline:
                try:
                    triton.infer(ENSEMBLE, inputs, ["multi_modal_output"])
                    key = "ok"
                except MlregError as exc:
                    key = "failed"
                    self.errors.append(exc.message)
                with self.lock:
                    self.counts[key] += 1

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1)
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_a_new_version_swaps_in_under_traffic_with_no_failed_request(stack: Stack) -> None:
    [new] = export_models(stack.settings, stack.registry, ["image_model"], seed=7)
    assert new.version == "2"
    with Traffic(stack.url) as traffic:
        before = traffic.counts["ok"]
        starts = stack.instance_starts("image_model")
        stack.promote("image_model", "2", skip_quality=True)
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > before > 0
    # one instance started: the new version's; the old one kept serving without being loaded
    # again (Triton reloads every version when the model folder gains an entry: see storage/base)
    assert stack.instance_starts("image_model") == starts + 1
    assert stack.serving("image_model") == ["2"]
    assert stack.desired("image_model") == ["2"]
    assert stack.registry.aliases("image_model")["local"] == "2"
    ensemble = open_store(stack.settings.local_repository).read_config(ENSEMBLE)
    assert 'model_name: "image_model"\n    model_version: 2' in ensemble


def test_status_compares_an_ensembles_pins_with_its_alias(stack: Stack) -> None:
    env = environment(stack.settings, "local")
    [row] = model_status(stack.settings, env, stack.registry, [ENSEMBLE])
    assert row["drift"] == []  # the re-pointed ensemble was registered with the pins it serves
    assert row["pins"]["image_model"] == "2"
    store = open_store(stack.settings.local_repository)
    serving = store.read_config(ENSEMBLE)
    pinned = 'model_name: "image_model"\n    model_version: 2'
    store.write_config(ENSEMBLE, serving.replace(pinned, pinned[:-1] + "1"))
    try:
        [row] = model_status(stack.settings, env, stack.registry, [ENSEMBLE])
    finally:
        store.write_config(ENSEMBLE, serving)
    assert row["drift"] == [f"alias local=v{row['alias']} pins image_model v2, the store's config pins v1"]


def test_a_contract_breaking_version_is_refused_before_any_change(stack: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 3 ]", "dims: [ 4 ]", 1))
    version = register(stack.registry, find_candidate(folder)).version
    store_before = open_store(stack.settings.local_repository).read_config("table_data_preprocess")
    with pytest.raises(PromotionError, match="(?s)contract check failed:.*nothing was changed") as info:
        stack.promote("table_data_preprocess", version)
    assert "table_data_output_1" in info.value.message
    assert open_store(stack.settings.local_repository).read_config("table_data_preprocess") == store_before
    assert stack.serving("table_data_preprocess") == ["1"]
    assert stack.registry.aliases("table_data_preprocess")["local"] == "1"


def _failing_version(stack: Stack, tmp_path: Path) -> str:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    (folder / "1" / "model.py").write_text(FAILING_INIT)
    return register(stack.registry, find_candidate(folder)).version


def test_the_quality_gate_catches_a_model_that_cannot_load(stack: Stack, tmp_path: Path) -> None:
    version = _failing_version(stack, tmp_path)
    with pytest.raises(PromotionError, match="cannot open the vocabulary file") as info:
        stack.promote("table_data_preprocess", version)
    assert "nothing was changed" in info.value.message
    assert stack.serving("table_data_preprocess") == ["1"]


def test_the_quality_gate_judges_outputs_against_declared_ranges_and_the_serving_version(
    stack: Stack,
    tmp_path: Path,
) -> None:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    code = folder / "1" / "model.py"
    original = "return (flat == VOCAB[np.newaxis, :]).astype(np.float32)"
    assert original in code.read_text()
    code.write_text(code.read_text().replace(original, f"return 2 * {original.removeprefix('return ')}"))
    version = register(stack.registry, find_candidate(folder)).version
    with pytest.raises(PromotionError, match="quality gate failed") as info:
        stack.promote("table_data_preprocess", version)
    message = info.value.message
    assert (
        "table_data_preprocess/table_data_output_1: expect_column_values_to_be_between "
        "min_value=0.0, max_value=1.0 failed" in message
    )
    assert "changed by up to 1 against serving v1, declared tolerance 0.0" in message
    assert stack.serving("table_data_preprocess") == ["1"]


def test_a_version_that_fails_to_load_is_rolled_back(stack: Stack, tmp_path: Path) -> None:
    version = _failing_version(stack, tmp_path)  # same bytes: the version registered above
    with pytest.raises(PromotionError, match="rolled back, the previous versions serve") as info:
        stack.promote("table_data_preprocess", version, skip_quality=True)
    result = info.value.context["result"]
    assert [s["stage"] for s in result.stages][-2:] == ["deploy", "rollback"]
    assert stack.serving("table_data_preprocess") == ["1"]
    assert stack.desired("table_data_preprocess") == ["1"]
    assert stack.registry.aliases("table_data_preprocess")["local"] == "1"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(out["multi_modal_output"]).all()


def _cli(stack: Stack, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlreg", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **stack.env_vars},
        **kwargs,
    )  # type: ignore[call-overload]


def test_an_unknown_version_is_refused_with_one_json_document(stack: Stack) -> None:
    """Also the race behind it: MLflow imported by the warm-up thread and the lookup at once."""
    with _cli(stack, "promote", "image_model", "--version", "99", "--json") as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err  # RegistryError
    document = json.loads(out)
    assert document["ok"] is False
    assert "Model Version (name=image_model, version=99) not found" in document["error"]
    assert document["fix"] == "check the name and version ('mlreg versions MODEL')"
    assert "Traceback" not in err


def test_a_killed_promotion_leaves_a_consistent_state_and_a_rerun_completes(stack: Stack) -> None:
    [v3] = export_models(stack.settings, stack.registry, ["image_model"], seed=11)
    rng = random.Random(7)
    for attempt in range(2):
        with _cli(
            stack, "promote", "image_model", "--version", v3.version, "--skip-quality", start_new_session=True
        ) as proc:
            time.sleep(rng.uniform(2.0, 6.0))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        rows = model_status(
            stack.settings, environment(stack.settings, "local"), stack.registry, ["image_model", ENSEMBLE]
        )
        image = rows[0]
        live = image["serving"][stack.url]
        assert live, f"attempt {attempt}: nothing serves image_model"
        assert set(live) <= {"2", v3.version}
        with TritonControl(stack.url) as triton:
            triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    with _cli(stack, "promote", "image_model", "--version", v3.version, "--skip-quality", "--json") as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["ok"] is True
    assert stack.serving("image_model") == [v3.version]


def test_a_savedmodel_served_as_onnx(stack: Stack) -> None:
    [saved] = export_models(stack.settings, stack.registry, ["image_model"], seed=12)
    with Traffic(stack.url) as traffic:  # the platform changes: no overlap, ensembles follow -1
        result = stack.promote("image_model", saved.version, serve_as="onnx", skip_quality=True)
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > 0
    stages = {s["stage"]: s["detail"] for s in result.stages}
    onnx_version = result.plan.version
    assert onnx_version != saved.version
    assert f"image_model v{saved.version} (SavedModel) -> v{onnx_version} (ONNX)" in stages["convert"]
    assert stack.serving("image_model") == [onnx_version]
    store = open_store(stack.settings.local_repository)
    assert 'platform: "onnxruntime_onnx"' in store.read_config("image_model")
    assert (stack.settings.local_repository / "image_model" / onnx_version / "model.onnx").is_file()
    assert f"model_version: {onnx_version}" in store.read_config(ENSEMBLE)
    mv = stack.registry.version("image_model", onnx_version)
    assert mv.tags["derived_from"] == saved.version
    assert mv.tags["platform"] == "onnxruntime_onnx"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(out["multi_modal_output"]).all()


def test_rollback_returns_to_the_previous_promotion(stack: Stack) -> None:
    from pipelines.promote.status import history

    promoted = [h["to"] for h in history(stack.registry, "image_model", "local") if h["result"] == "promoted"]
    current, previous = promoted[0], promoted[1]
    assert stack.serving("image_model") == [current]
    with _cli(stack, "rollback", "image_model", "--json") as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["plan"]["version"] == previous
    assert stack.serving("image_model") == [previous]
    assert stack.registry.aliases("image_model")["local"] == previous
    with TritonControl(stack.url) as triton:
        triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])


def test_two_concurrent_promotions_of_one_model(stack: Stack) -> None:
    holder = (
        "import sys, time\nfrom pipelines.storage import open_store\n"
        "with open_store(sys.argv[1]).lock('image_model', owner='ci-job-41@elsewhere:1'):\n"
        "    print('locked', flush=True); time.sleep(20)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder, str(stack.settings.local_repository)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout.readline().strip() == "locked"
            with pytest.raises(MlregError, match="model 'image_model' is locked by ci-job-41@elsewhere:1"):
                stack.promote("image_model", "2", skip_quality=True)
        finally:
            proc.kill()


def test_unreachable_parts_are_refused_before_any_change(stack: Stack, tmp_path: Path) -> None:
    from pipelines.local_triton import free_port
    from registry.errors import RegistryError, StorageError, TritonError

    before = stack.serving("image_model")
    toml = stack.settings.home.parent / "mlreg.toml"
    toml.write_text(
        f'[environments.dead]\nstore = "{stack.settings.local_repository}"\n'
        f'targets = ["127.0.0.1:{free_port()}"]\nalias = "dead"\n'
        f'[environments.nostore]\nstore = "s3://127.0.0.1:{free_port()}/b/p"\n'
        f'targets = ["{stack.url}"]\nalias = "nostore"\n'
    )
    try:
        for env_name, error in (("dead", TritonError), ("nostore", StorageError)):
            env = environment(stack.settings, env_name)
            with pytest.raises(error):
                Promotion(stack.settings, env, stack.registry, Options(skip_quality=True)).run(
                    "image_model", "2"
                )
        offline = Settings.from_env(
            env={
                **stack.env_vars,
                "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
                "MLREG_MLFLOW_TIMEOUT": "2",
            }
        )
        with pytest.raises(RegistryError, match="check the tracking server"):
            Promotion(
                offline, environment(offline, "local"), MlflowRegistry(offline), Options(skip_quality=True)
            ).run("image_model", "2")
    finally:
        toml.unlink()
    assert stack.serving("image_model") == before
