"""A store's versions: upload (``put_version``), manifests, verification and deletion.

The rules (what a manifest proves, when a file is skipped, write-once pushes, the manifest of a
new version created and never overwritten) are said in :mod:`pipelines.storage.base`; the checks
of stored bytes are :mod:`pipelines.storage.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.storage import closed_world as world
from pipelines.storage.manifest import MANIFEST, Manifest, Stamp, parse_manifest
from pipelines.storage.objects import CONFIG, ObjectStore, Progress, check_part
from pipelines.storage.session import StoreSession
from pipelines.storage.verify import (
    SIGNATURE_FILE,
    Verification,
    bytecode_cache,
    bytecode_guard,
    check_version,
    other_bytes,
    rewrite_refused,
)
from registry.contracts.links import refuse_outside_links
from registry.errors import StorageError


def local_files(folder: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every file under the version folder ``folder`` (names
    checked; links leaving the model folder, ``folder``'s parent, refused)."""
    refuse_outside_links(folder.parent, folder, StorageError)
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            rel = path.relative_to(folder).as_posix()
            for part in rel.split("/"):
                check_part(part, f"file name in {folder}")
            files[rel] = path
    return files


@dataclass
class UploadResult:
    model: str
    version: str
    sent: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_sent: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "sent": self.sent,
            "skipped": self.skipped,
            "bytes_sent": self.bytes_sent,
        }


