"""Push local model folders (or a whole repository) into a store as versioned folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipelines.storage.base import CONFIG, Progress, RepositoryStore, UploadResult, check_part
from registry.contracts.links import refuse_outside_links
from registry.errors import StorageError


def model_folders(path: Path) -> list[Path]:
    """``path`` itself when it is a model folder, else its model folders."""
    if (path / CONFIG).is_file():
        return [path]
    if not path.is_dir():
        raise StorageError(f"'{path}' is not a folder", fix="pass a model folder or a repository")
    models = sorted(p for p in path.iterdir() if (p / CONFIG).is_file())
    if not models:
        raise StorageError(
            f"'{path}' holds no model folder (no */config.pbtxt)",
            fix="pass a model folder or a repository of model folders",
        )
    return models


def push_model(
    store: RepositoryStore, folder: Path, progress: Progress | None = None, versions: list[str] | None = None
) -> list[UploadResult]:
    model = check_part(folder.name, "model name")
    refuse_outside_links(folder, error=StorageError)  # before anything is sent
    local_versions = sorted((p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=int)
    results = [
        store.put_version(model, v, folder / v, progress)
        for v in local_versions
        if versions is None or v in versions
    ]
    # config last: it is what makes Triton see the model with its new versions
    text = (folder / CONFIG).read_text()
    if store.read_config(model) != text:
        store.write_config(model, text)
    return results


def push_path(
    store: RepositoryStore,
    path: Path,
    progress: Progress | None = None,
    on_model: Callable[[str], None] | None = None,
) -> list[UploadResult]:
    results: list[UploadResult] = []
    folders = model_folders(path)
    for folder in folders:  # check every name and link before sending anything
        check_part(folder.name, "model name")
        refuse_outside_links(folder, error=StorageError)
    for folder in folders:
        if on_model:
            on_model(folder.name)
        results.extend(push_model(store, folder, progress))
    return results
