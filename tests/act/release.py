"""release.yml run by act end to end against a local package index, shared by the tests that need it.

The project under test is a scratch git repository holding what a release builds from (the
packages, the template, setup.py, pyproject.toml, README.md, CHANGELOG.md, infra/, .github/) with a
``v<version>`` tag, as a clone of the tagged commit would.  A real ``pypiserver`` on 127.0.0.1
stands in for PyPI: it holds the build backend ``python -m build`` installs into its isolated
environment (the setuptools wheel pyproject.toml's build-system asks for, fetched once into
``~/.cache/mlreg/release-index``) and receives the upload.  act runs the workflow's jobs on this
machine with pip pointed at that index alone (``PIP_CONFIG_FILE=/dev/null``, ``PIP_INDEX_URL``),
installing mlreg alone (``PIP_NO_DEPS``: its dependencies are the project's .venv).

What is real: the tag check, ``python -m build`` (isolated, sdist then wheel from the sdist), twine
check, check-wheel-contents, the wheel installed and run, the upload (twine, to pypiserver), a
fresh environment installing ``mlreg==<version>`` from the index and running it, the release notes
from CHANGELOG.md.  Local stand-ins (tests/act/*/action.yml say what each does and does not do):
setup-python (a fresh venv whose dependencies are the project's .venv, mlreg left out), the
artifact actions, pypi-publish (no OIDC, no attestations: twine to the local index),
setup-buildx/login/build-push (no container engine: the Dockerfile and the build inputs checked
offline and a CycloneDX SBOM made; nothing built or pushed), attest-build-provenance (checks the
subject, attests nothing), and ``gh`` on PATH (records the release instead of creating it).

A run is made once per test run however many modules or pytest-xdist workers ask
(``shared_release``): tests/integration/test_release.py checks it, test_wheel.py serves the wheel
it built.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.act.harness import ACT, GIT, ROOT, STANDINS, VENV_BIN, ActRun, local_repositories
from tests.conftest import once_per_run

WORKFLOW = "release.yml"
OWNER = "acme"  # the scratch repository's GitHub owner: the image is ghcr.io/acme/mlreg
SOURCES = ("mlreg", "registry", "pipelines", "model_repository_template", "infra", ".github")
FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "CHANGELOG.md")
RELEASE_STANDINS = {
    **STANDINS,
    "actions/setup-python": "setup-python-fresh",  # a runner's fresh Python, not the project's .venv
    "actions/download-artifact": "download-artifact",
    "pypa/gh-action-pypi-publish": "pypi-publish",
    "docker/setup-buildx-action": "setup-buildx",
    "docker/login-action": "docker-login",
    "docker/build-push-action": "build-push",
    "actions/attest-build-provenance": "attest-build-provenance",
}
INDEX_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlreg" / "release-index"
NO_INDEX = "http://127.0.0.1:9"  # the discard port: nothing answers


def release_script() -> ModuleType:
    """infra/release.py, the workflow's helper (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("mlreg_release_script", ROOT / "infra" / "release.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_version() -> str:
    """The version as the workflow reads it (registry/__init__.py, without importing it)."""
    return str(release_script().package_version(ROOT))


@dataclass
class ReleaseRun:
    root: Path
    act: ActRun
    version: str

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def index(self) -> Path:
        """pypiserver's packages folder."""
        return self.root / "index"

    @property
    def wheel(self) -> Path:
        return self.artifacts / "dist" / f"mlreg-{self.version}-py3-none-any.whl"

    def save(self) -> None:
        record = {"returncode": self.act.returncode, "seconds": self.act.seconds, "records": self.act.records}
        (self.root / "act.json").write_text(json.dumps(record))

    @classmethod
    def load(cls, root: Path, version: str) -> ReleaseRun:
        saved = json.loads((root / "act.json").read_text())
        return cls(root, ActRun(saved["returncode"], saved["seconds"], saved["records"]), version)