class Versions:
    """The versions in ``store``; writes fenced by ``session`` (its leases)."""

    def __init__(self, store: ObjectStore, session: StoreSession) -> None:
        self.store = store
        self.session = session
        # what this store object learnt of each (model, version) against MLflow's digest: the
        # manifest digest that verified (or that it wrote itself), or why it did not verify -- a
        # later load (``verify_load``) holds the version to it, so bytes rewritten after the check,
        # manifest and all, or a version refused earlier, are never read by Triton in this run
        self.pinned: dict[tuple[str, str], str] = {}
        self.distrusted: dict[tuple[str, str], str] = {}

    # -- reading and checking ------------------------------------------------------------------------

    def distrust(self, model: str, version: str, why: str) -> None:
        """Note that ``model``/``version`` cannot be held to MLflow's digest (``why``): like a version
        that did not verify, it is never named in a load config of this run."""
        self.distrusted[(model, version)] = why
        self.pinned.pop((model, version), None)

    def load_manifest(self, model: str, version: str) -> tuple[Manifest | None, str]:
        return parse_manifest(self.store.read(f"{model}/{version}/{MANIFEST}"))

    def read_manifest(self, model: str, version: str) -> Manifest | None:
        """The version's manifest; None when there is none or it is unreadable (truncated, not a
        manifest): either way the version has no usable manifest and counts as incomplete -- a
        promotion sends it again from the registry, ``check_version`` names a corrupt manifest."""
        return self.load_manifest(model, version)[0]

    def refused(self, model: str, version: str) -> str:
        """Why this store object found ``model``/``version``'s bytes not the ones registered in
        MLflow earlier in this run ("" when it did not): such a version is never loaded again."""
        return self.distrusted.get((model, version), "")

    def get_version(self, model: str, version: str, dest: Path, expected_digest: str | None) -> Path:
        self.verify_version(model, version, expected_digest)
        dest.mkdir(parents=True, exist_ok=True)
        prefix = f"{model}/{version}/"
        for key in self.store.list_prefix(prefix):
            rel = key[len(prefix) :]
            if rel == MANIFEST or bytecode_cache(key) or bytecode_guard(key):  # nothing unhashed
                continue
            data = self.store.read(key)
            if data is None:
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
        return dest

    def check_version(
        self,
        model: str,
        version: str,
        expected_digest: str | None = None,
        hashing: str = "changed",
        *,
        closed_world: bool = True,
        loading: tuple[str, ...] = (),
    ) -> Verification:
        """Compare the stored version with its manifest (and ``expected_digest``); never raises on
        a mismatch: the problems are in the result.  ``hashing``: ``"all"`` re-hashes every file,
        ``"changed"`` only files whose digest the cache cannot prove, ``"none"`` hashes nothing
        (files it cannot prove are reported unverified).  ``closed_world`` (what Triton reads: the
        default) also judges every other entry of the model folder
        (:mod:`pipelines.storage.closed_world`), with ``loading`` the versions the load names
        (default: this one); False only where Triton never reads (the archive)."""
        return check_version(
            self.store, model, version, expected_digest, hashing, closed_world=closed_world, loading=loading
        )

    def verify_version(
        self,
        model: str,
        version: str,
        expected_digest: str | None = None,
        *,
        full: bool = False,
        drop_bytecode: bool = False,
        loading: tuple[str, ...] = (),
    ) -> Verification:
        """Refuse (StorageError naming each bad file) unless every file of ``<model>/<version>/``
        matches the manifest and the manifest matches ``expected_digest`` (the version's
        ``artifact_digest`` in MLflow) when given, and nothing else is under ``<model>/`` (the
        closed world; ``loading``: the versions the load names).  ``full`` re-hashes every file
        instead of reusing digests the cache proves.  ``drop_bytecode`` (right before Triton reads
        the folder): a version that verifies then loses its Python bytecode caches."""
        hashing = "all" if full else "changed"
        result = self.check_version(model, version, expected_digest, hashing, loading=loading)
        try:
            result.raise_if_bad()
        except StorageError as exc:
            if expected_digest is not None and len(result.entries) < len(result.problems):  # its bytes
                self.distrusted[(model, version)] = exc.message.split("\n", 1)[-1].strip()
            raise
        if expected_digest is not None and result.digest is not None:
            self.pinned[(model, version)] = result.digest
            self.distrusted.pop((model, version), None)
        if drop_bytecode:
            for key in result.bytecode:
                self.store.delete(key)
            self.store.guard_bytecode(model, version)
        return result

    def verify_load(self, model: str, waited: tuple[str, ...] | list[str], config: str | None = None) -> None:
        """Right before a load whose config names ``waited`` (the kept serving version too:
        Triton re-reads a loaded version whose files changed): each verified against its manifest
        in the closed world of the model folder (its bytecode caches dropped), the config's
        execution environment inside one of them, and held to what this object learnt of it
        against MLflow's digest (the manifest digest that verified, or wrote; a version that did
        not verify is refused); StorageError naming what is wrong, nothing loaded.  ``config``:
        the load's config, whose version_policy names the versions Triton reads (all of them
        verified, whatever versions the caller waits READY for: ``waited``)."""
        versions = tuple(waited)
        if config is not None:  # every version the config names: the kept serving one too
            named = world.policy_versions(config, self.store.children(f"{model}/"))
            versions = tuple(sorted(set(versions) | set(named), key=int))
        code_free = world.runs_no_code(config)  # an ensemble: Triton reads only its config
        for version in versions:
            why = self.distrusted.get((model, version))
            if why is not None:
                raise StorageError(
                    f"{self.store.uri}: {model} v{version} did not verify earlier in this run against the "
                    f"digest registered in MLflow ({why}); the load names it "
                    f"(v{', v'.join(versions)}), so Triton would read those bytes again: nothing is loaded",
                    fix=f"put its registered bytes back ('mlreg store repair {model} {version}'), then rerun",
                    model=model,
                    version=version,
                )
            expected = self.pinned.get((model, version))
            if (
                expected is None and not code_free
            ):  # only MLflow's digest says these are registered bytes (F2 of 44)
                raise StorageError(
                    f"{self.store.uri}: {model} v{version} was not checked in this run against a digest "
                    f"registered in MLflow; the load names it (v{', v'.join(versions)}), and a manifest "
                    "alone proves nothing (anyone can write one): nothing is loaded",
                    fix=f"register {model} v{version} with mlreg (its artifact_digest) or remove it from the "
                    f"store's {model}/ folder and config.pbtxt; check with 'mlreg store verify {model} "
                    f"{version} --registered'",
                    model=model,
                    version=version,
                )
            self.verify_version(model, version, expected, drop_bytecode=True, loading=versions)

    def drop_bytecode(self, model: str, version: str) -> list[str]:
        keys = [k for k in self.store.list_prefix(f"{model}/{version}/") if bytecode_cache(k)]
        for key in keys:
            self.store.delete(key)
        self.store.guard_bytecode(model, version)
        return keys

    def delete_version(self, model: str, version: str) -> None:
        """The files, then the manifest (an interrupted delete is incomplete)."""
        manifest = f"{model}/{version}/{MANIFEST}"
        keys = self.store.list_prefix(f"{model}/{version}/")
        self.store.delete_keys([k for k in keys if not k.endswith(MANIFEST)])
        self.store.delete_keys([manifest])

    # -- uploading -------------------------------------------------------------------------------------

    def put_version(
        self,
        model: str,
        version: str,
        folder: Path,
        progress: Progress | None = None,
        config: Path | None = None,
        *,
        write_once: bool = False,
    ) -> UploadResult:
        """Upload ``folder`` as ``<model>/<version>/``; only files not already stored are sent.

        ``config`` (default: ``folder``'s parent's config.pbtxt when there is one) is the model's
        registered config: recorded in the manifest, so that its digest is MLflow's
        ``artifact_digest``.  A file is skipped only when the stored bytes are proven equal (by the
        digest cache, else by hashing the stored copy), so a push also repairs a changed file.
        The manifest of a new version is created, never overwritten; the signature beside a
        version's manifest is kept.  ``write_once`` (``mlreg store push``): a version already
        stored keeps what was first written -- other files are refused (StorageError naming
        each), its manifest is never rewritten."""
        check_part(model, "model name")
        check_part(version, "version")
        if not world.is_version_folder(version):  # 09: a folder Triton 2.51 ignores, mlreg refuses
            raise StorageError(
                f"version '{version}' is not a number Triton loads as that version folder "
                "(digits without a leading zero)",
                fix="use 1, 2, 3, ...",
            )
        files = local_files(folder)
        if config is None and (folder.parent / CONFIG).is_file():
            config = folder.parent / CONFIG
        manifest = Manifest.of_folder(files, self.store.digests, config)
        stored = self._stored_manifest(model, version, write_once)
        kept = write_once and stored is not None  # the stored manifest stays as it is
        if kept and stored is not None and (lines := other_bytes(stored.files, manifest.files)):
            raise rewrite_refused(self.store.uri, model, version, lines)
        upload = _Upload(self, UploadResult(model, version), manifest, stored, kept)
        stamps = self.store.object_stamps(f"{model}/{version}/")
        try:
            for rel, path in files.items():
                upload.send(rel, path, stamps, progress)
        finally:
            self.store.digests.save()
        self._drop_others(stamps, files)
        self._finish_manifest(upload)
        if not upload.kept:  # the bytes this process just wrote, manifest and all
            self.pinned[(model, version)] = upload.manifest.digest
            self.distrusted.pop((model, version), None)
        self.store.guard_bytecode(model, version)
        return upload.result

    def _drop_others(self, stamps: dict[str, Stamp], files: dict[str, Path]) -> None:
        """Delete the stored files the version lacks (its manifest, signature and guards kept)."""
        for key in stamps:
            rel = key.split("/", 2)[2]
            if rel not in {MANIFEST, SIGNATURE_FILE} and rel not in files and not bytecode_guard(key):
                self.store.delete(key)

    def _finish_manifest(self, upload: _Upload) -> None:
        model, version = upload.result.model, upload.result.version
        if upload.stored is None:
            self._create_manifest(model, version, upload.manifest)
        elif not upload.kept and (upload.result.sent or upload.stored.differs_from(upload.manifest)):
            self.store.write(f"{model}/{version}/{MANIFEST}", upload.manifest.to_json().encode())

    def _stored_manifest(self, model: str, version: str, write_once: bool) -> Manifest | None:
        """The stored manifest an upload starts from.  One that cannot be read proves nothing: it
        is removed (the version is incomplete until this upload writes it again, every file proven
        or sent).  A write-once push refuses it: it cannot tell whether its files are the stored
        version's; the registry can (``mlreg store repair``)."""
        stored, why = self.load_manifest(model, version)
        if not why:
            return stored
        if write_once:
            raise StorageError(
                f"{self.store.uri}: the manifest of {model} v{version} is unreadable ({why}); a stored "
                "version never changes, and without its manifest this push cannot tell whether its "
                "files are that version's; nothing was sent",
                fix=f"put the registered bytes back: 'mlreg store repair {model} {version}'",
                model=model,
                version=version,
            )
        self.store.delete(f"{model}/{version}/{MANIFEST}")  # fenced: a lost lock stops it here
        return None

    def _create_manifest(self, model: str, version: str, manifest: Manifest) -> None:
        """A new version's manifest, created only where none is (S3: a put with If-None-Match), so
        that of two writers of one new version exactly one makes it; the other, when its files
        differ, gets a StorageError (they may have mixed the files: verify says)."""
        if self.store.create(f"{model}/{version}/{MANIFEST}", manifest.to_json().encode()):
            return
        first = self.load_manifest(model, version)[0]
        lines = other_bytes(first.files, manifest.files) if first is not None else ["the manifest vanished"]
        if not lines:
            return  # the other writer stored the same bytes
        raise StorageError(
            f"{self.store.uri}: {model} v{version} was created by another writer while this push sent it "
            "(its manifest was written first), with other bytes; the files stored now may mix both "
            "uploads:\n  " + "\n  ".join(lines[:10]),
            fix=f"check it with 'mlreg store verify {model} {version}' ('mlreg store repair {model} "
            f"{version}' puts the registered bytes back); to store other bytes, register and push a "
            "new version",
            model=model,
            version=version,
        )

    def stored_matches(self, key: str, digest: str, stamps: dict[str, Stamp]) -> bool:
        """Whether the stored object holds exactly ``digest``: proven by the cache, else hashed."""
        stamp = stamps.get(key)
        if stamp is None:
            return False
        store = self.store
        cached = store.digests.lookup(store.cache_key(key), stamp)
        if cached is None:
            found = store.hash_object(key)
            if found is None:
                return False
            cached, read_stamp = found
            store.digests.remember(store.cache_key(key), read_stamp, cached)
        return cached == digest


