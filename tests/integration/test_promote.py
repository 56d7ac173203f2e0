"""Promotion on the real stack: Triton, the embedded MLflow registry, the local store.

The tests run in file order on one module-scoped stack, like an operator's day: first deployment
of the whole ensemble, a swap under traffic, a breaking version refused, a version that fails to
load rolled back, a killed promotion, contention and unreachable parts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.cli.main import app
from mlreg.ops.context import environment
from mlreg.ops.status import model_status
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.storage.base import lock_key
from pipelines.triton.control import TritonControl
from registry.errors import MlregError, PromotionError
from registry.mlflow import MlflowRegistry
from registry.register import find_candidate, register
from registry.settings import Settings
from registry.template import BuildResult
from tests.cli import CliRunner
from tests.conftest import ROOT, TEMPLATE, failing_python_model
from tests.integration import forkcli
from tests.integration.stacks import (
    ENSEMBLE,
    MODELS,
    TEARDOWN_GRACE,
    LocalStack,
    golden,
    local_stack,
    mlreg_process,
    paused_mlreg,
    registry_tags,
    unloaded_on,
)
from tests.integration.traffic import Traffic

pytestmark = pytest.mark.integration

FAILING_INIT = failing_python_model("cannot open the vocabulary file")


Stack = LocalStack


@pytest.fixture(scope="module")
def stack(template_build: BuildResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(template_build, tmp_path_factory.mktemp("promote") / ".mlreg") as running:
        yield running


def test_first_deployment_promotes_the_ensemble_and_its_members(stack: Stack) -> None:
    result = stack.promote(ENSEMBLE, "1")
    names = result.stage_names()
    assert "quality" in names  # before or after the upload: see pipelines/checks/golden.py
    assert [n for n in names if n != "quality"] == [
        "resolve",
        "validate",
        "preflight",
        "assemble",
        "deploy",
        "verify",
        "finalize",
        "record",
    ]
    assert names.index("quality") < names.index("deploy")
    for model in (
        "table_data_preprocess",
        "table_data_model",
        "image_preprocess",
        "image_model",
        "multi_modal_model",
        ENSEMBLE,
    ):
        assert stack.serving(model) == ["1"], model
        assert stack.registry.models.aliases(model)["local"] == "1"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert out["multi_modal_output"].shape == (1, 1)
    again = stack.promote(ENSEMBLE, "1")
    assert again.stage_names() == ["noop", "repair"]  # the fast path: nothing was touched


def ensemble_traffic(url: str) -> Traffic:
    """Ensemble requests from 4 threads while a promotion runs; every answer counted."""
    inputs = golden().ensemble_inputs()
    return Traffic([url] * 4, lambda triton, _: triton.infer(ENSEMBLE, inputs, ["multi_modal_output"]))


def test_a_new_version_swaps_in_under_traffic_with_no_failed_request(stack: Stack) -> None:
    assert stack.reexport("image_model", "2") == "2"
    with ensemble_traffic(stack.url) as traffic:
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
    assert stack.registry.models.aliases("image_model")["local"] == "2"
    ensemble = open_store(stack.settings.local_repository).read_config(ENSEMBLE)
    assert 'model_name: "image_model"\n    model_version: 2' in ensemble


def test_status_compares_an_ensembles_pins_with_its_alias(stack: Stack) -> None:
    env = environment(stack.settings, "local")
    [row] = model_status(stack.settings, env, stack.registry, [ENSEMBLE])
    assert row["drift"] == []  # the re-pointed ensemble was registered with the pins it serves
    assert row["pins"]["image_model"] == "2"
    # one number (issue 48): registered as a new version, it serves from the Triton folder of that
    # number -- the version a client asks Triton for is the version MLflow shows
    re_pointed = row["alias"]
    assert re_pointed != "1"
    assert (row["desired"], row["desired_folders"]) == ([re_pointed], [re_pointed])
    assert (row["serving"], row["serving_folders"]) == ({stack.url: [re_pointed]}, {stack.url: [re_pointed]})
    store = open_store(stack.settings.local_repository)
    serving = store.read_config(ENSEMBLE)
    pinned = 'model_name: "image_model"\n    model_version: 2'
    store.session.write_config(ENSEMBLE, serving.replace(pinned, pinned[:-1] + "1"))
    try:
        [row] = model_status(stack.settings, env, stack.registry, [ENSEMBLE])
    finally:
        store.session.write_config(ENSEMBLE, serving)
    assert row["drift"] == [
        f"alias local=v{row['alias']} pins image_model v2, the store's config pins v1",
        f"{stack.url} pins image_model v2, the store's config pins v1",  # what the server has loaded
    ]
    assert row["desired"] == ["1"]  # the store's config now pins what registered v1 pins
    assert row["serving"] == {stack.url: [re_pointed]}
    assert row["target_pins"] == {stack.url: row["target_pins"][stack.url]}
    assert row["target_pins"][stack.url]["image_model"] == "2"


def test_a_contract_breaking_version_is_refused_before_any_change(stack: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 3 ]", "dims: [ 4 ]", 1))
    version = register(stack.registry, find_candidate(folder)).version
    before = stack.refused()
    with pytest.raises(PromotionError, match="(?s)contract check failed:.*nothing was changed") as info:
        stack.promote("table_data_preprocess", version)
    assert "inconsistent shape" in info.value.message
    assert "table_data_preprocess" in info.value.message
    assert stack.refused() == before  # the store's objects, Triton's whole index and pins, every alias
    assert stack.serving("table_data_preprocess") == ["1"]
    assert stack.registry.models.aliases("table_data_preprocess")["local"] == "1"


def _failing_version(stack: Stack, tmp_path: Path) -> str:
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    (folder / "1" / "model.py").write_text(FAILING_INIT)
    return register(stack.registry, find_candidate(folder)).version


def test_the_quality_gate_catches_a_model_that_cannot_load(stack: Stack, tmp_path: Path) -> None:
    version = _failing_version(stack, tmp_path)
    before = stack.refused()
    with pytest.raises(PromotionError, match="cannot open the vocabulary file") as info:
        stack.promote("table_data_preprocess", version)
    assert "nothing was changed" in info.value.message
    # the store's objects, every alias, Triton's pins as they were; its index lists the candidate
    # the gate loaded on the canary and gave back, nothing else
    assert stack.refused() == unloaded_on(before, stack.url, "table_data_preprocess", version)


ONE_HOT = "return (flat == VOCAB[np.newaxis, :]).astype(np.float32)"  # table_data_preprocess's answer


def _preprocess_version(stack: Stack, tmp_path: Path, answer: str) -> str:
    """A new registered version of table_data_preprocess whose one-hot line is ``answer``."""
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    code = folder / "1" / "model.py"
    assert ONE_HOT in code.read_text()
    code.write_text(code.read_text().replace(ONE_HOT, answer))
    return register(stack.registry, find_candidate(folder)).version


def test_the_quality_gate_judges_outputs_against_declared_ranges_and_the_serving_version(
    stack: Stack,
    tmp_path: Path,
) -> None:
    version = _preprocess_version(stack, tmp_path, f"return 2 * {ONE_HOT.removeprefix('return ')}")
    before = stack.refused()
    with pytest.raises(PromotionError, match="quality gate failed") as info:
        stack.promote("table_data_preprocess", version)
    message = info.value.message
    assert (
        "table_data_preprocess/table_data_output_1: expect_column_values_to_be_between "
        "min_value=0.0, max_value=1.0 failed" in message
    )
    assert "changed by up to 1 against serving v1, declared tolerance 0.0" in message
    assert stack.refused() == unloaded_on(before, stack.url, "table_data_preprocess", version)  # gated


def test_a_version_that_fails_to_load_is_rolled_back(stack: Stack, tmp_path: Path) -> None:
    """... and the ensemble version ``deploy`` registered for the re-pointed config before the
    load (one number, issue 48 item 5) is deleted from MLflow: its versions are as before."""
    version = _failing_version(stack, tmp_path)  # same bytes: the version registered above
    ensembles = registry_tags(stack.registry)[ENSEMBLE]
    with pytest.raises(PromotionFailed, match="rolled back, the previous versions serve") as info:
        stack.promote("table_data_preprocess", version, skip_quality=True)
    result = info.value.result
    assert result.stage_names()[-2:] == ["deploy", "rollback"]
    assert registry_tags(stack.registry)[ENSEMBLE] == ensembles  # the version it registered, deleted
    assert f"{ENSEMBLE} v" in info.value.message
    assert "(registered by this promotion) deleted" in info.value.message
    assert stack.serving("table_data_preprocess") == ["1"]
    assert stack.desired("table_data_preprocess") == ["1"]
    assert stack.registry.models.aliases("table_data_preprocess")["local"] == "1"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(out["multi_modal_output"]).all()


def test_a_failure_after_the_repoint_rolls_back_under_traffic_with_no_failed_ensemble_request(
    stack: Stack, tmp_path: Path
) -> None:
    """verify fails after the ensemble was re-pointed to the new member: the undo log restores the
    ensemble first (it follows the serving member), then the member, then the ensemble's pin; no
    ensemble request fails meanwhile, and the store, aliases and servers are as before."""
    version = _preprocess_version(stack, tmp_path, f"{ONE_HOT} * np.float32('nan')")
    before = stack.snapshot()
    ensemble_before = open_store(stack.settings.local_repository).read_config(ENSEMBLE)
    with (
        ensemble_traffic(stack.url) as traffic,
        pytest.raises(PromotionFailed, match="answered non-finite values") as info,
    ):
        stack.promote("table_data_preprocess", version, skip_quality=True)
    result = info.value.result
    assert result.stage_names()[-3:] == ["deploy", "verify", "rollback"]
    assert result.rolled_back
    deploy = next(s for s in result.stages if s.stage == "deploy")
    assert ENSEMBLE in deploy.detail  # the ensemble had been re-pointed before the failure
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > 0
    assert stack.snapshot() == before  # store bytes (the upload removed), aliases, what serves
    assert open_store(stack.settings.local_repository).read_config(ENSEMBLE) == ensemble_before
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(out["multi_modal_output"]).all()


def _cli(stack: Stack, *args: str, env_extra: dict[str, str] | None = None) -> forkcli.Process:
    return mlreg_process({**stack.env_vars, **(env_extra or {})}, *args)


def _run_cli(stack: Stack, *args: str, timeout: float = 300) -> tuple[int, str, str]:
    with _cli(stack, *args) as proc:
        out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def test_an_unknown_version_is_refused_with_one_json_document(stack: Stack) -> None:
    """Refused before MLflow's client is opened (the embedded registry's file answers); also the
    race behind it: MLflow imported by the warm-up thread while the lookup runs."""
    with _cli(stack, "promote", "image_model", "--version", "99", "--json") as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err  # RegistryError
    document = json.loads(out)
    assert document["ok"] is False
    # refused from the registry alone (the embedded registry's file), naming the versions it has
    assert "image_model version '99' is not a registered version" in document["error"]
    assert document["fix"].startswith("image_model has versions ")
    assert document["fix"].endswith("check the name and version ('mlreg versions MODEL')")
    assert "Traceback" not in err


def _paused_cli(stack: Stack, point: str, *args: str, sig: int = signal.SIGKILL) -> tuple[int, str]:
    """Run ``mlreg`` until the test hook pauses it at ``point``, then send ``sig``: SIGKILL to its
    process group (a crash), or SIGINT/SIGTERM to the mlreg process alone (an operator).  Returns
    the exit code and what it wrote on stderr."""
    with paused_mlreg(stack.env_vars, point, *args) as paused:
        if sig == signal.SIGKILL:
            paused.kill()
            return paused.process.returncode, "".join(paused.lines)
        paused.process.send_signal(sig)
        return paused.finish(150)


def _promoted_tags(stack: Stack) -> dict[tuple[str, str], str]:
    """Every version of the member and the ensemble carrying a promoted_local tag, and its value."""
    return {
        (model, str(found.version)): dict(found.tags or {})["promoted_local"]
        for model in ("table_data_preprocess", ENSEMBLE)
        for found in stack.registry.models.find_by_tag(model, "promoted_local", "%", like=True)
    }


@pytest.mark.parametrize(
    ("sig", "point", "code"),
    [
        (signal.SIGINT, f"loaded:{ENSEMBLE}", 130),  # after the ensemble was re-pointed
        (signal.SIGTERM, "loaded:table_data_preprocess", 143),  # after the member loaded
        (signal.SIGHUP, f"alias-moved:{ENSEMBLE}", 129),  # a closed SSH session, every alias moved
        (signal.SIGINT, "alias-moved:table_data_preprocess", 130),  # the member's alias moved only
        (signal.SIGTERM, "gate:table_data_preprocess", 143),  # the candidate loaded on the canary
    ],
)
def test_an_interrupted_promotion_puts_back_what_it_changed_and_says_so(
    stack: Stack, tmp_path: Path, sig: int, point: str, code: int
) -> None:
    """SIGINT, SIGTERM and SIGHUP, sent for real to the mlreg process mid-deploy, with the candidate
    on the canary, or right after an alias moved: the undo log replays (aliases and tags, then the
    ensemble, then the member), the exit code is 128 + the signal, and the message says what was
    restored."""
    version = _preprocess_version(stack, tmp_path, f"{ONE_HOT}  # {signal.Signals(sig).name} {point}")
    before, tags = stack.snapshot(), _promoted_tags(stack)
    runs = len(stack.registry.runs.promotions("table_data_preprocess", "local"))
    gate = () if point.startswith("gate:") else ("--skip-quality",)  # the gate runs where it pauses
    args = ("promote", "table_data_preprocess", "--version", version, *gate)
    returncode, err = _paused_cli(stack, point, *args, sig=sig)
    assert returncode == code, err
    name = signal.Signals(sig).name
    assert f"failed: interrupted ({name}); rolled back, the previous versions serve (restored " in err
    assert "nothing was changed" not in err
    assert "Traceback" not in err
    assert stack.snapshot() == before  # what serves, the store's configs and bytes, the aliases
    assert _promoted_tags(stack) == tags  # and every version's promoted_local tag
    [latest, *_] = stack.registry.runs.promotions("table_data_preprocess", "local")
    assert len(stack.registry.runs.promotions("table_data_preprocess", "local")) == runs + 1
    assert (latest["to"], latest["result"]) == (version, "rolled back")  # MLflow has the attempt


def _status_tells_the_truth(stack: Stack, models: list[str]) -> dict[str, dict[str, Any]]:
    """status agrees with the store's configs, Triton and the MLflow alias, whatever the drift."""
    rows = {
        r["model"]: r
        for r in model_status(stack.settings, environment(stack.settings, "local"), stack.registry, models)
    }
    for model, row in rows.items():
        assert row["desired_folders"] == stack.desired(model), model
        assert row["serving_folders"] == {stack.url: stack.serving(model)}, model
        assert row["alias"] == stack.registry.models.aliases(model)["local"], model
        if model != ENSEMBLE:  # one numbering: a model's registered version is its Triton folder
            assert (row["desired"], row["serving"]) == (row["desired_folders"], row["serving_folders"])
    return rows


