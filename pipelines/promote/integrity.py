"""Never load unverified bytes: every version a promotion may make a server load -- the new one,
and the versions it would go back to on an abort or a rollback -- is checked against the digest
registered in MLflow before the first change, and again by the undo log before it loads one.

A stored version whose bytes are corrupt is restored from the registry's artifacts when those
match the registered digest (``Repair``: planned by ``validate``, written by ``assemble``, the
first live stage); otherwise the promotion is refused before any change, naming the file.

Where the environment asks for signatures (``signatures = "required" | "warn"``), the same versions'
OpenSSF model signatures are checked too (:mod:`registry.signing`), with the digests of the manifest
the byte check just proved -- nothing is hashed again: the signer must be trusted and the signed
file digests must equal the manifest's (the store's; for a version still to upload, the registry's
manifest bound to its registered digest).  ``required`` refuses before any change, naming the
version, the file or the identity; ``warn`` reports and goes on.  The signature is read beside the
store's manifest (``.mlreg-signature.json``), else from the version's MLflow run; ``assemble``
writes it beside the manifest of a version it uploads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipelines.core.plan import Step
from pipelines.core.ports import RegistryReader, RegistryView
from pipelines.core.reports import Repair
from pipelines.core.undo import VerifyStored
from pipelines.storage import closed_world
from pipelines.storage.base import ObjectStore, Repository
from pipelines.storage.verify import MANIFEST
from pipelines.storage.versions import Versions
from registry.contracts.config import CONFIG_NAME
from registry.errors import MlregError, PromotionError, StorageError
from registry.manifest import CONFIG_ENTRY, VOLATILE, artifact_digest, digest_of_manifest, sha256_file
from registry.ports import is_planned
from registry.signing import (
    SIGNATURE_ARTIFACT,
    SIGNATURE_FILE,
    SIGNED_BY_TAG,
    SignatureError,
    Signed,
    Trust,
    signed_files,
    trust_stamp,
)
from registry.signing import verify as verify_signature

log = logging.getLogger(__name__)


def check_stored(
    store: Repository, registry: RegistryReader, step: Step, version: str, digest: str, workdir: Path
) -> Repair | None:
    """None when ``step.model``/``version`` in the store is the registered version; a Repair when
    the registry's copy is; else PromotionError naming what is wrong in both."""
    if not digest:  # a manifest anyone can write proves nothing: only MLflow's digest does
        why = "MLflow records no artifact_digest for it (never registered by mlreg, or not at all)"
        store.versions.distrust(step.model, version, why)
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} cannot be verified: {why}, so whatever its "
            "manifest says, nobody registered its bytes",
            fix=f"register {step.model} v{version} with 'mlreg register', or remove its folder from the "
            f"store's {step.model}/ and its version from {step.model}/config.pbtxt",
            model=step.model,
            version=version,
        )
    try:
        store.versions.verify_version(step.model, version, digest)
        return None
    except StorageError as exc:
        problem = exc.message
        if exc.context.get("entries"):  # the model folder's: no copy from the registry removes them
            raise entries_refused(store.objects, step.model, version, exc) from exc
    folder = workdir / f"registered-{step.model}-{version}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        registry.fetch_version(step.model, version, folder)
        found = artifact_digest(folder / version, folder / CONFIG_NAME)
    except (MlregError, OSError) as exc:
        reason = exc.message if isinstance(exc, MlregError) else str(exc)
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} does not verify ({problem}); the registry's copy "
            f"cannot be read either: {reason}",
            fix="restore the version's files, then promote again",
        ) from exc
    if found != digest:
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} does not verify ({problem}), and the registry's "
            f"copy does not match its registered digest either",
            fix="the version's bytes are lost: promote another version",
        )
    return Repair(step.model, version, folder, problem)


def entries_refused(store: ObjectStore, model: str, version: str, exc: StorageError) -> PromotionError:
    """The refusal of a load whose model folder holds entries no manifest covers (the closed
    world): no copy from the registry removes them, so nothing is restored, nothing changes."""
    return PromotionError(
        f"{model} v{version} cannot be loaded from {store.uri}: {exc.message}",
        fix=exc.fix or f"remove the entries named from the store's {model}/ folder",
        model=model,
        version=version,
        files=exc.context.get("files", []),
    )


