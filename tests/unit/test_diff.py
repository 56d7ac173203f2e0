"""Contract diff between two versions of a model, checked against the ensembles using it."""

from __future__ import annotations

import shutil
from pathlib import Path

from mlreg.cli.main import app
from registry.contracts.config import load_config
from registry.contracts.diff import diff_configs, diff_model
from registry.contracts.repository import read_repository
from tests.cli import CliRunner


def config(repository: Path, model: str):
    return load_config(repository / model / "config.pbtxt")


def test_identical_versions_have_no_change(standin_repository: Path) -> None:
    old = config(standin_repository, "image_model")
    assert diff_configs(old, old) == []


def test_classifies_each_kind_of_change(standin_repository: Path) -> None:
    old = config(standin_repository, "table_data_model")
    new = config(standin_repository, "table_data_model")
    new.input[0].dims[0] = -1  # input widened: compatible
    new.input[1].data_type = 2  # TYPE_UINT8: breaking
    new.output.add(name="extra", data_type=11, dims=[1])  # new output: compatible
    new.max_batch_size = 512  # larger batches: compatible
    lines = [c.line() for c in diff_configs(old, new)]
    assert lines == [
        "compatible: reshaped 'categorical_col_1': [-1,3] -> [-1,-1]",
        "breaking: retyped 'categorical_col_2': FP32 -> UINT8",
        "compatible: output-added 'extra': - -> TYPE_FP32 [-1,1]",
        "compatible: max-batch-size: 256 -> 512",
    ]


def test_removed_output_and_new_input_are_breaking(standin_repository: Path) -> None:
    old = config(standin_repository, "multi_modal_model")
    new = config(standin_repository, "multi_modal_model")
    new.input.add(name="mask", data_type=11, dims=[10])
    del new.output[:]
    kinds = {(c.kind, c.tensor, c.impact) for c in diff_configs(old, new)}
    assert kinds == {("input-added", "mask", "breaking"), ("output-removed", "output", "breaking")}


def test_a_reshaped_output_breaks_the_ensemble_that_uses_it(standin_repository: Path) -> None:
    old = config(standin_repository, "image_model")
    new = config(standin_repository, "image_model")
    new.output[0].dims[0] = 12
    result = diff_model(old, new, read_repository(standin_repository))
    assert result.breaking
    [finding] = result.ensemble_findings
    assert finding.model == "ensemble_multi_modal_model"
    assert (
        "in ensemble ensemble_multi_modal_model, ensemble tensor image_model_output: inconsistent "
        "shape: [-1,12] is inferred from model image_model while [-1,10] is inferred from model "
        "multi_modal_model" in finding.message
    )


def test_cli_diff_exit_codes(standin_repository: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    same = runner.invoke(
        app, ["diff", str(standin_repository / "image_model"), str(standin_repository / "image_model")]
    )
    assert same.exit_code == 0
    assert same.output.strip() == "image_model: 0 change(s), compatible"
    candidate = tmp_path / "image_model"
    shutil.copytree(standin_repository / "image_model", candidate, ignore=shutil.ignore_patterns("1"))
    text = (candidate / "config.pbtxt").read_text().replace("data_type: TYPE_FP32", "data_type: TYPE_FP16", 1)
    (candidate / "config.pbtxt").write_text(text)
    broken = runner.invoke(
        app, ["diff", str(standin_repository / "image_model"), str(candidate), "-r", str(standin_repository)]
    )
    assert broken.exit_code == 1
    assert "breaking: retyped 'image': FP32 -> FP16" in broken.output
    assert "image_model: 1 change(s), breaking" in broken.output
    usage = runner.invoke(app, ["diff", str(tmp_path / "nope"), str(candidate)])
    assert usage.exit_code == 2
    assert "is neither a config.pbtxt nor a model folder holding one" in usage.output