def test_a_promotion_killed_at_known_points_leaves_a_true_status_and_a_rerun_completes(stack: Stack) -> None:
    v3 = stack.reexport("image_model", "3")
    args = ("promote", "image_model", "--version", v3, "--skip-quality")
    store = open_store(stack.settings.local_repository)
    # 1. after the upload: the bytes are in the store, nothing else changed
    _paused_cli(stack, "uploaded", *args)
    assert store.versions.read_manifest("image_model", v3) is not None
    assert stack.desired("image_model") == ["2"]
    rows = _status_tells_the_truth(stack, ["image_model", ENSEMBLE])
    assert rows["image_model"]["drift"] == []
    assert stack.registry.models.aliases("image_model")["local"] == "2"
    # 2. after the config write: the store wants both versions, Triton still serves the old one
    _paused_cli(stack, "config-written:image_model", *args)
    assert stack.desired("image_model") == ["2", v3]
    assert stack.serving("image_model") == ["2"]
    rows = _status_tells_the_truth(stack, ["image_model", ENSEMBLE])
    assert f"{stack.url} serves v2, store wants v2,{v3}" in rows["image_model"]["drift"]
    assert stack.registry.models.aliases("image_model")["local"] == "2"  # recorded last: not moved yet
    # 3. between the loads: the model loaded, the ensemble not re-pointed yet
    _paused_cli(stack, "loaded:image_model", *args)
    assert stack.serving("image_model") == ["2", v3]
    assert 'model_name: "image_model"\n    model_version: 2' in (store.read_config(ENSEMBLE) or "")
    _status_tells_the_truth(stack, ["image_model", ENSEMBLE])
    assert stack.registry.models.aliases("image_model")["local"] == "2"
    with TritonControl(stack.url) as triton:  # the ensemble never stopped answering
        triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    # the crashed holders' locks are stale: a rerun takes them over and completes
    with _cli(stack, *args, "--json") as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["ok"] is True
    assert stack.serving("image_model") == [v3]
    assert stack.registry.models.aliases("image_model")["local"] == v3
    rows = _status_tells_the_truth(stack, ["image_model", ENSEMBLE])
    assert rows["image_model"]["drift"] == []
    assert rows[ENSEMBLE]["drift"] == []