def project(repo: Path, tag: str) -> None:
    """The scratch repository: what the release builds from, committed and tagged."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".mlreg", "*.egg-info")
    for name in SOURCES:
        shutil.copytree(ROOT / name, repo / name, ignore=skip)
    for name in FILES:
        shutil.copy2(ROOT / name, repo / name)
    (repo / ".gitignore").write_text("__pycache__/\n*.egg-info/\nbuild/\ndist/\n.mlreg/\n")
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=repo, check=True)
    # act names the repository (github.repository, repository_owner) after the origin remote
    origin = f"https://github.com/{OWNER}/mlreg.git"
    subprocess.run(["git", "remote", "add", "origin", origin], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "release"], cwd=repo, check=True)
    subprocess.run([*GIT, "tag", tag], cwd=repo, check=True)


def dependencies_view(folder: Path) -> Path:
    """A folder of links to the project's .venv site-packages, mlreg's own entries (the editable
    install's metadata and finder) left out: a fresh environment's dependencies, without mlreg."""
    import sysconfig

    folder.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.startswith(("mlreg-", "mlreg.", "__editable__")) or entry.suffix == ".pth":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def build_backend() -> list[Path]:
    """The wheels of pyproject.toml's build-system requirements (setuptools), from the package index
    pip is configured with, once per machine: what PyPI serves an isolated build on a runner."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    folder = INDEX_CACHE / "-".join(sorted(r.replace(">", "").replace("=", "") for r in requires))
    if not list(folder.glob("*.whl")):
        folder.mkdir(parents=True, exist_ok=True)
        pip = [str(VENV_BIN / "python"), "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, "-q", "-d", str(folder), *requires], check=True, timeout=300)
    return sorted(folder.glob("*.whl"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def package_index(packages: Path, log: Path) -> Iterator[str]:
    """pypiserver on 127.0.0.1 serving ``packages`` and taking uploads (no authentication, no
    fallback to PyPI); its URL, the server stopped at exit."""
    port = _free_port()
    command = [str(VENV_BIN / "pypi-server"), "run", "-i", "127.0.0.1", "-p", str(port), "-a", ".", "-P", "."]
    command += ["--disable-fallback", "--log-file", str(log), str(packages)]
    with open(log.with_suffix(".out"), "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/simple/", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"pypiserver did not start: {log.with_suffix('.out').read_text()}"
                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def act(root: Path, repo: Path, tag: str, index: str) -> ActRun:
    """release.yml's jobs for a push of ``tag``, pip and the publish stand-in pointed at ``index``."""
    event = root / "event.json"
    owner = {"login": OWNER, "name": OWNER}
    repository = {"name": "mlreg", "full_name": f"{OWNER}/mlreg", "owner": owner}
    event.write_text(json.dumps({"ref": f"refs/tags/{tag}", "repository": repository}))
    command = [str(ACT), "push", "-W", f".github/workflows/{WORKFLOW}", "-e", str(event)]
    command += ["-P", "ubuntu-latest=-self-hosted", "--no-cache-server", "--json"]
    command += local_repositories(WORKFLOW, RELEASE_STANDINS)
    (root / "home").mkdir(exist_ok=True)
    env = {
        "PATH": f"{ROOT / 'tests' / 'act' / 'bin'}:/usr/local/bin:/usr/bin:/bin",  # gh: the stand-in
        "HOME": str(root / "home"),
        "MLREG_ACT_ARTIFACTS": str(root / "artifacts"),
        "MLREG_ACT_VENV": str(VENV_BIN.parent),
        "MLREG_ACT_DEPS": str(dependencies_view(root / "deps")),
        "MLREG_ACT_INDEX": index,
        "PIP_CONFIG_FILE": os.devnull,  # this machine's pip settings (other indexes) left out
        "PIP_INDEX_URL": f"{index}/simple/",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # the dependencies are .venv's (the setup-python stand-in); pip resolving mlreg's against
        # its ~500 distributions costs ~3 s of CPU per install, twice a run: mlreg alone is installed
        "PIP_NO_DEPS": "1",
        "PIP_NO_INPUT": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    began = time.perf_counter()
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - began
    records: list[dict[str, object]] = []
    for line in done.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"msg": line})
    records += [{"msg": line} for line in done.stderr.splitlines()]
    return ActRun(done.returncode, seconds, records)


def run_release(root: Path, version: str) -> ReleaseRun:
    """The whole workflow for the tag ``v<version>``, against a fresh local index."""
    tag = f"v{version}"
    project(root / "repo", tag)
    packages = root / "index"
    packages.mkdir()
    for wheel in build_backend():
        shutil.copy2(wheel, packages / wheel.name)
    with package_index(packages, root / "pypiserver.log") as url:
        return ReleaseRun(root, act(root, root / "repo", tag, url), version)


_RUNS: dict[Path, ReleaseRun] = {}


def shared_release(tmp_path_factory: pytest.TempPathFactory) -> ReleaseRun:
    """The release run of this test run: made by the first asker, read by the others."""
    key = tmp_path_factory.getbasetemp()
    if key not in _RUNS:
        version = package_version()
        with once_per_run(tmp_path_factory, "release") as (folder, first):
            if first:
                run_release(folder, version).save()
            _RUNS[key] = ReleaseRun.load(folder, version)
    return _RUNS[key]
