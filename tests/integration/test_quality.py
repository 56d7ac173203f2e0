"""The quality gate on the real stack: on the canary for a promotion, on a scratch server for a dry
run; a failing version refused with nothing changed; SavedModel -> ONNX with the gate on.

One stack for the module (Triton, the embedded MLflow registry, the local store); the tests run in
file order: the ensemble's first deployment, a good swap, a refused version, the ONNX promotion.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.reports import PromotionResult, QualityStageReport
from pipelines.promote.canary_gate import PRIVATE_SUFFIX
from pipelines.triton.control import TritonControl
from registry.errors import PromotionError
from registry.register import find_candidate, register
from registry.template import BuildResult, exporter_path
from tests.conftest import TEMPLATE
from tests.integration.stacks import ENSEMBLE, MEMBERS, LocalStack, golden, local_stack, unloaded_on

pytestmark = pytest.mark.integration

MODELS = MEMBERS
LIVE_STAGES = [
    "resolve",
    "validate",
    "preflight",
    "assemble",
    "quality",
    "deploy",
    "verify",
    "finalize",
    "record",
]


Stack = LocalStack


@pytest.fixture(scope="module")
def stack(template_build: BuildResult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(template_build, tmp_path_factory.mktemp("quality") / ".mlreg") as running:
        yield running


def _gate(result: PromotionResult) -> QualityStageReport:
    """The quality stage's report, as the stage list recorded it."""
    [report] = [s.report for s in result.stages if s.stage == "quality"]
    assert isinstance(report, QualityStageReport)
    return report


def ensemble_answers(stack: Stack) -> np.ndarray:
    with TritonControl(stack.url) as triton:
        return triton.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])[
            "multi_modal_output"
        ]


def test_the_first_deployment_gates_every_member_on_the_canary(stack: Stack) -> None:
    promotion = stack.promotion()
    result = promotion.run(ENSEMBLE, "1")
    assert result.stage_names() == LIVE_STAGES
    gate = _gate(result)
    assert gate.where == f"the canary {stack.url}"
    assert sorted(gate.checked) == sorted(MODELS)  # ensembles: verify's smoke
    for model in (*MODELS, ENSEMBLE):
        assert stack.serving(model) == ["1"], model
        assert stack.registry.models.aliases(model)["local"] == "1"
    assert np.isfinite(ensemble_answers(stack)).all()


def test_a_good_version_passes_the_gate_against_the_serving_version_and_promotes(
    stack: Stack, image_model_seed7: Path
) -> None:
    exporter = exporter_path(TEMPLATE / "image_model")  # other weights: other answers, the same contract
    new = register(stack.registry, find_candidate(image_model_seed7), exporter=exporter)
    promotion = stack.promotion()
    result = promotion.run("image_model", new.version)
    assert result.stage_names() == LIVE_STAGES
    gate = _gate(result)
    assert gate.previous == {"image_model": "1"}  # asked version-specifically
    assert set(gate.changes) == {"image_model/output"}
    assert stack.serving("image_model") == [new.version]
    assert stack.registry.models.aliases("image_model")["local"] == new.version


def _nan_version(stack: Stack, tmp_path: Path) -> str:
    """table_data_preprocess whose one-hot output is NaN: it loads and answers, but insanely."""
    folder = tmp_path / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    code = folder / "1" / "model.py"
    original = "return (flat == VOCAB[np.newaxis, :]).astype(np.float32)"
    assert original in code.read_text()
    code.write_text(code.read_text().replace(original, f"{original} * np.float32('nan')"))
    return register(stack.registry, find_candidate(folder)).version


def test_a_version_with_nan_outputs_is_refused_with_nothing_changed(stack: Stack, tmp_path: Path) -> None:
    version = _nan_version(stack, tmp_path)
    before = stack.refused()
    answers = ensemble_answers(stack)
    with pytest.raises(PromotionError, match="quality gate failed on a scratch tritonserver:") as info:
        stack.promotion(dry_run=True).run("table_data_preprocess", version)  # the plan job's gate
    assert "expect_column_values_to_not_be_null" in info.value.message
    assert stack.refused() == before  # the store's objects, Triton's whole index and pins, every alias
    with pytest.raises(PromotionError, match=f"quality gate failed on the canary {stack.url}") as info:
        stack.promotion().run("table_data_preprocess", version)
    message = info.value.message
    assert "the candidates were unloaded there and their uploaded files removed" in message
    assert "table_data_preprocess/table_data_output_1: expect_column_values_to_not_be_null" in message
    assert message.endswith("nothing was changed")
    # as before but for the candidate the gate loaded on the canary and gave back (index: UNAVAILABLE)
    assert stack.refused() == unloaded_on(before, stack.url, "table_data_preprocess", version)
    np.testing.assert_array_equal(ensemble_answers(stack), answers)


def test_a_dry_run_served_as_onnx_converts_and_gates_but_registers_nothing(stack: Stack) -> None:
    saved = stack.reexport("image_model", "dry-run")
    versions = len(stack.registry.models.versions("image_model"))
    before = stack.snapshot()
    result = stack.promotion(serve_as="onnx", dry_run=True).run("image_model", saved)
    assert result.stage_names() == ["resolve", "convert", "validate", "preflight", "quality"]  # planning only
    convert = next(s for s in result.stages if s.stage == "convert")
    onnx_version = result.plan.version
    assert f"-> v{onnx_version} (ONNX)" in convert.detail
    assert "registered by the first live stage" in convert.detail
    quality = next(s for s in result.stages if s.stage == "quality")
    assert "image_model" in quality.detail  # the ONNX candidate answered on the scratch server
    assert len(stack.registry.models.versions("image_model")) == versions  # MLflow: no new version
    assert stack.snapshot() == before  # store, aliases, what serves


def test_a_savedmodel_served_as_onnx_passes_the_gate(stack: Stack) -> None:
    saved = stack.reexport("image_model", "onnx")  # v1's answers: not those of the serving version (seed 7)
    serving = stack.serving("image_model")
    promotion = stack.promotion(serve_as="onnx")
    result: PromotionResult = promotion.run("image_model", saved)
    onnx_version = result.plan.version
    assert onnx_version != saved
    # image_model has more versions in the store than the window now: archive runs before the load;
    # the ensemble, re-pointed a second time, has a third folder (one number, issue 48): its oldest
    # leaves once the alias moved (retain)
    assert result.stage_names() == [
        "resolve",
        "convert",
        "validate",
        "preflight",
        "assemble",
        "archive",
        *LIVE_STAGES[4:],
        "retain",
    ]
    [retain] = [s for s in result.stages if s.stage == "retain"]
    assert f"{ENSEMBLE} v1" in retain.detail
    gate = _gate(result)
    # the ONNX candidate answered alone, compared with the SavedModel serving version's answers
    assert gate.previous == {"image_model": serving[-1]}
    assert "image_model/output" in gate.changes
    assert stack.serving("image_model") == [onnx_version]
    assert f"image_model{PRIVATE_SUFFIX}" not in stack.states()
    assert stack.registry.models.aliases("image_model")["local"] == onnx_version
    assert np.isfinite(ensemble_answers(stack)).all()