def test_a_savedmodel_served_as_onnx(stack: Stack) -> None:
    saved = stack.reexport("image_model", "saved")
    with ensemble_traffic(stack.url) as traffic:  # the platform changes: no overlap, ensembles follow -1
        result = stack.promote("image_model", saved, serve_as="onnx", skip_quality=True)
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > 0
    stages = {s.stage: s.detail for s in result.stages}
    onnx_version = result.plan.version
    assert onnx_version != saved
    assert f"image_model v{saved} (SavedModel) -> v{onnx_version} (ONNX)" in stages["convert"]
    assert stack.serving("image_model") == [onnx_version]
    store = open_store(stack.settings.local_repository)
    assert 'platform: "onnxruntime_onnx"' in store.read_config("image_model")
    assert (stack.settings.local_repository / "image_model" / onnx_version / "model.onnx").is_file()
    assert f"model_version: {onnx_version}" in store.read_config(ENSEMBLE)
    mv = stack.registry.models.version("image_model", onnx_version)
    assert mv.tags["derived_from"] == saved
    assert mv.tags["platform"] == "onnxruntime_onnx"
    with TritonControl(stack.url) as triton:
        out = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(out["multi_modal_output"]).all()


def test_rollback_returns_to_the_previous_promotion(stack: Stack) -> None:
    promoted = [
        h["to"] for h in stack.registry.runs.promotions("image_model", "local") if h["result"] == "promoted"
    ]
    current, previous = promoted[0], promoted[1]
    assert stack.serving("image_model") == [current]
    with _cli(stack, "rollback", "image_model", "--json") as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["plan"]["version"] == previous
    assert stack.serving("image_model") == [previous]
    assert stack.registry.models.aliases("image_model")["local"] == previous
    with TritonControl(stack.url) as triton:
        triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])


