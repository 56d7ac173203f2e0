"""The store's bytes against the registry: ``mlreg store repair`` and ``mlreg store verify --registered``.

A stored version is written once (:mod:`pipelines.storage.push`); what it was first written as is
what MLflow registered: the version's ``artifact_digest`` (its manifest's digest) and the signature
logged with it.  So ``verify --registered`` flags a version whose manifest or signature changed
after it was written by comparing them with MLflow's -- nothing extra is recorded in the store,
which whoever can write there could rewrite as well.  ``repair`` puts the registered bytes back
as a promotion does when it finds them changed (``check_stored`` + ``apply_repair``).

An ensemble's folder holds no bytes and is re-pointed in place by promotions (its registered
version may differ from its folder's number): neither command compares it with MLflow.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.storage.verify import SIGNATURE_FILE, FileProblem, Verification
from registry.errors import RegistryError, StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.promote.ports import Registry
    from pipelines.storage.base import RepositoryStore

DIGEST_TAG = "artifact_digest"


def registry_of(settings: Settings) -> Registry:
    from registry.mlflow import MlflowRegistry

    return MlflowRegistry(settings)


@dataclass
class RepairReport:
    store: str
    model: str
    version: str
    repaired: str  # what was wrong and is put back ("": the stored bytes verified, nothing sent)
    signature: str  # "kept", "put back from MLflow", or "" (the version is not signed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        what = self.repaired or f"{self.model}/{self.version} verifies: nothing to repair"
        signature = f"; signature {self.signature}" if self.signature else ""
        return f"{self.store}: {what}{signature}"


def store_repair(
    settings: Settings,
    model: str,
    version: str,
    registry: Registry,
    store: RepositoryStore,
) -> RepairReport:
    """Put ``model`` ``version``'s registered bytes back into ``store``, under the model's lock:
    the registry's copy, checked against its registered digest, is re-sent where the stored bytes
    differ, then verified; a signed version's ``.mlreg-signature.json`` is kept, MLflow's written
    back where the store's is missing or another.  Refused for a version the store does not hold
    and for an ensemble's folder."""
    from pipelines.promote.integrity import apply_repair, check_stored
    from pipelines.promote.plan import Role, Step, config_facts

    if not version.isdigit():
        raise UsageError(f"version '{version}' is not a number", fix="pass a positive version number")
    stored = store.list_versions(model)
    if version not in stored:
        raise StorageError(
            f"{store.uri}: {model} v{version} is not in the store (stored: {', '.join(stored) or 'none'})",
            fix=f"nothing to repair: 'mlreg promote {model} --version {version}' uploads it",
        )
    if config_facts(store.read_config(model) or "").is_ensemble:
        raise UsageError(
            f"{model} is an ensemble: its folder holds no bytes, only the config promotions re-point",
            fix=f"promote it again ('mlreg promote {model} --version N') to rewrite its config",
        )
    try:
        digest = registry.version_tags(model, version).get(DIGEST_TAG, "")
    except RegistryError as exc:
        exc.message += ": the store's copy has no registered bytes to be repaired from"
        raise
    step = Step(model, version, Role.MODEL, None, "", None, [])
    with tempfile.TemporaryDirectory(prefix="mlreg-repair-") as tmp:
        with store.lock(model, ttl=settings.lock_lease, wait=0):
            found = check_stored(store, registry, step, version, digest, Path(tmp))
            repaired = apply_repair(store, found) if found is not None else ""
            signature = _signature_back(store, registry, model, version, Path(tmp))
    return RepairReport(store.uri, model, version, repaired, signature)


def _signature_back(
    store: RepositoryStore, registry: Registry, model: str, version: str, workdir: Path
) -> str:
    from pipelines.promote.integrity import registered_signature

    registered = registered_signature(registry, model, version, workdir)  # None: not signed
    key = f"{model}/{version}/{SIGNATURE_FILE}"
    stored = store.read(key)
    if registered is None or stored == registered:
        return "kept" if stored is not None else ""
    store.write(key, registered)
    return "put back from MLflow"


def verify_registered(
    registry: Registry, store: RepositoryStore, model: str, version: str, hashing: str = "all"
) -> Verification:
    """``store.check_version`` against what MLflow registered: the manifest's digest must be the
    version's ``artifact_digest``, and a signature beside it the one logged with the version.  A
    version MLflow does not know, and an ensemble's folder, are checked against their manifest
    only (``note`` says so)."""
    manifest = store.read_manifest(model, version)
    if manifest is not None and not manifest.files:
        check = store.check_version(model, version, None, hashing)
        check.note = "an ensemble's folder (no files, re-pointed in place): not compared with MLflow"
        return check
    try:
        tags = registry.version_tags(model, version)
    except RegistryError as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
            raise
        check = store.check_version(model, version, None, hashing)
        check.note = "not a version registered in MLflow: compared with its manifest only"
        return check
    check = store.check_version(model, version, tags.get(DIGEST_TAG) or None, hashing)
    if not tags.get(DIGEST_TAG):
        check.note = "MLflow records no digest for it: its manifest not compared"
    check.problems.extend(_signature_problems(registry, store, model, version))
    return check


def _signature_problems(
    registry: Registry, store: RepositoryStore, model: str, version: str
) -> list[FileProblem]:
    import hashlib

    from pipelines.promote.integrity import registered_signature

    stored = store.read(f"{model}/{version}/{SIGNATURE_FILE}")
    if stored is None:
        return []  # nothing beside the manifest: a promotion writes MLflow's there
    with tempfile.TemporaryDirectory(prefix="mlreg-signature-") as tmp:
        registered = registered_signature(registry, model, version, Path(tmp))
    if registered == stored:
        return []
    expected = f"sha256 {hashlib.sha256(registered).hexdigest()}" if registered is not None else "none"
    return [
        FileProblem(SIGNATURE_FILE, "signature", expected, f"sha256 {hashlib.sha256(stored).hexdigest()}")
    ]


__all__ = ["RepairReport", "registry_of", "store_repair", "verify_registered"]
