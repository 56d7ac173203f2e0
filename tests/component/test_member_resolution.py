"""An ensemble's ``-1`` (latest) member resolves to the newest version that passed validation (issue
48): a newer version that failed validation -- ``register --allow-invalid`` records one -- no longer
blocks the ensemble, and the plan says which version it chose and what it passed over.

The registry is MLflow's own (``BACKGROUND``: versions created through the client with the tags
``register`` writes), and the resolution runs against it there, through the real adapter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.component.conftest import SCRATCH, Background, Finished

ROOT = Path(__file__).resolve().parents[2]
RESOLVE = r"""
import json
from pathlib import Path
from pipelines.core.plan import member_version_of
from registry.errors import MlregError
from registry.mlflow import MlflowRegistry
from registry.settings import Settings

registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(Path.cwd() / "home")}))
client = registry.connection.client
for model, results in (("iris_onnx", ["passed", "passed", "failed"]), ("scaler", ["failed", "failed"]),
                       ("unchecked", ["passed", None])):
    client.create_registered_model(model)
    for result in results:
        tags = {} if result is None else {"validation": result}
        client.create_model_version(model, source=str(Path.cwd()), tags=tags)
answers = {}
for member, pinned in (("iris_onnx", "-1"), ("iris_onnx", "3"), ("unchecked", "-1"), ("scaler", "-1")):
    try:
        found = member_version_of(registry.models, "iris_pipeline", member, pinned)
        answers[f"{member}@{pinned}"] = list(found)
    except MlregError as exc:
        answers[f"{member}@{pinned}"] = {"error": exc.message, "fix": exc.fix}
print(json.dumps(answers))
"""
BACKGROUND = {
    "resolve": Background([sys.executable, "-c", RESOLVE], cwd=SCRATCH, env={"PYTHONPATH": str(ROOT)})
}


@pytest.fixture
def answers(background: Finished) -> dict[str, Any]:
    proc = background("resolve")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_latest_member_is_the_newest_version_that_passed_validation(answers: dict[str, Any]) -> None:
    version, notes = answers["iris_onnx@-1"]
    assert version == "2"  # version 3 failed validation
    assert notes == [
        "iris_pipeline: member iris_onnx at version -1 (latest) is version 2, the newest that passed "
        "validation; newer version 3 failed validation"
    ]


def test_a_version_with_no_validation_tag_is_not_taken_for_a_failed_one(answers: dict[str, Any]) -> None:
    version, notes = answers["unchecked@-1"]
    assert version == "2"
    assert notes == [
        "iris_pipeline: member unchecked at version -1 (latest) is version 2, the newest that passed "
        "validation"
    ]


def test_a_pinned_member_is_the_pinned_version_and_needs_no_note(answers: dict[str, Any]) -> None:
    """A pin names its version: failed or not, fetch_version judges it (and refuses a failed one)."""
    assert answers["iris_onnx@3"] == ["3", []]


def test_a_member_whose_every_version_failed_is_refused_naming_them(answers: dict[str, Any]) -> None:
    refusal = answers["scaler@-1"]
    assert refusal["error"] == (
        "ensemble member 'scaler' of iris_pipeline has no registered version that passed validation "
        "(version 2, 1 failed validation)"
    )
    assert "register a version of scaler that passes 'mlreg validate'" in refusal["fix"]
