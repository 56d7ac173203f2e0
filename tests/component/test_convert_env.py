"""The TensorFlow processes of a conversion (pipelines/promote/convert.py): Keras' eager import skipped
only where tf_keras is absent and the operator chose nothing, and a process that hangs is stopped
with an error naming it (no promotion waits forever holding its locks)."""

from __future__ import annotations

import importlib.util

import pytest

from pipelines.promote import convert
from registry.errors import PromotionError


def test_keras_is_skipped_only_where_tf_keras_is_absent_and_the_operator_chose_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "tf_keras" else real_find_spec(name)
    )
    assert convert.tensorflow_env()["TF_USE_LEGACY_KERAS"] == "1"
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # the operator's choice stays
    assert convert.tensorflow_env()["TF_USE_LEGACY_KERAS"] == "0"
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # tf_keras installed
    assert "TF_USE_LEGACY_KERAS" not in convert.tensorflow_env()


def test_a_tensorflow_process_that_hangs_is_stopped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert, "TENSORFLOW_TIMEOUT_S", 0.5)
    with pytest.raises(PromotionError, match="the parity check did not finish within 0.5 s"):
        convert._tensorflow(["-c", "import time; time.sleep(30)"], "the parity check")
