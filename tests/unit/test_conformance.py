"""`mlreg validate` on the conformance corpus: each case's verdict, field and Triton's wording.

The same corpus is loaded on a real tritonserver by tests/integration/test_conformance_triton.py,
which asserts that Triton's verdict is the one written beside each case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.contracts.validate import validate_path
from tests.conformance.corpus import Case, load_cases, materialize

CASES = load_cases()
GPUS = 0  # the local tritonserver's machine has none: the corpus states Triton's verdicts there


def test_the_corpus_covers_every_rule_family() -> None:
    names = {c.name.split("_")[0] for c in CASES}
    assert {
        "instance",
        "dynamic",
        "sequence",
        "batch",
        "ensemble",
        "empty",
        "runtime",
        "auto",
        "onnx",
    } <= names
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_mlreg_verdict_matches_the_corpus(case: Case, tmp_path: Path) -> None:
    materialize(case, tmp_path)
    report = validate_path(tmp_path, gpus=GPUS)
    errors = report.errors
    if case.mlreg == "accept":
        assert errors == [], [f.line() for f in errors]
        return
    assert errors, f"{case.name}: mlreg accepts what Triton rejects"
    lines = [f.line() for f in errors]
    assert any(case.message in line for line in lines), lines
    assert any(case.names in line for line in lines if case.message in line)
    beyond_triton = case.verdict == "accept"
    assert all((f.origin == "mlreg") == beyond_triton for f in errors if case.message in f.line())
