"""``mlreg store verify``: re-hash stored versions and compare them with their manifests.

Live copies first, then archived ones; reads only.  With ``registered`` each version is compared
with what MLflow registered as well (:func:`verify_registered`): a stored version is written once
(:mod:`pipelines.storage.push`), so a manifest whose digest is not the version's
``artifact_digest``, or a signature beside it other than the one logged with the version, was
changed after it was written -- nothing extra is recorded in the store, which whoever can write
there could rewrite as well.  With ``signatures`` each version's signature is checked against the
trusted keys.  The report says what was found; :meth:`StoreVerifyReport.failure` is the error a
caller raises once it has shown the report.

An ensemble's folder holds no bytes and is re-pointed in place by promotions (its registered
version may differ from its folder's number): it is never compared with MLflow.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import open_registry, open_store
from mlreg.ops.store_ls import archive_of
from pipelines.promote.integrity import registered_signature, signature_status
from pipelines.storage.verify import ENTRY, MANIFEST, SIGNATURE_FILE, FileProblem, Verification
from registry.errors import RegistryError, StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.storage.base import ObjectStore, Repository
    from registry.ports import RegistryView

DIGEST_TAG = "artifact_digest"
Check = Callable[["Repository", str, str], Verification]


@dataclass
class StoreVerifyReport:
    """Each copy checked (``location`` live or archived) and, with signatures, each one's verdict."""

    store: str
    checks: list[tuple[str, Verification]]
    signed: dict[tuple[str, str], str] = field(default_factory=dict)  # "signed by ..." or why not

    @property
    def bad(self) -> list[Verification]:
        return [check for _, check in self.checks if not check.ok]

    def signature(self, model: str, version: str) -> str | None:
        return self.signed.get((model, version))

    def to_dict(self) -> dict[str, Any]:
        versions = [
            {**check.to_dict(), "location": where, **_signature_field(self.signed, check)}
            for where, check in self.checks
        ]
        return {"store": self.store, "ok": not self.bad, "versions": versions}

    def failure(self) -> StorageError | None:
        """The error the verb ends with: a copy that does not match, else one not trusted-signed."""
        if self.bad:
            named = (
                p.file if p.problem == ENTRY else f"{c.model}/{c.version}/{p.file}"
                for c in self.bad
                for p in c.problems
            )
            files = list(dict.fromkeys(named))  # an entry of a model folder is named by each version
            more = f" and {len(files) - 10} more" if len(files) > 10 else ""
            entries = any(c.entries for c in self.bad)
            return StorageError(
                f"{self.store}: {len(self.bad)} of {len(self.checks)} version(s) do not match their "
                f"manifest{' or lie in a model folder holding unexpected entries' if entries else ''}: "
                f"{', '.join(files[:10])}{more}",
                fix=(
                    "remove every unexpected entry named (mlreg writes only config.pbtxt and version "
                    "folders with a manifest under a model folder; Triton may read or run anything else); "
                    if entries
                    else ""
                )
                + "put the registered bytes back ('mlreg store repair MODEL VERSION'; a promotion "
                "re-uploads what differs too), then verify again",
            )
        unsigned = [f"{m}/{v}" for (m, v), line in self.signed.items() if not line.startswith("signed by")]
        if unsigned:
            names = ", ".join(unsigned)
            return StorageError(
                f"{self.store}: {len(unsigned)} version(s) not signed by a trusted key: {names}",
                fix="sign them ('mlreg sign MODEL VERSION --sign-key KEY'), "
                "or pass the signer's --trusted-key",
            )
        return None


def _signature_field(signed: dict[tuple[str, str], str], check: Verification) -> dict[str, str]:
    key = (check.model, check.version)
    return {"signature": signed[key]} if key in signed else {}


def store_verify(
    uri: str | None,
    model: str | None = None,
    version: str | None = None,
    *,
    digest: str | None = None,
    registered: bool = False,
    trusted_keys: Sequence[Path] | None = None,
) -> StoreVerifyReport:
    """Check every stored copy of ``model`` ``version`` (default: every model, every version) in
    the store at ``uri``; ``trusted_keys`` (not None) checks signatures too."""
    target = open_store(uri)
    if digest and not version:
        raise UsageError(
            "--digest needs MODEL and VERSION", fix="mlreg store verify MODEL VERSION --digest SHA"
        )
    if digest and registered:
        raise UsageError("--digest and --registered name the digest twice", fix="pass one of them")
    archive = archive_of(target)
    stores = {"live": target, "archived": archive or target}
    pairs = [(stores[where], where, m, v) for where, m, v in selected(target, model, version, archive)]
    check = _registered_check() if registered else _manifest_check(digest)
    checks = [(where, check(store, m, v)) for store, where, m, v in pairs]
    signed = {} if trusted_keys is None else _signatures([(s, m, v) for s, _, m, v in pairs], trusted_keys)
    return StoreVerifyReport(target.uri, checks, signed)


