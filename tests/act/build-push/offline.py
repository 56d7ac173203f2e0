"""The build-push stand-in's offline checks (action.yml beside this file says what is not done).

Reads the action's inputs from the environment (CONTEXT, DOCKERFILE, TAGS, PUSH, PROVENANCE,
SBOM), writes ``build.json`` and ``sbom.cdx.json`` to ``--out``, prints ``digest=sha256:...`` for
``$GITHUB_OUTPUT``; any failure is one ``::error::`` line and exit 1.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
TAG = r"ghcr\.io/[a-z0-9-]+/mlreg:{version}"


class Refused(Exception):
    pass


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments left out."""
    joined, pending = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        raise Refused(f"{dockerfile}: a continuation line ends the file")
    parsed = []
    for line in joined:
        word, _, rest = line.partition(" ")
        if word.upper() not in INSTRUCTIONS:
            raise Refused(f"{dockerfile}: unknown instruction {word!r}")
        parsed.append((word.upper(), rest.strip()))
    if not parsed or parsed[0][0] not in {"FROM", "ARG"}:
        raise Refused(f"{dockerfile}: does not start with FROM")
    return parsed


def layout(context: Path, parsed: list[tuple[str, str]], image: Path) -> tuple[list[Path], list[Path]]:
    """Every file COPY/ADD takes from the context (a missing source is refused, as docker would),
    laid out under ``image`` where the Dockerfile puts it; and the folders in ``image`` where a RUN
    does ``pip install .``."""
    files: list[Path] = []
    installs: list[Path] = []
    workdir = Path("/")
    for instruction, args in parsed:
        if instruction == "WORKDIR":
            workdir = workdir / args
        elif instruction == "RUN" and re.search(r"pip install\b[^&|;]*\s\.(\s|$)", args):
            installs.append(image / workdir.relative_to("/"))
        elif instruction in {"COPY", "ADD"} and not any(w.startswith("--from") for w in args.split()):
            *sources, dest = [w for w in args.split() if not w.startswith("--")]
            target = image / (workdir / dest).relative_to("/")
            files += _copy(context, sources, target, into=dest.endswith("/") or len(sources) > 1)
    return files, installs