def apply_repair(store: Versions, repair: Repair) -> str:
    """Rewrite the stored version from the registry's copy, then verify it; returns the detail."""
    folder = repair.folder
    store.put_version(repair.model, repair.version, folder / repair.version, config=folder / CONFIG_NAME)
    store.verify_version(repair.model, repair.version, None, drop_bytecode=True)
    return repair.detail()


def verifier(
    store: Repository,
    digests: dict[tuple[str, str], str],
    trust: Trust | None = None,
    registry: RegistryView | None = None,
    workdir: Path | None = None,
) -> VerifyStored:
    """What the undo log asks before it loads a version again: "" when the bytes verify (and,
    where the environment requires signatures, the signature)."""

    def verify(model: str, version: str) -> str:
        digest = digests.get((model, version))
        if not digest:  # only MLflow's digest says these are the registered bytes
            return f"{model} v{version} cannot be verified: MLflow records no artifact_digest for it"
        try:
            checked = store.versions.verify_version(model, version, digest, drop_bytecode=True)
        except StorageError as exc:
            return f"{model} v{version} does not verify ({exc.message})"
        if trust is None:
            return ""
        try:
            stored_signature_check(store, registry, model, version, trust, workdir, checked.digest)
        except SignatureError as exc:
            if trust.required:
                return f"{model} v{version}: its signature does not verify ({exc.message})"
            log.warning('%s (signatures = "warn": loaded anyway)', exc.message)
        return ""

    return verify


# -- signatures ----------------------------------------------------------------------------------


def check_signatures(
    store: Repository,
    registry: RegistryView,
    steps: Iterable[Step],
    trust: Trust | None,
    workdir: Path | None,
    no_way_back: bool = False,
) -> list[str]:
    """Before any change: the signature of every version the promotion may load -- each step's new
    version and the versions an abort would load again.  One line per version for the validate
    report; PromotionError when ``trust`` requires signatures and one does not verify -- the way
    back's too, unless ``no_way_back`` (the user said so: the undo log asks again, ``verifier``,
    and leaves the model as it serves rather than load it)."""
    if trust is None:
        return []
    assert workdir is not None  # the promotion's work folder: set when its context is made
    lines = []
    for step in steps:
        if step.is_ensemble:
            continue  # an ensemble's version folder is empty: its config is mlreg's own
        lines.append(_check_new(store, registry, step, trust, workdir))
        for version in step.previous_versions:
            if version != step.version:
                line, why = _check_previous(store, registry, step.model, version, trust, workdir)
                if why and trust.required and not no_way_back:
                    raise no_way_back_error(
                        step.model,
                        version,
                        f"has a signature that does not verify ({why})",
                        f"sign {step.model} v{version} again (or promote a signed version first)",
                    )
                lines.append(line)
    return lines


def no_way_back_error(model: str, version: str, why: str, restore: str) -> PromotionError:
    """The refusal of a promotion whose way back (``version``, which an abort would load again)
    cannot be loaded: ``why`` it cannot, and how to ``restore`` it."""
    return PromotionError(
        f"{model} v{version}, the version an abort would load again, {why}, so a failed promotion "
        "would have no way back",
        fix=f"{restore}, or pass --no-way-back to promote anyway: an abort then leaves the model as it "
        "serves, never loading unverified bytes",
        model=model,
        version=version,
    )


def _check_new(store: Repository, registry: RegistryView, step: Step, trust: Trust, workdir: Path) -> str:
    what = f"{step.model} v{step.version}"
    # a version only a plan (``mlreg export --dry-run``) would register has no signature yet: the
    # export that registers it signs it
    if is_planned(registry.models, step.model, step.version):
        return f"{what} not checked: a plan's version is signed when it is registered (--sign-key)"
    try:
        signed = _new_signature(store, registry, step, trust, workdir)
    except SignatureError as exc:
        if trust.required:
            raise PromotionError(
                f"signature check failed, refusing to load it: {exc.message}",
                fix=exc.fix,
                model=step.model,
                version=step.version,
                identity=exc.context.get("identity", ""),
                files=exc.context.get("files", []),
            ) from exc
        log.warning('%s (signatures = "warn": promoting anyway)', exc.message)
        return f"{what} signature NOT verified (warn: {exc.message})"
    return f"{what} signed by {signed.identity}"


