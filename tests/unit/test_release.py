"""The release's pieces, statically: one version (registry/__init__.py) that the distribution's
metadata, ``mlreg --version``, the tag check and the infra's image references all say; CHANGELOG.md
in the Keep a Changelog shape and the section the release notes take; release.yml's least
privilege, pins and the tools it installs (the dev extra's).  The run itself under act:
tests/integration/test_release.py."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import registry
from mlreg.cli.main import app
from tests.cli import CliRunner
from tests.conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
IMAGE = re.compile(r"^ghcr\.io/[a-z0-9-]+/mlreg$")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_under_test", ROOT / "infra" / "release.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _script()
VERSION = registry.__version__


def _workflow() -> dict[str, object]:
    document = yaml.safe_load(WORKFLOW.read_text())
    document["on"] = document.pop(True)  # YAML 1.1 reads the key `on` as true
    return dict(document)


# -- one version -----------------------------------------------------------------------------------


def test_the_version_has_one_source_that_the_metadata_and_the_cli_say() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "registry.__version__"}
    assert release.package_version(ROOT) == VERSION
    assert importlib.metadata.version("mlreg") == VERSION  # the (editable) install's metadata
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"mlreg {VERSION}\n"


def test_only_the_tag_v_version_releases_and_another_is_refused_naming_both() -> None:
    assert release.tag_version(f"v{VERSION}", ROOT) == VERSION
    for tag in ("v9.9.9", VERSION, f"v{VERSION}rc1", f"release-{VERSION}"):
        with pytest.raises(release.ReleaseError, match=rf"the tag '{re.escape(tag)}' does not name") as e:
            release.tag_version(tag, ROOT)
        assert f"package's version {VERSION} (registry/__init__.py)" in str(e.value)
        assert e.value.fix.startswith(f"tag the release v{VERSION}, or set __version__")


def test_the_cli_prints_the_version_line_for_github_output_or_error_and_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert release.main(["version", "--tag", f"v{VERSION}"]) == 0
    assert capsys.readouterr().out == f"version={VERSION}\n"
    assert release.main(["version", "--tag", "v0.0.0-not"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the tag 'v0.0.0-not' does not name the package's version")
    assert "\nfix: tag the release" in err


def test_the_infra_references_the_released_image_by_the_package_version() -> None:
    kustomization = yaml.safe_load((ROOT / "infra/k8s/base/kustomization.yaml").read_text())
    [mlreg] = [i for i in kustomization["images"] if i["name"] == "mlreg"]
    assert IMAGE.match(mlreg["newName"]), mlreg
    assert mlreg["newTag"] == VERSION
    for manifest in ("promote-job.yaml", "triton.yaml"):  # the name kustomize maps, no tag of its own
        text = (ROOT / "infra/k8s/base" / manifest).read_text()
        images = re.findall(r"^\s*image: (\S*mlreg\S*)", text, re.MULTILINE)
        assert images, manifest
        assert set(images) == {"mlreg"}, (manifest, images)
    compose = yaml.safe_load((ROOT / "infra/compose/compose.yaml").read_text())
    service = compose["services"]["store-init"]
    assert service["image"] == f"{mlreg['newName']}:{VERSION}"
    assert service["build"]["dockerfile"] == "infra/compose/mlreg.Dockerfile"


# -- CHANGELOG.md ------------------------------------------------------------------------------------

GOOD = """# Changelog

## [Unreleased]
### Added
- next thing

## [0.2.0] - 2027-01-02
### Fixed
- a bug

## [0.1.0] - 2026-12-05
### Added
- the first release
  over two lines

