"""The wheel, installed (not editable) into a fresh virtual environment, serves the whole local story.

The wheel is the release's: release.yml, run by act (tests/act/release.py, once per test run
and shared with tests/integration/test_release.py), builds it with `python -m build` (sdist
first, the wheel from the sdist, in an isolated environment) from a tagged copy of the checkout.
The fresh environment gets its dependencies from the project's .venv through a .pth file (no
network, no 3 GB reinstall) and mlreg itself only from the wheel (`pip install --no-deps
--no-index`).  Every command runs from a folder outside the repository, so nothing can come
from the source tree: `mlreg template build` (the packaged template), `mlreg stack up --load
ensemble_multi_modal_model` (the packaged stand-in backends), one request through the packaged
client, `mlreg stack down`.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.act.release import shared_release

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, registry, pipelines, mlreg
from registry.settings import Settings
settings = Settings.from_env()
print(json.dumps({
    "registry": registry.__file__, "pipelines": pipelines.__file__, "mlreg": mlreg.__file__,
    "template": str(settings.template_dir), "backends": str(settings.backends_source),
}))
"""


@dataclass(frozen=True)
class Installed:
    python: Path
    mlreg: Path
    site_packages: Path
    env: dict[str, str]


def run(command: list[str | Path], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(c) for c in command], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def fresh_venv(folder: Path) -> tuple[Path, Path]:
    """A venv without pip whose dependencies are the project's .venv (a .pth file, after its own)."""
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter .venv was made from
    run([base, "-m", "venv", "--without-pip", folder], dict(os.environ), folder.parent)
    python = folder / "bin" / "python"
    site_packages = Path(
        run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], {}, folder).strip()
    )
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site_packages / "mlreg-test-dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return python, site_packages


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    wheel = shared_release(tmp_path_factory).wheel
    assert wheel.is_file(), f"the release run built no wheel: {wheel}"
    python, site_packages = fresh_venv(work / "venv")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    run([*pip, "install", "--no-deps", "--no-index", "-q", wheel], dict(os.environ), work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLREG_", "PYTHON", "VIRTUAL_ENV"))}
    # the dependencies' console scripts (mlflow, moto_server) as an ordinary install would have them
    env["PATH"] = os.pathsep.join([str(python.parent), str(Path(sys.executable).parent), env["PATH"]])
    env.update(MLREG_HOME=str(work / "home"), MLREG_NO_PROGRESS="1", TF_CPP_MIN_LOG_LEVEL="3")
    return Installed(python, python.parent / "mlreg", site_packages, env)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working folder outside the repository (and outside any project marker of it)."""
    assert not tmp_path.resolve().is_relative_to(ROOT)
    return tmp_path


def test_the_installed_package_is_imported_not_the_source_tree(installed: Installed, outside: Path) -> None:
    found = json.loads(run([installed.python, "-c", PROBE], installed.env, outside))
    packaged = installed.site_packages / "registry" / "_resources"
    assert found == {
        "registry": str(installed.site_packages / "registry" / "__init__.py"),
        "pipelines": str(installed.site_packages / "pipelines" / "__init__.py"),
        "mlreg": str(installed.site_packages / "mlreg" / "__init__.py"),
        "template": str(packaged / "model_repository_template"),
        "backends": str(packaged / "backends"),
    }
    assert (packaged / "backends" / "onnxruntime" / "model.py").is_file()
    assert not list(installed.site_packages.glob("__editable__*mlreg*"))


@pytest.fixture
def stack(installed: Installed, outside: Path) -> Iterator[Installed]:
    """The installed mlreg; its stack is stopped afterwards even when the test failed half-way."""
    yield installed
    subprocess.run([installed.mlreg, "stack", "down"], env=installed.env, cwd=outside, timeout=120)


def test_template_build_stack_up_and_one_request_from_the_wheel(stack: Installed, outside: Path) -> None:
    repository = Path(stack.env["MLREG_HOME"]) / "model_repository"
    built = run([stack.mlreg, "template", "build", repository], stack.env, outside)
    assert "built 6 models" in built
    assert (repository / "table_data_model" / "1" / "model" / "model.onnx").is_file()

    # --no-ui: the MLflow UI is no package data, and its server takes ~10 s to start
    run([stack.mlreg, "stack", "up", "--load", "ensemble_multi_modal_model", "--no-ui"], stack.env, outside)
    status = json.loads(run([stack.mlreg, "stack", "status", "--json"], stack.env, outside))
    assert status["repository"] == str(repository)
    assert "ensemble_multi_modal_model:1" in status["loaded"]

    client = stack.site_packages / "registry/_resources/model_repository_template/multi_modal_client.py"
    answer = run([stack.python, client, "--url", status["grpc_url"]], stack.env, outside)
    match = re.fullmatch(r"\[\[\s*(\S+)\]\]", answer.strip())
    assert match, f"the client printed {answer!r}, not one [[value]]"
    assert math.isfinite(float(match[1]))

    stopped = run([stack.mlreg, "stack", "down"], stack.env, outside, timeout=120)
    assert f"stopped replica-0: tritonserver (pid {status['pid']})" in stopped