def _new_signature(
    store: Repository, registry: RegistryView, step: Step, trust: Trust, workdir: Path
) -> Signed:
    """A version to upload: the registry's signature over the registry's manifest (bound to the
    registered digest the upload is verified against).  A stored one: the store's signature over the
    store's manifest, else -- e.g. a stored copy that ``assemble`` will restore from the registry --
    the registry's (the byte check bound both manifests to the registered digest)."""
    if not step.upload:
        try:
            return stored_signature_check(store, registry, step.model, step.version, trust, workdir)
        except SignatureError as first:
            try:
                return _registered_check(registry, step, trust, workdir)
            except SignatureError:
                raise first from None
    return _registered_check(registry, step, trust, workdir)


def _registered_check(registry: RegistryView, step: Step, trust: Trust, workdir: Path) -> Signed:
    files = _registered_files(registry, step)
    bundle = registered_signature(registry, step.model, step.version, workdir)
    signed = verify_signature(bundle, files, trust, f"{step.model} v{step.version}")
    _keep(workdir, step.model, step.version, bundle)
    return signed


def _check_previous(
    store: Repository, registry: RegistryView, model: str, version: str, trust: Trust, workdir: Path
) -> tuple[str, str]:
    """The validate report's line for a version an abort would load again, and why its signature
    does not verify ("" when it does)."""
    try:
        signed = stored_signature_check(store, registry, model, version, trust, workdir)
    except (SignatureError, StorageError) as exc:
        log.warning("%s", exc.message)
        line = (
            f"{model} v{version} signature NOT verified (an abort would leave it as it serves: {exc.message})"
        )
        return line, exc.message
    return f"{model} v{version} signed by {signed.identity}", ""


_CHECKED: dict[tuple[str, str, tuple[Any, ...]], Signed] = {}  # (bundle sha256, manifest digest, trust)


def stored_signature_check(
    store: Repository,
    registry: RegistryView | None,
    model: str,
    version: str,
    trust: Trust,
    workdir: Path | None,
    digest: str | None = None,
) -> Signed:
    """The signature of a stored version against the store's manifest (whose bytes the caller has
    verified): the signature beside the manifest, else the registry's.  ``digest``: the manifest
    digest the caller's byte check found (``Verification.digest``); a signature already verified in
    this process against a manifest of that digest is not checked again (nor the manifest read)."""
    stored = store.objects.read(f"{model}/{version}/{SIGNATURE_FILE}")
    seen = hashlib.sha256(stored).hexdigest() if stored is not None else ""
    if digest and stored is not None and (seen, digest, trust_stamp(trust)) in _CHECKED:
        return _CHECKED[(seen, digest, trust_stamp(trust))]
    manifest = store.versions.read_manifest(model, version)
    if manifest is None:
        raise SignatureError(f"{model} v{version} is not in {store.uri}", fix="promote it first")
    files = signed_files(manifest.files, manifest.config["sha256"] if manifest.config else None)
    what = f"{model} v{version}"
    try:
        signed = verify_signature(stored, files, trust, what)
    except SignatureError:
        if registry is None or workdir is None:
            raise
        registered = registered_signature(registry, model, version, workdir)  # e.g. signed again since
        if registered is None or registered == stored:
            raise
        return verify_signature(registered, files, trust, what)
    if len(_CHECKED) > 1024:
        _CHECKED.clear()
    _CHECKED[(seen, manifest.digest, trust_stamp(trust))] = signed
    return signed


