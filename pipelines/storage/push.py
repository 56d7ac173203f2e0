"""Push local model folders (or a whole repository) into a store as versioned folders.

A stored version is written once: a push of a version the store holds with other bytes is
refused before anything is sent (StorageError naming each file that differs; the fix is a new
version), the same bytes are a no-op, and the version's manifest and signature stay as first
written.  A push holds the model's lock, as a promotion does, so that two writers never change one
model at once; the manifest of a new version is created only where none is (S3: If-None-Match),
so of two writers of one new version exactly one makes it (:meth:`Versions.put_version`).

A version folder the store holds *without* a valid manifest (an upload that did not finish, or a
manifest removed) is not open: the push finishes it only with the bytes MLflow registered for that
version -- the pushed folder's manifest digest (files and config) must be the version's
``artifact_digest`` (``registered``, the application's look-up) -- and refuses otherwise, before
anything is sent, naming ``mlreg store repair`` (which puts the registered bytes back).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipelines.storage.base import (
    CONFIG,
    LEASE_S,
    Manifest,
    ObjectStore,
    Progress,
    Repository,
    UploadResult,
    check_part,
    local_files,
)
from pipelines.storage.closed_world import is_version_folder
from pipelines.storage.manifest import MANIFEST
from pipelines.storage.verify import other_bytes, rewrite_refused
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


def version_folders(folder: Path, versions: list[str] | None = None) -> list[str]:
    """The version folders of the model folder ``folder`` (only ``versions``, when given);
    StorageError, before anything is sent, for a folder of digits Triton would not load as that
    version (``09/``: Triton 2.51 ignores a version folder with a leading zero)."""
    digits = [p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    odd = sorted(v for v in digits if not is_version_folder(v))
    if odd:
        raise StorageError(
            f"'{folder}' holds version folder(s) {', '.join(f'{v}/' for v in odd)} with a leading zero "
            "(or not ASCII digits): Triton 2.51 ignores such a folder, and mlreg never stores one "
            "(every later load of the model would be refused); nothing was sent",
            fix=f"rename {odd[0]}/ to {int(odd[0])}/ (one folder per version, numbered 1, 2, 3, ...)",
        )
    found = sorted(digits, key=int)
    return [v for v in found if versions is None or v in versions]


Registered = Callable[[str, str], "str | None"]  # (model, version) -> MLflow's artifact_digest


def refuse_rewrites(
    store: Repository,
    folder: Path,
    versions: list[str] | None = None,
    registered: Registered | None = None,
) -> None:
    """StorageError, before anything is sent, when a version of ``folder`` is stored with other
    bytes (the comparison of the two manifests; local files hashed once, through the cache), or
    is stored without a valid manifest and the folder is not what MLflow registered for it."""
    model = check_part(folder.name, "model name")
    for version in version_folders(folder, versions):
        stored, why = store.versions.load_manifest(model, version)
        if stored is None:
            if why or store.objects.list_prefix(f"{model}/{version}/"):  # stored, no valid manifest
                _refuse_unregistered(store.objects, folder, version, registered, why)
            continue  # a new version
        pushed = Manifest.of_folder(local_files(folder / version), store.objects.digests)
        lines = other_bytes(stored.files, pushed.files)
        if lines:
            raise rewrite_refused(store.uri, model, version, lines)


def _refuse_unregistered(
    store: ObjectStore, folder: Path, version: str, registered: Registered | None, why: str
) -> None:
    """A version folder stored without a valid manifest is finished only with the registered
    bytes: StorageError unless the folder's digest is MLflow's ``artifact_digest`` for it."""
    model = folder.name
    pushed = Manifest.of_folder(local_files(folder / version), store.digests, folder / CONFIG)
    expected = registered(model, version) if registered is not None else None
    if expected is not None and expected == pushed.digest:
        return
    reason = (
        "MLflow registers no digest for it"
        if expected is None
        else f"the folder pushed (digest {pushed.digest[:12]}...) is not what MLflow registered "
        f"(digest {expected[:12]}...)"
    )
    state = f"its manifest is unreadable ({why})" if why else f"it has no {MANIFEST}"
    raise StorageError(
        f"{store.uri}: {model} v{version} is stored, but {state} (an upload that did not finish, or a "
        "manifest removed); a stored version is finished only with the bytes MLflow registered for "
        f"it, and {reason}; nothing was sent",
        fix=f"put the registered bytes back: 'mlreg store repair {model} {version}'; to store these "
        f"bytes, register them as a new version of {model} ('mlreg register {model} FOLDER')",
        model=model,
        version=version,
    )


def push_model(
    store: Repository,
    folder: Path,
    progress: Progress | None = None,
    versions: list[str] | None = None,
    lease: float = LEASE_S,
    registered: Registered | None = None,
) -> list[UploadResult]:
    """Push every version folder of ``folder`` (only ``versions``, when given), then its config,
    under the model's lock (``lease``: its lease in seconds; ``registered``: MLflow's digest of a
    version, asked only for one stored without a valid manifest); see the module's docstring."""
    model = check_part(folder.name, "model name")
    refuse_outside_links(folder, error=StorageError)  # before anything is sent
    with store.session.lock(model, ttl=lease, wait=0):
        refuse_rewrites(store, folder, versions, registered)  # again under the lock, then send
        for version in version_folders(folder, versions):
            if store.versions.load_manifest(model, version)[1]:  # unreadable; these are the registered bytes
                store.objects.delete(f"{model}/{version}/{MANIFEST}")  # written again from them by the upload
        results = [
            store.versions.put_version(model, v, folder / v, progress, write_once=True)
            for v in version_folders(folder, versions)
        ]
        # config last: it is what makes Triton see the model with its new versions
        text = (folder / CONFIG).read_text()
        if store.read_config(model) != text:
            store.session.write_config(model, text)
    return results


def push_path(
    store: Repository,
    path: Path,
    progress: Progress | None = None,
    on_model: Callable[[str], None] | None = None,
    lease: float = LEASE_S,
    registered: Registered | None = None,
) -> list[UploadResult]:
    results: list[UploadResult] = []
    folders = model_folders(path)
    for folder in folders:  # every name, link and stored version checked before sending anything
        check_part(folder.name, "model name")
        refuse_outside_links(folder, error=StorageError)
        refuse_rewrites(store, folder, registered=registered)
    for index, folder in enumerate(folders):
        if on_model:
            on_model(folder.name)
        try:
            results.extend(push_model(store, folder, progress, lease=lease, registered=registered))
        except StorageError as exc:
            raise _after_others(exc, folder.name, [f.name for f in folders[:index]]) from exc
    return results


def _after_others(exc: StorageError, model: str, pushed: list[str]) -> StorageError:
    """``exc`` as it is when no other model was pushed before it; else its "nothing was sent" is
    said of ``model`` alone, and the models already pushed are named (their uploads stand:
    each was checked and pushed whole, under its own lock)."""
    if not pushed:
        return exc
    done = f"; {', '.join(pushed)} (checked before it) {'was' if len(pushed) == 1 else 'were'} pushed"
    message = exc.message.replace("nothing was sent", f"nothing of {model} was sent") + done
    return StorageError(message, fix=exc.fix, **exc.context)