def test_two_concurrent_promotions_of_one_model(stack: Stack) -> None:
    holder = (
        "import sys, time\nfrom pipelines.storage import open_store\n"
        "with open_store(sys.argv[1]).session.lock('image_model', owner='ci-job-41@elsewhere:1'):\n"
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
            # a version that does not serve: a real promotion (a no-op takes no lock, by design)
            version = "2" if stack.serving("image_model") != ["2"] else "1"
            before = stack.refused()
            with pytest.raises(MlregError, match="model 'image_model' is locked by ci-job-41@elsewhere:1"):
                stack.promote("image_model", version, skip_quality=True)
            assert stack.refused() == before
        finally:
            proc.kill()
            # the holder "elsewhere" is gone for good: its lock would stand until it expires (and
            # refuse the module's later promotions of image_model, whatever this test's outcome)
            open_store(stack.settings.local_repository).objects.delete(lock_key("image_model"))


def test_unreachable_parts_are_refused_before_any_change(stack: Stack, tmp_path: Path) -> None:
    from pipelines.devstack.local_triton import free_port
    from registry.errors import RegistryError, StorageError, TritonError

    # a version that does not serve: a no-op asks no replica to load anything, nor MLflow to write
    version = "2" if stack.serving("image_model") != ["2"] else "1"
    before = stack.refused()
    toml = stack.settings.home.parent / "mlreg.toml"
    toml.write_text(
        f'[environments.dead]\nstore = "{stack.settings.local_repository}"\n'
        f'targets = ["127.0.0.1:{free_port()}"]\nalias = "dead"\n'
        f'[environments.nostore]\nstore = "s3://127.0.0.1:{free_port()}/b/p"\n'
        f'targets = ["{stack.url}"]\nalias = "nostore"\n'
    )
    try:
        for env_name, error, match in (
            ("dead", TritonError, "failed on 127.0.0.1:"),
            ("nostore", StorageError, "127.0.0.1"),
        ):
            env = environment(stack.settings, env_name)
            with pytest.raises(error, match=match):
                Promotion(stack.settings, env, stack.registry, Options(skip_quality=True)).run(
                    "image_model", version
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
            ).run("image_model", version)
    finally:
        toml.unlink()
    assert stack.refused() == before


# -- the CLI, end to end ---------------------------------------------------------------------------


def _run_env(stack: Stack, *args: str, env_extra: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``mlreg`` as a user runs it: a new process (the promotions end to end)."""
    with _cli(stack, *args, env_extra=env_extra) as proc:
        out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def _mlreg(stack: Stack, *args: str, env_extra: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``mlreg`` in this process (typer's runner), for the read-only and bad-input calls: the same
    exit code and output, without the seconds a new interpreter spends importing mlreg."""
    result = CliRunner().invoke(app, list(args), env={**stack.env_vars, **(env_extra or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: the CLI let an exception escape
    assert "Traceback" not in result.stderr, result.stderr
    return result.exit_code, result.stdout, result.stderr


def test_cli_status_and_history_and_their_bad_input(stack: Stack) -> None:
    code, out, err = _mlreg(stack, "status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["drift"] is False
    rows = {r["model"]: r for r in doc["models"]}
    assert rows["image_model"]["serving"] == {stack.url: stack.serving("image_model")}
    assert rows["image_model"]["alias"] == stack.registry.models.aliases("image_model")["local"]
    code, out, err = _mlreg(stack, "status", "image_model")
    assert code == 0, err
    assert "image_model" in out
    assert stack.url in out
    code, out, err = _mlreg(stack, "status", "--env", "nowhere")
    assert code == 2
    assert "error: unknown environment 'nowhere'" in err
    code, out, err = _mlreg(stack, "history", "image_model", "--json")
    assert code == 0, err
    latest = json.loads(out)["promotions"][0]
    # the newest move may be test_rollback_returns_to_the_previous_promotion's: history names it
    assert latest["result"] in ("promoted", "rolled back")  # (issue 48), never an attempt's word
    assert [latest["to"]] == stack.serving("image_model")
    code, out, err = _mlreg(stack, "history", "image_model")
    assert code == 0, err
    assert latest["run_id"] in out
    code, out, err = _mlreg(stack, "history", "no_such_model")
    assert code == 4
    assert "error: model 'no_such_model' is not registered in MLflow" in err


def test_status_counts_unreachable_parts_and_missing_folders_as_drift(stack: Stack, tmp_path: Path) -> None:
    from pipelines.devstack.local_triton import free_port

    folder = (
        stack.settings.local_repository / "table_data_preprocess" / stack.desired("table_data_preprocess")[0]
    )
    shutil.move(folder, tmp_path / "aside")
    try:
        code, out, err = _mlreg(stack, "status", "table_data_preprocess", "--json")
    finally:
        shutil.move(tmp_path / "aside", folder)
    assert code == 1, err
    [row] = json.loads(out)["models"]
    assert (
        f"the store has no folder table_data_preprocess/{folder.name}/ for the version its config serves"
        in (row["drift"])
    )
    offline = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}", "MLREG_MLFLOW_TIMEOUT": "2"}
    code, out, err = _mlreg(stack, "status", "image_model", "--json", env_extra=offline)
    assert code == 1, err
    [row] = json.loads(out)["models"]
    assert any(line.startswith("MLflow unreachable: ") for line in row["drift"]), row
    port = free_port()
    toml = stack.settings.home.parent / "mlreg.toml"
    toml.write_text(
        f'[environments.dead]\nstore = "{stack.settings.local_repository}"\n'
        f'targets = ["127.0.0.1:{port}", "{stack.url}"]\nalias = "local"\n'
    )
    try:
        code, out, err = _mlreg(stack, "status", "image_model", "--env", "dead")
    finally:
        toml.unlink()
    assert code == 1, err
    assert f"image_model drift: 127.0.0.1:{port} unreachable: " in out
    assert f"image_model drift: {stack.url}" not in out  # the live target agrees


def test_cli_promote_dry_run_plans_and_changes_nothing(stack: Stack) -> None:
    before = stack.refused()
    args = ("promote", "image_model", "--version", "1", "--dry-run", "--serve-as", "native", "--skip-quality")
    code, out, err = _mlreg(stack, *args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [s["stage"] for s in doc["stages"]] == [
        "resolve",
        "validate",
        "preflight",
    ]  # stops before "assemble"
    assert doc["plan"]["steps"][0]["model"] == "image_model"
    assert doc["plan"]["steps"][0]["version"] == "1"
    code, out, err = _mlreg(stack, *args)
    assert code == 0, err
    assert "plan (dry run) for image_model v1 in 'local'" in out
    assert stack.refused() == before
    code, out, err = _mlreg(stack, "promote", "image_model", "--version", "1", "--serve-as", "tensorrt")
    assert code == 2
    assert "error: unknown --serve-as 'tensorrt'" in err
    assert stack.refused() == before


def test_cli_allow_breaking_lets_a_breaking_version_through(stack: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "solo_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "table_data_preprocess"', 'name: "solo_preprocess"'))
    v1 = register(stack.registry, find_candidate(folder)).version
    code, _, err = _run_env(stack, "promote", "solo_preprocess", "--version", v1, "--skip-quality")
    assert code == 0, err
    config.write_text(config.read_text().replace("max_batch_size: 256", "max_batch_size: 128"))
    v2 = register(stack.registry, find_candidate(folder)).version
    before = stack.refused()
    code, _, err = _run_env(stack, "promote", "solo_preprocess", "--version", v2, "--skip-quality")
    assert code == 8
    assert f"solo_preprocess version {v2} breaks the contract of the serving version" in err
    assert "fix: promote with --allow-breaking" in err
    assert stack.refused() == before  # the store's objects, every alias, Triton's whole index and pins
    assert stack.serving("solo_preprocess") == [v1]
    code, _, err = _run_env(
        stack, "promote", "solo_preprocess", "--version", v2, "--skip-quality", "--allow-breaking"
    )
    assert code == 0, err
    assert stack.serving("solo_preprocess") == [v2]


def test_cli_rollback_to_a_version(stack: Stack) -> None:
    before = stack.refused()
    code, out, err = _mlreg(stack, "rollback", "image_model", "--to-version", "two")
    assert code == 2
    assert "error: --to-version 'two' is not a positive version number" in err
    assert stack.refused() == before
    target = "1" if stack.serving("image_model") == ["2"] else "2"
    code, out, err = _run_env(stack, "rollback", "image_model", "--to-version", target, "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["version"] == target
    assert stack.serving("image_model") == [target]
    assert stack.registry.models.aliases("image_model")["local"] == target


def test_two_promotions_of_two_members_of_one_ensemble_never_take_it_down(stack: Stack) -> None:
    """Two real CLI processes at once, twice: both applied or one refused cleanly (the ensemble's
    lock), the ensemble answering all along and status without drift after each."""
    table_v2 = stack.reexport("table_data_model", "2")
    with ensemble_traffic(stack.url) as traffic:
        for attempt in range(2):
            image = "1" if stack.serving("image_model") != ["1"] else "2"
            table = table_v2 if stack.serving("table_data_model") != [table_v2] else "1"
            procs = [
                _cli(stack, "promote", "image_model", "--version", image, "--skip-quality", "--json"),
                _cli(stack, "promote", "table_data_model", "--version", table, "--skip-quality", "--json"),
            ]
            outcomes = []
            for proc in procs:
                out, err = proc.communicate(timeout=300)
                outcomes.append((proc.returncode, out, err))
            assert 0 in [code for code, _, _ in outcomes], outcomes
            for (code, _, err), model, version in zip(
                outcomes, ("image_model", "table_data_model"), (image, table), strict=True
            ):
                assert "Traceback" not in err
                if code == 0:
                    assert stack.serving(model) == [version], attempt
                else:  # refused cleanly: before any change, by the lock the other one holds
                    assert code == 5, err
                    assert f"model '{ENSEMBLE}' is locked by" in err
                    assert stack.serving(model) != [version]
            rows = _status_tells_the_truth(stack, ["image_model", "table_data_model", ENSEMBLE])
            assert all(r["drift"] == [] for r in rows.values()), rows
            pins = rows[ENSEMBLE]["pins"]
            assert [pins["image_model"]] == stack.serving("image_model")
            assert [pins["table_data_model"]] == stack.serving("table_data_model")
    assert traffic.counts["failed"] == 0, traffic.errors[:3]
    assert traffic.counts["ok"] > 0


def test_a_promotion_to_an_s3_store(stack: Stack, s3_server: Any, tmp_path: Path) -> None:
    """A second Triton on an S3 repository (moto_server): the environment 's3' of mlreg.toml.  Its
    first promotion is also the proof that Triton loads the whole template from S3 and answers the
    seed request (once a test of its own in test_triton_control.py, the same load twice)."""
    from pipelines.devstack import local_s3, local_triton
    from pipelines.storage import ensure_root

    local_s3.create_bucket(s3_server.endpoint, "promote")
    uri = s3_server.store_uri("promote", "repo")
    ensure_root(uri)
    info, process = local_triton.start_server(  # locked to the suite's key, as production replicas are
        uri, tmp_path / "triton", stack.settings.backends_source, control_key=os.environ["MLREG_CONTROL_KEY"]
    )
    toml = stack.settings.home.parent / "mlreg.toml"
    toml.write_text(
        f'[environments.s3]\nstore = "{uri}"\ntargets = ["{info.grpc_url}"]\nalias = "s3"\ngpu = false\n'
    )
    try:
        code, out, err = _run_env(
            stack, "promote", ENSEMBLE, "--version", "1", "--env", "s3", "--skip-quality"
        )
        assert code == 0, err
        store = open_store(uri)
        for model in MODELS:
            assert serving_versions(store.read_config(model)) == ["1"], model
            assert stack.registry.models.aliases(model)["s3"] == "1", model
        assert store.versions.read_manifest("image_model", "1") is not None
        with TritonControl(info.grpc_url) as triton:
            assert triton.model_states()["image_model"] == {"1": "READY"}
            out_s3 = triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
        assert out_s3["multi_modal_output"].shape == (1, 1)
        assert np.isfinite(out_s3["multi_modal_output"]).all()
        code, out, err = _run_env(
            stack, "promote", "image_model", "--version", "2", "--env", "s3", "--skip-quality"
        )
        assert code == 0, err
        code, out, err = _mlreg(stack, "status", "--env", "s3", "--json")
        assert code == 0, err
        rows = {r["model"]: r for r in json.loads(out)["models"]}
        assert rows["image_model"]["serving"] == {info.grpc_url: ["2"]}
        assert rows["image_model"]["desired"] == ["2"]
    finally:
        toml.unlink()
        local_triton.stop_pid(info.pid, info.shm_prefix, grace=TEARDOWN_GRACE, process=process)


def test_an_ensemble_version_whose_pins_differ_from_what_serves_is_promoted_not_a_noop(
    stack: Stack, tmp_path: Path
) -> None:
    """A member's promotion re-points the ensemble into its own folder (the registered version's
    number: one number); promoting the ensemble's registered v1, whose pins are the first
    deployment's, brings v1's folder and those member versions back."""
    from pipelines.core.plan import ensemble_pins

    store = open_store(stack.settings.local_repository)
    member = _preprocess_version(stack, tmp_path / "member", f"{ONE_HOT}  # re-points the ensemble")
    stack.promote("table_data_preprocess", member, skip_quality=True)
    (tmp_path / "registered").mkdir()
    stack.registry.models.fetch_version(ENSEMBLE, "1", tmp_path / "registered")
    registered = ensemble_pins((tmp_path / "registered" / "config.pbtxt").read_text())
    assert ensemble_pins(store.read_config(ENSEMBLE) or "") != registered  # members moved since
    newest = str(max(int(v.version) for v in stack.registry.models.versions(ENSEMBLE)))
    assert stack.desired(ENSEMBLE) == [newest]  # the re-pointed version, in the folder of its number
    result = stack.promote(ENSEMBLE, "1", skip_quality=True)
    assert result.stage_names()[0] != "noop"
    assert ensemble_pins(store.read_config(ENSEMBLE) or "") == registered
    for member, version in registered.items():
        assert stack.serving(member) == [version], member
    assert stack.registry.models.aliases(ENSEMBLE)["local"] == "1"
    assert stack.promote(ENSEMBLE, "1").stage_names() == ["noop", "repair"]  # now it is
