"""release.yml, run by act end to end against a local package index (tests/act/release.py).

A push of the tag ``v<version>``: the distributions are built once and checked, published to the
local pypiserver standing in for PyPI (the publish action is a stand-in: twine, no OIDC, no
attestations), installed back from that index into a fresh environment that runs ``mlreg
--version`` and ``mlreg validate``; the image step is validated offline (no container engine
here: nothing is built or pushed), and the release notes are CHANGELOG.md's section.  Then a tag
that does not name the package's version: the build fails naming both, and nothing is published.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.act.release import (
    NO_INDEX,
    OWNER,
    ReleaseRun,
    act,
    project,
    shared_release,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

JOBS = ("build", "publish", "verify", "image", "release")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> ReleaseRun:
    return shared_release(tmp_path_factory)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _job_lines(run: ReleaseRun, job: str) -> str:
    return "\n".join(str(r.get("msg", "")) for r in run.act.records if r.get("jobID") == job)


def test_a_version_tag_builds_once_checks_and_publishes_to_the_index(release: ReleaseRun) -> None:
    results = {job: release.act.job_result(job) for job in JOBS}
    assert results == dict.fromkeys(JOBS, "success"), release.act.output[-6000:]
    assert release.act.returncode == 0
    version = release.version
    build = _job_lines(release, "build")
    assert f"version={version}" in build  # the tag check's output
    assert "Creating isolated environment" in build  # python -m build, as on a runner
    assert "Building wheel from sdist" in build
    assert re.search(rf"Checking dist/mlreg-{re.escape(version)}\.tar\.gz: \S*PASSED", build)
    assert re.search(rf"Checking dist/mlreg-{re.escape(version)}-py3-none-any\.whl: \S*PASSED", build)
    assert f"dist/mlreg-{version}-py3-none-any.whl: OK" in build  # check-wheel-contents
    assert f"mlreg {version}" in build  # the installed wheel's --version
    # what the index holds is byte for byte what the build job made and checked
    built = {p.name: _sha256(p) for p in (release.artifacts / "dist").iterdir()}
    published = {p.name: _sha256(p) for p in release.index.glob("mlreg-*")}
    assert built == published
    assert set(built) == {f"mlreg-{version}.tar.gz", f"mlreg-{version}-py3-none-any.whl"}
    publish = _job_lines(release, "publish")
    assert "no OIDC exchange, no attestations" in publish  # says it is the stand-in


def test_a_fresh_environment_installs_the_release_from_the_index_and_runs_it(release: ReleaseRun) -> None:
    verify = _job_lines(release, "verify")
    wheel = f"mlreg-{release.version}-py3-none-any.whl"
    assert re.search(rf"Downloading http://127\.0\.0\.1:\d+/packages/{re.escape(wheel)}", verify)
    assert f"Successfully installed mlreg-{release.version}" in verify
    assert f"mlreg {release.version}" in verify
    assert "6 model(s) checked: 0 error(s)" in verify


def changelog_body(version: str) -> str:
    """The lines of CHANGELOG.md under ``## [version] - <date>``, up to the next ``## `` heading or
    the link definitions, read here from the file itself (not through infra/release.py, which
    made the notes under test)."""
    lines = (ROOT / "CHANGELOG.md").read_text().splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith(f"## [{version}] - ")]
    assert len(start) == 1, f"CHANGELOG.md has {len(start)} sections for {version}"
    body: list[str] = []
    for line in lines[start[0] + 1 :]:
        if line.startswith("## ") or re.match(r"\[[^\]]+\]: ", line):
            break
        body.append(line)
    text = "\n".join(body).strip()
    assert text, f"CHANGELOG.md's section for {version} is empty"
    return text + "\n"


def test_the_release_notes_are_the_changelog_section_with_the_image(release: ReleaseRun) -> None:
    build = json.loads((release.artifacts / "image" / "build.json").read_text())
    image = f"{build['tags'][0]}@{build['context_digest']}"
    notes = (release.artifacts / "release" / "notes.md").read_text()
    install = f"### Install\n\n- PyPI: `pip install mlreg=={release.version}`\n- Image: `{image}`\n"
    assert notes == f"{changelog_body(release.version)}\n{install}"  # CHANGELOG.md's own text
    assert notes.startswith("### Added\n")
    args = (release.artifacts / "release" / "args.txt").read_text().splitlines()
    assert args[0] == f"v{release.version}"
    assert ["--repo", f"{OWNER}/mlreg"] == args[1:3]
    assert "--verify-tag" in args
    assets = {p.name: _sha256(p) for p in (release.artifacts / "release" / "assets").iterdir()}
    assert assets == {p.name: _sha256(p) for p in (release.artifacts / "dist").iterdir()}


def test_the_image_step_is_validated_offline_with_an_sbom(release: ReleaseRun) -> None:
    """No container engine here: the stand-in checked the inputs and the Dockerfile, made and
    validated a CycloneDX SBOM; it built and pushed nothing, and nothing was attested."""
    out = release.artifacts / "image"
    build = json.loads((out / "build.json").read_text())
    assert build["tags"] == [f"ghcr.io/{OWNER}/mlreg:{release.version}"]
    assert (build["built"], build["pushed"]) == (False, False)
    assert build["base"] == "python:3.11.11-slim-bookworm"
    assert build["pip_install"] == f"mlreg-{release.version}-py3-none-any.whl"  # from the copied files
    sbom = json.loads((out / "sbom.cdx.json").read_text())
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.6")
    assert sbom["metadata"]["component"]["name"] == f"ghcr.io/{OWNER}/mlreg"
    components = {c["name"]: c for c in sbom["components"]}
    assert components["mlreg"]["purl"] == f"pkg:pypi/mlreg@{release.version}"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in declared} <= set(components)
    attestation = json.loads((out / "attestation.json").read_text())
    assert attestation["subject"] == f"ghcr.io/{OWNER}/mlreg"
    assert attestation["digest"] == build["context_digest"]
    assert "no attestation made" in _job_lines(release, "image")


def test_a_tag_that_is_not_the_version_fails_the_build_and_publishes_nothing(
    release: ReleaseRun, tmp_path: Path
) -> None:
    tag = "v9.9.9"
    project(tmp_path / "repo", tag)
    run = act(tmp_path, tmp_path / "repo", tag, NO_INDEX)
    assert run.returncode != 0
    assert run.job_result("build") == "failure"
    for job in JOBS[1:]:
        assert run.job_result(job) == "not run", job
    build = _job_lines(ReleaseRun(tmp_path, run, release.version), "build")
    assert f"error: the tag '{tag}' does not name the package's version {release.version}" in build
    assert "Creating isolated environment" not in build  # refused before anything was built
    assert not (tmp_path / "artifacts").exists()