[Unreleased]: https://example.invalid/compare/v0.2.0...HEAD
[0.2.0]: https://example.invalid/compare/v0.1.0...v0.2.0
"""


def test_the_changelog_keeps_the_shape_and_has_this_versions_entry() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert release.changelog_problems(text) == []
    section = release.changelog_section(text, VERSION)
    assert section.startswith("### Added\n- ")
    heading = f"## [{VERSION}] - "
    after = text[text.index(heading) :].split("\n", 1)[1].lstrip("\n")  # CHANGELOG.md's own text
    assert after.startswith(section)
    rest = after[len(section) :].lstrip("\n")
    assert rest == "" or rest.startswith(("## [", "[")), rest[:80]  # then the next section, or links
    assert not re.search(r"^## ", section, re.MULTILINE)  # no other version's heading


def test_a_section_is_its_groups_without_headings_or_link_definitions() -> None:
    assert release.changelog_section(GOOD, "0.2.0") == "### Fixed\n- a bug\n"
    assert release.changelog_section(GOOD, "0.1.0") == "### Added\n- the first release\n  over two lines\n"
    notes = release.release_notes(GOOD, "0.1.0", "ghcr.io/o/mlreg:0.1.0@sha256:ab")
    assert notes == (  # the section's text as GOOD writes it, then where the release is
        "### Added\n- the first release\n  over two lines\n"
        "\n### Install\n\n- PyPI: `pip install mlreg==0.1.0`\n- Image: `ghcr.io/o/mlreg:0.1.0@sha256:ab`\n"
    )
    with pytest.raises(release.ReleaseError, match=r"CHANGELOG.md has no entry for 0\.3\.0") as e:
        release.changelog_section(GOOD, "0.3.0")
    assert "'## [0.3.0] - YYYY-MM-DD'" in e.value.fix


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("# Changelog\n", "# Changes\n"), "the first line is not '# Changelog'"),
        (("## [Unreleased]\n", ""), "the first section is not '## [Unreleased]'"),
        (("## [0.2.0] - 2027-01-02", "## 0.2.0 (2027-01-02)"), "is not '## [X.Y.Z] - YYYY-MM-DD'"),
        (("### Fixed", "### Bugs"), "'### Bugs' is none of Added, Changed"),
        (("### Fixed\n", ""), "## [0.2.0] - 2027-01-02: no '### Added/Changed/...' group"),
        (("## [0.2.0]", "## [0.0.9]"), "the versions are not newest first"),
        (("## [0.2.0]", "## [0.1.0]"), "a version has two sections"),
    ],
)
def test_a_changelog_out_of_shape_is_refused_naming_what(edit: tuple[str, str], problem: str) -> None:
    text = GOOD.replace(*edit, 1)
    assert any(problem in p for p in release.changelog_problems(text)), release.changelog_problems(text)
    with pytest.raises(release.ReleaseError, match="is not in the Keep a Changelog shape"):
        release.changelog_section(text, "0.1.0")


def test_check_dist_wants_exactly_the_sdist_and_the_wheel(tmp_path: Path) -> None:
    names = [f"mlreg-{VERSION}.tar.gz", f"mlreg-{VERSION}-py3-none-any.whl"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in release.check_dist(tmp_path, VERSION)] == sorted(names)
    (tmp_path / "mlreg-0.0.1-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(release.ReleaseError, match=r"holds .*mlreg-0\.0\.1-py3-none-any\.whl"):
        release.check_dist(tmp_path, VERSION)
    (tmp_path / "mlreg-0.0.1-py3-none-any.whl").unlink()
    (tmp_path / names[1]).unlink()  # the wheel missing: not exactly the two either
    with pytest.raises(release.ReleaseError, match=rf"holds \['{re.escape(names[0])}'\], not"):
        release.check_dist(tmp_path, VERSION)


# -- release.yml -----------------------------------------------------------------------------------

PERMISSIONS = {
    "build": {"contents": "read"},
    "publish": {"id-token": "write"},
    "verify": {"contents": "read"},
    "image": {"contents": "read", "packages": "write", "attestations": "write", "id-token": "write"},
    "release": {"contents": "write"},
}


def test_release_yml_runs_on_version_tags_with_least_privilege_per_job() -> None:
    workflow = _workflow()
    assert workflow["on"] == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {}
    jobs = workflow["jobs"]
    assert isinstance(jobs, dict)
    assert {name: job["permissions"] for name, job in jobs.items()} == PERMISSIONS
    assert all("timeout-minutes" in job for job in jobs.values())
    assert jobs["publish"]["needs"] == "build"
    assert jobs["publish"]["environment"]["name"] == "pypi"
    assert set(jobs["release"]["needs"]) == {"build", "verify", "image"}


def _steps(job: str) -> list[dict[str, object]]:
    jobs = _workflow()["jobs"]
    assert isinstance(jobs, dict)
    return list(jobs[job]["steps"])


def _uses(job: str, action: str) -> dict[str, object]:
    [step] = [s for s in _steps(job) if str(s.get("uses", "")).startswith(f"{action}@")]
    return step


def test_publishing_is_trusted_publishing_with_attestations_and_the_image_carries_provenance() -> None:
    publish = _uses("publish", "pypa/gh-action-pypi-publish")["with"]
    assert publish == {"packages-dir": "dist", "attestations": True}  # no password, no token
    build = _uses("image", "docker/build-push-action")["with"]
    assert isinstance(build, dict)
    assert (build["push"], build["provenance"], build["sbom"]) == (True, "mode=max", True)
    assert (ROOT / str(build["file"])).is_file()
    attest = _uses("image", "actions/attest-build-provenance")["with"]
    assert attest == {
        "subject-name": "${{ steps.name.outputs.image }}",
        "subject-digest": "${{ steps.push.outputs.digest }}",
        "push-to-registry": True,
        "create-storage-record": False,
    }


def test_every_action_is_pinned_to_a_full_commit() -> None:
    uses = re.findall(r"uses: (\S+)", WORKFLOW.read_text())
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref


def test_the_tools_the_build_installs_are_the_dev_extras_pins() -> None:
    """Pinned once each: the workflow installs the versions the dev extra pins (and the run under
    act finds them installed in .venv)."""
    [install] = [s for s in _steps("build") if "pip install build" in str(s.get("run", ""))]
    pins = dict(re.findall(r"([\w-]+)==(\S+)", str(install["run"])))
    assert set(pins) == {"build", "twine", "check-wheel-contents"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = dict(
        re.findall(
            r"^([\w-]+)(?:\[[\w,-]+\])?==(\S+)$",
            "\n".join(project["project"]["optional-dependencies"]["dev"]),
            re.MULTILINE,
        )
    )
    assert {name: dev.get(name) for name in pins} == pins
    steps = [str(s.get("id", s.get("name", s.get("uses")))) for s in _steps("build")]
    assert steps.index("version") < steps.index(str(install["name"]))  # the tag is checked first
