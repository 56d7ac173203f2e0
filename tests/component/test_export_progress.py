"""Long work shows progress (issue 48 item 3): ``mlreg export`` says which model it exports and
registers now, with how far it has come -- the lines ``mlreg.cli.progress.activity`` draws on a
terminal.  The template's python-backend models (no TensorFlow) exported into a plan
(``PlanRegistry``: nothing written) over the in-memory registry fake."""

from __future__ import annotations

from pathlib import Path

from registry.export import PlanRegistry, export, export_models
from registry.settings import Settings
from tests.fakes import FakeRegistry

MODELS = ["table_data_preprocess", "image_preprocess"]


def _plan(tmp_path: Path) -> tuple[Settings, FakeRegistry, PlanRegistry]:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / "home")})
    base = FakeRegistry(tmp_path / "registry")
    base.settings = settings  # type: ignore[attr-defined]  # what PlanRegistry reads of MlflowRegistry
    return settings, base, PlanRegistry(base)  # type: ignore[arg-type]


def test_export_says_each_model_it_exports_then_registers_with_how_far_it_is(tmp_path: Path) -> None:
    settings, base, plan = _plan(tmp_path)
    said: list[str] = []
    results = export_models(settings, plan, MODELS, on_model=said.append)
    assert said == [
        "exporting image_preprocess (1/2)",
        "exporting table_data_preprocess (2/2)",
        "registering image_preprocess (1/2)",
        "registering table_data_preprocess (2/2)",
    ]
    # what it said is what it did: both planned as version 1, nothing written to the registry
    assert [(r.model, r.version, r.created) for r in results] == [
        ("image_preprocess", "1", True),
        ("table_data_preprocess", "1", True),
    ]
    assert set(plan.models.planned) == {("image_preprocess", "1"), ("table_data_preprocess", "1")}
    assert base.tags == {}
    assert base.recorded == []


def test_export_hands_its_steps_to_the_caller_and_runs_the_same_without_one(tmp_path: Path) -> None:
    settings, _, plan = _plan(tmp_path)
    said: list[str] = []
    export(settings, plan, ["image_preprocess"], on_step=said.append)
    assert said == ["exporting image_preprocess (1/1)", "registering image_preprocess (1/1)"]
    settings, _, quiet = _plan(tmp_path / "again")
    assert [r.version for r in export(settings, quiet, ["image_preprocess"])] == ["1"]