def registered_signature(registry: RegistryView, model: str, version: str, workdir: Path) -> bytes | None:
    """The signature logged with the version in MLflow (None: unsigned; read only when the
    version's ``signed_by`` tag says there is one)."""
    if not registry.models.version_tags(model, version).get(SIGNED_BY_TAG):
        return None
    dest = workdir / f"signature-{model}-{version}"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        run_id = str(registry.models.version(model, version).run_id)
        return registry.runs.download(run_id, SIGNATURE_ARTIFACT, dest).read_bytes()
    except (MlregError, OSError) as exc:
        raise SignatureError(
            f"{model} v{version} is tagged signed but its signature cannot be read from MLflow: {exc}",
            fix=f"sign it again: 'mlreg sign {model} {version} --sign-key KEY'",
        ) from exc


def _registered_files(registry: RegistryView, step: Step) -> dict[str, str]:
    """The registry's manifest of a version still to upload, bound to its registered digest (the
    digest the store's bytes are checked against after the upload): nothing hashed but the config."""
    assert step.folder is not None
    what = f"{step.model} v{step.version}"
    try:
        data = _registered_manifest(registry, step)
    except (MlregError, OSError, ValueError) as exc:
        raise SignatureError(
            f"{what}: its manifest cannot be read from MLflow: {exc}", fix="register it again"
        ) from exc
    config = step.folder / CONFIG_NAME
    config_sha = sha256_file(config)
    config_meta = {"sha256": config_sha, "size": config.stat().st_size}
    files = dict(data.get("files") or {})
    if digest_of_manifest({**files, CONFIG_ENTRY: config_meta}) != step.digest:
        raise SignatureError(
            f"{what}: the manifest MLflow holds does not match its registered digest",
            fix="register the version again",
        )
    return signed_files(files, config_sha)


def _registered_manifest(registry: RegistryView, step: Step) -> dict[str, Any]:
    """The ``manifest.json`` logged with the version's MLflow run (downloaded beside its fetch)."""
    assert step.folder is not None
    dest = step.folder.parent / f"manifest-{step.model}-{step.version}"
    dest.mkdir(parents=True, exist_ok=True)
    run_id = str(registry.models.version(step.model, step.version).run_id)
    return dict(json.loads(registry.runs.download(run_id, "manifest.json", dest).read_text()))


def registered_differences(store: Versions, registry: RegistryView, step: Step) -> list[str]:
    """The files of an uploaded version whose bytes differ from those registered in MLflow, one line
    each, from the two manifests (the store's, written from the bytes sent, and the registry's
    ``manifest.json``): nothing hashed.  Empty when either cannot be read (the digest error stands)."""
    if step.folder is None:
        return []
    try:
        stored = store.read_manifest(step.model, step.version)
        registered = dict(_registered_manifest(registry, step)["files"])
    except (MlregError, OSError, ValueError, KeyError, TypeError):
        return []
    if stored is None:
        return []
    lines = []
    for rel in sorted(set(stored.files) | set(registered)):
        if rel.rsplit("/", 1)[-1] in VOLATILE:
            continue
        mine, theirs = stored.files.get(rel), registered.get(rel)
        if theirs is None:
            lines.append(f"{step.model}/{step.version}/{rel}: not a file of the registered version")
        elif mine is None:
            lines.append(f"{step.model}/{step.version}/{rel}: registered, but not uploaded")
        elif (mine.get("sha256"), mine.get("size")) != (theirs.get("sha256"), theirs.get("size")):
            lines.append(
                f"{step.model}/{step.version}/{rel} changed since registration: its sha256 differs from "
                "the one MLflow's manifest.json records (the registry's artifact store was altered)"
            )
    return lines


def _keep(workdir: Path, model: str, version: str, bundle: bytes | None) -> None:
    if bundle is not None:
        (workdir / f"verified-signature-{model}-{version}.json").write_bytes(bundle)


def publish_signature(store: ObjectStore, step: Step, workdir: Path | None) -> None:
    """After ``assemble`` uploaded and verified ``step``'s version: its signature (checked by
    ``check_signatures``) beside the store's manifest, where the undo log, ``mlreg status`` and
    ``mlreg store verify --signatures`` read it."""
    kept = workdir / f"verified-signature-{step.model}-{step.version}.json" if workdir else None
    if kept is not None and kept.is_file():
        store.write(f"{step.model}/{step.version}/{SIGNATURE_FILE}", kept.read_bytes())


