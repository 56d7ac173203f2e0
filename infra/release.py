"""What the release workflow (.github/workflows/release.yml) asks of the checkout, standard library only.

The version has one source: ``__version__`` in ``registry/__init__.py`` (setuptools reads it for the
distributions, ``mlreg --version`` prints it).  A release is the tag ``v<version>``; this script
refuses any other tag instead of rewriting a file, and refuses a version CHANGELOG.md has no entry
for.  CHANGELOG.md keeps the Keep a Changelog shape (https://keepachangelog.com/en/1.1.0/): a
``## [Unreleased]`` section, then one ``## [X.Y.Z] - YYYY-MM-DD`` section per release, newest first,
whose ``###`` groups are Added, Changed, Deprecated, Removed, Fixed or Security.

    python infra/release.py version --tag v0.1.0     # "version=0.1.0" (for $GITHUB_OUTPUT)
    python infra/release.py check-dist dist 0.1.0    # exactly mlreg-0.1.0.tar.gz + its wheel
    python infra/release.py notes 0.1.0 [--image ghcr.io/o/mlreg@sha256:...]   # the release notes

Failures print ``error: ...`` and ``fix: ...`` on stderr and exit 1 (usage errors: 2).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_FILE = Path("registry") / "__init__.py"
CHANGELOG = "CHANGELOG.md"
PROJECT = "mlreg"
GROUPS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
VERSION = r"\d+\.\d+\.\d+(?:[-.+][0-9A-Za-z.]+)?"
RELEASE_HEADING = re.compile(rf"^## \[(?P<version>{VERSION})\] - \d{{4}}-\d{{2}}-\d{{2}}$")
LINK_DEFINITION = re.compile(r"^\[[^\]]+\]: \S+$")


class ReleaseError(Exception):
    def __init__(self, error: str, fix: str) -> None:
        super().__init__(error)
        self.fix = fix


def package_version(root: Path = ROOT) -> str:
    """``__version__`` of registry/__init__.py, read without importing the package."""
    tree = ast.parse((root / VERSION_FILE).read_text(), filename=str(VERSION_FILE))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    raise ReleaseError(f"{VERSION_FILE} assigns no __version__ string", "add __version__ = 'X.Y.Z' to it")


def tag_version(tag: str, root: Path = ROOT) -> str:
    """The version a release tag names: it must be ``v`` + the package's version."""
    version = package_version(root)
    if tag != f"v{version}":
        raise ReleaseError(
            f"the tag {tag!r} does not name the package's version {version} ({VERSION_FILE})",
            f"tag the release v{version}, or set __version__ in {VERSION_FILE} (and CHANGELOG.md) "
            f"to {tag.removeprefix('v')!r} first",
        )
    return version


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """``## `` headings with their lines, link definitions left out."""
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line, []))
        elif sections and not LINK_DEFINITION.match(line):
            sections[-1][1].append(line)
    return sections


def changelog_problems(text: str) -> list[str]:
    """What keeps ``text`` from the Keep a Changelog shape (empty: none)."""
    problems = [] if text.startswith("# Changelog\n") else ["the first line is not '# Changelog'"]
    sections = _sections(text)
    if not sections or sections[0][0] != "## [Unreleased]":
        problems.append("the first section is not '## [Unreleased]'")
    seen: list[str] = []
    for heading, lines in sections[1:]:
        match = RELEASE_HEADING.match(heading)
        if not match:
            problems.append(f"{heading!r} is not '## [X.Y.Z] - YYYY-MM-DD'")
            continue
        seen.append(match["version"])
        groups = [line[4:].strip() for line in lines if line.startswith("### ")]
        unknown = [g for g in groups if g not in GROUPS]
        problems += [f"{heading}: '### {g}' is none of {', '.join(GROUPS)}" for g in unknown]
        if not groups:
            problems.append(f"{heading}: no '### Added/Changed/...' group")
    if len(set(seen)) != len(seen):
        problems.append("a version has two sections")
    if seen != sorted(seen, key=_version_key, reverse=True):
        problems.append("the versions are not newest first")
    return problems


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def changelog_section(text: str, version: str) -> str:
    """The body of ``version``'s section (its ``###`` groups), for the release notes."""
    problems = changelog_problems(text)
    if problems:
        raise ReleaseError(f"{CHANGELOG} is not in the Keep a Changelog shape: {'; '.join(problems)}", _SHAPE)
    for heading, lines in _sections(text)[1:]:
        match = RELEASE_HEADING.match(heading)
        if match and match["version"] == version:
            body = "\n".join(lines).strip()
            if body:
                return body + "\n"
    raise ReleaseError(
        f"{CHANGELOG} has no entry for {version}",
        f"move the [Unreleased] items into a '## [{version}] - YYYY-MM-DD' section before tagging",
    )


_SHAPE = "see https://keepachangelog.com/en/1.1.0/ and the header of infra/release.py"


def check_dist(dist: Path, version: str) -> list[Path]:
    """``dist`` holds exactly the sdist and the pure-Python wheel of ``version``, nothing else."""
    expected = {f"{PROJECT}-{version}.tar.gz", f"{PROJECT}-{version}-py3-none-any.whl"}
    found = {p.name for p in dist.iterdir()} if dist.is_dir() else set()
    if found != expected:
        raise ReleaseError(
            f"{dist} holds {sorted(found) or 'nothing'}, not {sorted(expected)}",
            "build once from a clean checkout of the tag: python -m build",
        )
    return sorted(dist / name for name in expected)


def release_notes(text: str, version: str, image: str | None = None) -> str:
    """The GitHub release's notes: the changelog section, then where the release is published."""
    notes = changelog_section(text, version)
    notes += f"\n### Install\n\n- PyPI: `pip install {PROJECT}=={version}`\n"
    if image:
        notes += f"- Image: `{image}`\n"
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="check the tag; print version=X").add_argument("--tag", required=True)
    dist = commands.add_parser("check-dist", help="exactly the sdist and the wheel of the version")
    dist.add_argument("dist", type=Path)
    dist.add_argument("version")
    notes = commands.add_parser("notes", help="the release notes from CHANGELOG.md")
    notes.add_argument("version")
    notes.add_argument("--image", help="the pushed image, name:tag@digest")
    args = parser.parse_args(argv)
    try:
        if args.command == "version":
            version = tag_version(args.tag, args.root)
            changelog_section((args.root / CHANGELOG).read_text(), version)  # an entry, or no release
            sys.stdout.write(f"version={version}\n")
        elif args.command == "check-dist":
            for path in check_dist(args.dist, args.version):
                sys.stdout.write(f"{path}\n")
        else:
            sys.stdout.write(release_notes((args.root / CHANGELOG).read_text(), args.version, args.image))
    except ReleaseError as e:
        sys.stderr.write(f"error: {e}\nfix: {e.fix}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