@dataclass
class _Upload:
    """One ``put_version`` under way: what it sends against what is stored."""

    versions: Versions
    result: UploadResult
    manifest: Manifest
    stored: Manifest | None
    kept: bool  # write-once: the stored manifest stays as it is

    def send(self, rel: str, path: Path, stamps: dict[str, Stamp], progress: Progress | None) -> None:
        """Send one file unless the stored bytes are proven equal; before the first file sent, the
        lock is proven, stale multipart uploads are aborted and the version made incomplete."""
        store, result = self.versions.store, self.result
        prefix = f"{result.model}/{result.version}/"
        key = prefix + rel
        digest = self.manifest.files[rel]["sha256"]
        known = self.stored.files.get(rel, {}).get("sha256") if self.stored else store.stored_digest(key)
        if known == digest and self.versions.stored_matches(key, digest, stamps):
            result.skipped.append(rel)
            return
        if not result.sent:
            self.versions.session.fence(result.model, prefix)  # before aborting stale uploads
            store.before_upload(prefix)
            if self.stored is not None and not self.kept:  # the version is incomplete from here
                store.delete(prefix + MANIFEST)
        store.put_file(key, path, digest, progress)
        result.sent.append(rel)
        result.bytes_sent += int(self.manifest.files[rel]["size"])