def signature_problems(
    store: Repository,
    registry: RegistryView | None,
    model: str,
    versions: Iterable[str],
    trust: Trust | None,
) -> list[str]:
    """``mlreg status``: one line per stored version whose signature no longer verifies (reads
    only; the registry's copy read into a scratch folder when the store has none that verifies)."""
    if trust is None:
        return []
    found = []
    with tempfile.TemporaryDirectory(prefix="mlreg-signatures-") as tmp:
        for version in versions:
            try:
                stored_signature_check(store, registry, model, version, trust, Path(tmp))
            except (SignatureError, StorageError) as exc:
                found.append(f"v{version}: its signature does not verify ({exc.message})")
    return found


def manifest_problems(store: Versions, model: str, versions: Iterable[str]) -> list[str]:
    """``mlreg status``: one line per version the store serves whose manifest cannot be read (one
    small read each; a store that stops answering is said by its other reads)."""
    found = []
    for version in versions:
        try:
            _, why = store.load_manifest(model, version)
        except StorageError:
            break
        if why:
            found.append(
                f"v{version}: its manifest {model}/{version}/{MANIFEST} is unreadable ({why}), so "
                f"its bytes cannot be verified: 'mlreg store repair {model} {version}' (or a promotion "
                "of the model) restores it from the registry"
            )
    return found


def folder_problems(store: ObjectStore, model: str, serving: Iterable[str]) -> list[str]:
    """``mlreg status``: one line per entry of ``<model>/`` outside the closed world's allow-list
    (:mod:`pipelines.storage.closed_world`; nothing hashed: one listing and the manifests), each
    of which refuses every load of the model.  A store that stops answering is said by its other
    reads."""
    try:
        found = closed_world.folder_entries(store, model, tuple(serving))
    except StorageError:
        return []
    return [
        f"{model}/{rel} {why}; every load of {model} is refused until it is removed from the store "
        f"(mlreg writes only config.pbtxt and version folders with a manifest there): 'mlreg store "
        f"verify {model}' names each"
        for rel, why in found
    ]


def unregistered_problems(store: Repository, registry: RegistryReader, model: str) -> list[str]:
    """``mlreg status``: one line per version folder of ``<model>/`` whose manifest digest is not
    the ``artifact_digest`` MLflow registered for that version (a hand-made manifest proves nothing;
    a load naming the version is refused).  An ensemble's folder (no files) is left out; a registry
    or store that cannot be read is said by status's other reads."""
    found: list[str] = []
    try:
        versions = store.list_versions(model)
    except StorageError:
        return []
    for version in versions:
        try:
            manifest = store.versions.read_manifest(model, version)
        except StorageError:
            return found
        if manifest is None or not manifest.files:
            continue  # said by manifest_problems / the closed world; an ensemble's folder
        try:
            registered = registry.version_tags(model, version).get("artifact_digest", "")
        except LookupError:
            registered = ""
        except MlregError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc.context.get("code", "")):
                return found  # MLflow unreachable: status says so
            registered = ""
        if registered != manifest.digest:
            what = (
                "MLflow records no artifact_digest for it"
                if not registered
                else "MLflow registered another digest"
            )
            found.append(
                f"{model}/{version}/ has a manifest the registry does not know ({what}): nobody registered "
                f"its bytes, and every load naming v{version} is refused; remove the folder (and "
                f"v{version} from {model}/config.pbtxt), or 'mlreg store repair {model} {version}' for a "
                "registered version"
            )
    return found


def signature_status(store: Repository, model: str, version: str, keys: Iterable[Path]) -> str:
    """``mlreg store verify --signatures``: "signed by ..." when the signature beside the stored
    manifest verifies against ``keys`` (public keys or CA certificates), else "NOT verified: why"."""
    try:
        signed = stored_signature_check(store, None, model, version, Trust("required", tuple(keys)), None)
    except (SignatureError, StorageError) as exc:
        return f"NOT verified: {exc.message}"
    return f"signed by {signed.identity}"