def _copy(context: Path, sources: list[str], target: Path, into: bool) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        matches = sorted(glob.glob(str(context / source)))
        if not matches or ".." in Path(source).parts:
            raise Refused(f"COPY {source}: not in the build context {context}")
        for match in map(Path, matches):
            dest = target / match.name if into else target
            if match.is_dir():
                shutil.copytree(match, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
                files += [f for f in sorted(match.rglob("*")) if f.is_file() and "__pycache__" not in f.parts]
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(match, dest)
                files.append(match)
    return files


def pip_install_dot(folder: Path, version: str) -> str:
    """The image's ``pip install .`` from exactly the copied files: a wheel built there (with this
    Python's setuptools, no index), whose metadata must name the version and the ``mlreg`` command."""
    out = folder.parent / "wheel"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*pip, "-w", str(out), str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        raise Refused(f"pip install . fails on the copied files: {done.stderr[-2000:]}")
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    if f"\nVersion: {version}\n" not in metadata or b"mlreg = mlreg.cli.main:main" not in entry_points:
        raise Refused(f"the image's mlreg ({wheel.name}) is not version {version} with the mlreg command")
    return wheel.name


def check_dockerfile(parsed: list[tuple[str, str]]) -> str:
    """The base image (pinned: a version tag or a digest) and a non-root final user."""
    bases = [args.split()[0] for instruction, args in parsed if instruction == "FROM"]
    for base in bases:
        name, _, tag = base.rpartition(":")
        if "@sha256:" not in base and (not name or tag in {"", "latest"}):
            raise Refused(f"FROM {base}: the base image is not pinned")
    users = [args for instruction, args in parsed if instruction == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        raise Refused("the image runs as root (no USER, or USER root)")
    return bases[-1]


def context_digest(context: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def dependency_closure(requirements: list[str]) -> dict[str, tuple[str, set[str]]]:
    """name -> (version, its dependencies' names): the requirements resolved against this Python's
    installed distributions, extras and environment markers applied."""
    found: dict[str, tuple[str, set[str]]] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [r for r in map(Requirement, requirements) if r.marker is None or r.marker.evaluate()]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        dist = importlib.metadata.distribution(name)
        version, deps = found.get(name, (dist.version, set()))
        found[name] = (version, deps)
        for extra_name in {""} | requirement.extras:
            for line in dist.requires or []:
                child = Requirement(line)
                if child.marker is None or child.marker.evaluate({"extra": extra_name}):
                    deps.add(canonicalize_name(child.name))
                    todo.append(child)
    return found


def sbom(image: str, version: str, requirements: list[str]) -> str:
    """A CycloneDX 1.6 JSON SBOM of the image's Python packages, validated against the schema."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from packageurl import PackageURL

    closure = dependency_closure(requirements)
    bom = Bom()
    container = Component(name=image, version=version, type=ComponentType.CONTAINER, bom_ref=image)
    bom.metadata.component = container

    def component(name: str, ver: str, kind: ComponentType = ComponentType.LIBRARY) -> Component:
        purl = PackageURL(type="pypi", name=name, version=ver)
        return Component(name=name, version=ver, type=kind, purl=purl, bom_ref=purl.to_string())

    mlreg = component("mlreg", version, ComponentType.APPLICATION)
    parts = {name: component(name, ver) for name, (ver, _) in closure.items()}
    bom.components.update([mlreg, *parts.values()])
    bom.register_dependency(container, [mlreg])
    bom.register_dependency(mlreg, [parts[canonicalize_name(Requirement(r).name)] for r in requirements])
    for name, (_, deps) in closure.items():
        if deps & parts.keys():
            bom.register_dependency(parts[name], [parts[d] for d in sorted(deps & parts.keys())])
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise Refused(f"the SBOM is not valid CycloneDX 1.6: {error}")
    return text


def package_version(context: Path) -> str:
    text = (context / "registry" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if not match:
        raise Refused("registry/__init__.py has no __version__")
    return match[1]


def run(out: Path, env: dict[str, str]) -> str:
    context = Path(env.get("CONTEXT") or ".").resolve()
    version = package_version(context)
    tags = [t.strip() for t in re.split(r"[,\n]", env.get("TAGS", "")) if t.strip()]
    if len(tags) != 1 or not re.fullmatch(TAG.format(version=re.escape(version)), tags[0]):
        raise Refused(f"tags {tags}: expected one ghcr.io/<owner>/mlreg:{version}")
    wanted = {"PUSH": "true", "PROVENANCE": "mode=max", "SBOM": "true"}
    for key, value in wanted.items():
        if env.get(key, "") != value:
            raise Refused(f"{key.lower()}: {env.get(key, '')!r}, not {value!r}")
    dockerfile = context / env["DOCKERFILE"]
    parsed = instructions(dockerfile)
    base = check_dockerfile(parsed)
    with tempfile.TemporaryDirectory() as scratch:
        files, installs = layout(context, parsed, Path(scratch) / "image")
        if len(installs) != 1:
            raise Refused(f"{dockerfile}: {len(installs)} RUN pip install . (one expected)")
        installed = pip_install_dot(installs[0], version)
    requirements = tomllib.loads((context / "pyproject.toml").read_text())["project"]["dependencies"]
    document = sbom(tags[0].rpartition(":")[0], version, requirements)
    digest = context_digest(context, files)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sbom.cdx.json").write_text(document)
    record = {
        "tags": tags, "base": base, "dockerfile": env["DOCKERFILE"], "instructions": len(parsed),
        "copied_files": len(files), "pip_install": installed, "context_digest": digest,
        "built": False, "pushed": False,
    }  # fmt: skip
    (out / "build.json").write_text(json.dumps(record, indent=2))
    return digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    try:
        digest = run(parser.parse_args().out, dict(os.environ))
    except (Refused, KeyError, importlib.metadata.PackageNotFoundError) as e:
        sys.stderr.write(f"::error::build-push stand-in: {e}\n")
        return 1
    sys.stderr.write(f"local stand-in: no image built or pushed; context digest {digest}\n")
    sys.stdout.write(f"digest={digest}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