def _manifest_check(digest: str | None) -> Check:
    return lambda store, model, version: store.versions.check_version(model, version, digest, hashing="all")


def _registered_check() -> Check:
    """Each version against what MLflow registered (the project's registry)."""
    registry = open_registry(Settings.from_env())
    return lambda store, model, version: verify_registered(registry, store, model, version)


def _signatures(found: list[tuple[Repository, str, str]], keys: Sequence[Path]) -> dict[tuple[str, str], str]:
    """(model, version) -> "signed by ..." or "NOT verified: why"."""
    if not keys:
        raise UsageError("--signatures needs the keys to trust", fix="pass --trusted-key PATH (repeat)")
    return {(m, v): signature_status(store, m, v, keys) for store, m, v in found}


def selected(
    target: Repository, model: str | None, version: str | None, archive: Repository | None
) -> list[tuple[str, str, str]]:
    """(location, model, version) of every copy to check: live first, then archived."""
    if version is not None and model is None:
        raise UsageError("a version needs its model", fix="mlreg store verify MODEL VERSION")
    pairs: list[tuple[str, str, str]] = []
    for name in _models(target, model, archive):
        live = target.list_versions(name)
        archived = archive.list_versions(name) if archive is not None else []
        _require_stored(target.uri, name, version, sorted(set(live) | set(archived), key=int), bool(model))
        pairs.extend(("live", name, v) for v in live if version is None or v == version)
        pairs.extend(("archived", name, v) for v in archived if version is None or v == version)
    return pairs


def _models(target: Repository, model: str | None, archive: Repository | None) -> list[str]:
    if model:
        return [model]
    if archive is None:
        return target.list_models()
    return sorted(set(target.list_models()) | set(archive.list_models()))


def _require_stored(uri: str, name: str, version: str | None, versions: list[str], named: bool) -> None:
    if version is not None and version not in versions:
        stored = ", ".join(versions) or "none"
        raise StorageError(
            f"{uri}: {name} has no version '{version}' in the store (stored: {stored})",
            fix="see 'mlreg store ls'",
        )
    if named and not versions:
        raise StorageError(f"{uri}: no version of '{name}' is stored", fix="see 'mlreg store ls'")


def verify_registered(
    registry: RegistryView, store: Repository, model: str, version: str, hashing: str = "all"
) -> Verification:
    """``store.versions.check_version`` against what MLflow registered: the manifest's digest must be the
    version's ``artifact_digest``, and a signature beside it the one logged with the version.  A
    version MLflow does not know, and an ensemble's folder, are checked against their manifest
    only (``note`` says so)."""
    manifest = store.versions.read_manifest(model, version)
    if manifest is not None and not manifest.files:
        check = store.versions.check_version(model, version, None, hashing)
        check.note = "an ensemble's folder (no files, re-pointed in place): not compared with MLflow"
        return check
    try:
        tags = registry.models.version_tags(model, version)
    except RegistryError as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
            raise
        check = store.versions.check_version(model, version, None, hashing)
        check.problems.insert(0, FileProblem(MANIFEST, "digest", "a version registered in MLflow", "none"))
        check.note = (
            "not a version registered in MLflow: a manifest alone proves nothing, a load naming it is refused"
        )
        return check
    check = store.versions.check_version(model, version, tags.get(DIGEST_TAG) or None, hashing)
    if not tags.get(DIGEST_TAG):  # issue 44: a load naming it is refused, so say so here too
        check.problems.insert(0, FileProblem(MANIFEST, "digest", "an artifact_digest in MLflow", "none"))
        check.note = (
            "MLflow records no digest for it: its bytes cannot be verified, a load naming it is refused"
        )
    check.problems.extend(_signature_problems(registry, store.objects, model, version))
    return check


def _signature_problems(
    registry: RegistryView, store: ObjectStore, model: str, version: str
) -> list[FileProblem]:
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


__all__ = ["DIGEST_TAG", "StoreVerifyReport", "selected", "store_verify", "verify_registered"]
