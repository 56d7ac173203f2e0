"""Where the template and the stand-in backends come from in a source checkout.

(The installed wheel's packaged copies: tests/integration/test_wheel.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import resources
from registry.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_reads_the_source_folders() -> None:
    assert resources.packaged_dir("model_repository_template") is None  # nothing is built into the tree
    assert resources.template_dir() == ROOT / "model_repository_template"
    assert resources.backends_dir() == ROOT / "infra" / "backends"
    assert (resources.backends_dir() / "onnxruntime" / "model.py").is_file()


def test_settings_default_to_them_and_mlreg_template_dir_wins(tmp_path: Path) -> None:
    default = Settings.from_env(env={"MLREG_HOME": str(tmp_path)}, cwd=tmp_path)
    assert default.template_dir == ROOT / "model_repository_template"
    assert default.backends_source == ROOT / "infra" / "backends"
    chosen = Settings.from_env(
        env={"MLREG_HOME": str(tmp_path), "MLREG_TEMPLATE_DIR": str(tmp_path)}, cwd=tmp_path
    )
    assert chosen.template_dir == tmp_path.resolve()


def test_an_unknown_resource_is_a_programming_error() -> None:
    with pytest.raises(KeyError, match="models"):
        resources.resource_dir("models")
