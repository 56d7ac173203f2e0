"""What ``mlreg stack up --s3`` puts in the S3 server it starts: the project's repository, copied
store to store (issue 48 item 4).

A push (``mlreg store push``) uploads model folders a user built and writes each version's
manifest from their bytes; a promoted repository is no such folder: its version folders already
hold the manifest (and signature) the promotion wrote, and its configs are the ones the promotion
wrote, not the registered ones the manifests record.  Pushing it sent ``.mlreg-manifest.json`` as a
plain file, and the manifest's conditional create then collided with it ("created by another
writer").  So a repository is *copied*: every file of every model folder as it is stored, each
version's manifest last and created only where none is (a manifest is never sent as a plain
file), each model's config after its versions (what makes Triton see the model); the store's own
objects (locks, temporary files, bytecode caches and guards) are left behind.  An empty
repository copies nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.storage.base import CONFIG, MANIFEST, ObjectStore, Repository, check_part
from pipelines.storage.verify import bytecode_cache, bytecode_guard
from registry.errors import StorageError


@dataclass
class Seeded:
    """What a copy sent: models and their versions (``model -> [version, ...]``), files sent."""

    models: dict[str, list[str]] = field(default_factory=dict)
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # folders at the root that are no model


def _copied(key: str) -> bool:
    """Whether a key under a model folder is the model's (not the store's own bookkeeping)."""
    return not (bytecode_cache(key) or bytecode_guard(key) or key.endswith("/" + MANIFEST))


def seed_store(
    source: Repository,
    root: Path,
    target: Repository,
    on_model: Callable[[str], None] | None = None,
) -> Seeded:
    """Copy the local repository ``source`` (its folder ``root``) into ``target``; see the module.
    A model folder whose name a store cannot hold is refused before anything is sent."""
    models = [m for m in source.list_models() if (root / m / CONFIG).is_file()]
    seeded = Seeded(skipped=[m for m in source.list_models() if m not in models])
    for model in models:
        check_part(model, "model name")
    for model in models:
        if on_model is not None:
            on_model(model)
        with target.session.lock(model, wait=0):
            seeded.models[model] = _copy_model(source, root, target, model, seeded)
    return seeded


def _copy_model(source: Repository, root: Path, target: Repository, model: str, seeded: Seeded) -> list[str]:
    keys = [k for k in source.objects.list_prefix(f"{model}/") if _copied(k)]
    config = f"{model}/{CONFIG}"
    for key in keys:
        if key != config:
            path = root / key
            target.objects.put_file(key, path, source.objects.digests.sha256(path), None)
            seeded.files += 1
    versions = []
    for version in source.list_versions(model):
        manifest = source.objects.read(f"{model}/{version}/{MANIFEST}")
        if manifest is None:  # an incomplete version stays incomplete: no manifest is made up for it
            continue
        if not target.objects.create(f"{model}/{version}/{MANIFEST}", manifest):
            raise StorageError(
                f"{target.uri}: {model} v{version} already has a manifest there; the copy of "
                f"{source.uri} never overwrites one",
                fix="stop the stack ('mlreg stack down') and start it again: its S3 server starts empty",
            )
        versions.append(version)
    target.objects.write(
        config, (root / config).read_bytes()
    )  # last: Triton sees the model with its versions
    seeded.files += 1
    return versions


def copy_back(source: Repository, target: Repository) -> list[str]:
    """At ``stack down``, what the stack's S3 server holds back into the project's own store folder
    it was copied from (moto_server keeps its objects in memory only: what was promoted there would
    be gone, and the next start would serve nothing of it).  Each version the folder lacks is
    copied, its manifest created last; each config that differs is written (under the model's
    lock, as a promotion writes it); a version the folder holds with another manifest is left as
    the folder holds it, and named.  One line per change."""
    lines: list[str] = []
    for model in source.list_models():
        config = source.read_config(model)
        if config is None:
            continue
        check_part(model, "model name")
        with target.session.lock(model, wait=0):
            for version in source.list_versions(model):
                lines.extend(_version_back(source.objects, target.objects, model, version))
            if target.read_config(model) != config:
                target.session.write_config(model, config)
                lines.append(f"{model}: its config (what serves)")
    return lines


def _version_back(source: ObjectStore, target: ObjectStore, model: str, version: str) -> list[str]:
    key = f"{model}/{version}/{MANIFEST}"
    manifest = source.read(key)
    held = target.read(key)
    if manifest is None or held == manifest:
        return []
    if held is not None:
        return [f"{model} v{version}: left as the folder holds it (another manifest there)"]
    for name in source.list_prefix(f"{model}/{version}/"):
        data = source.read(name) if _copied(name) else None
        if data is not None:
            target.write(name, data)
    if not target.create(key, manifest):
        return [f"{model} v{version}: left as the folder holds it (its manifest appeared meanwhile)"]
    target.guard_bytecode(model, version)
    return [f"{model} v{version}"]


__all__ = ["Seeded", "copy_back", "seed_store"]
