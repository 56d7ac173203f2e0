"""Checking a stored version's bytes against its manifest and the digest registered in MLflow.

Called through :meth:`Versions.verify_version` (raises) and
:meth:`Versions.check_version` (reports).  What is checked, in order:

1. the manifest exists and its ``digest`` field matches its own contents (an edited manifest);
2. the manifest's digest equals ``expected_digest`` (MLflow's ``artifact_digest``), when given;
3. every file it lists is stored with its size and sha256, and no other file is stored (a file
   Triton would read that nobody registered); locally, no link in the version leaves the model;
4. (``closed_world``, the default) nothing else is under the model folder either: one listing of
   ``<model>/`` judged against the allow-list of :mod:`pipelines.storage.closed_world` (each entry
   outside it a problem ``entry`` naming it), and the config's ``EXECUTION_ENV_PATH`` inside a
   version folder this load verifies (``loading``: the versions the load names, default this one).

Digests are reused from the cache only for a stamp that proves the bytes unchanged (see
:mod:`pipelines.storage.base`); everything else is read and hashed once, and remembered.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.storage import closed_world as world
from pipelines.storage.closed_world import ENTRY
from pipelines.storage.manifest import MANIFEST, Manifest, Stamp, parse_manifest
from pipelines.storage.objects import CONFIG, ObjectStore
from registry.errors import StorageError
from registry.signing import SIGNATURE_FILE  # a version's signature, beside its manifest

HASHING = ("all", "changed", "none")
MAX_NAMED = 10
ENTRIES_FIX = (
    "remove each entry named from the store's {model}/ folder: mlreg writes only config.pbtxt and "
    "version folders with a manifest there, and Triton may read or run anything else (a version "
    "folder without a manifest is an upload that did not finish: 'mlreg store repair {model} "
    "VERSION' puts a registered version back); then check with 'mlreg store verify {model}'"
)


@dataclass(frozen=True)
class FileProblem:
    file: str  # path inside the version folder (or the manifest's name)
    problem: str  # missing | size | sha256 | unexpected | link | manifest | unreadable | digest | incomplete
    expected: str = ""
    actual: str = ""

    def line(self) -> str:
        what = {
            "missing": "is missing from the store",
            "size": "changed size",
            "sha256": "changed: its sha256 differs from the manifest",
            "unexpected": "is stored but not in the manifest",
            "link": "is a link leaving the model folder",
            "manifest": "was edited: its digest field does not match its contents",
            "digest": "does not match the digest registered in MLflow",
            "incomplete": "is missing: the version is incomplete (an upload did not finish)",
            "unreadable": "is unreadable (truncated or not JSON): nothing of the version can be checked",
            "signature": "was changed after it was written: it differs from the signature registered "
            "in MLflow",
        }.get(self.problem, self.problem)
        if self.problem == ENTRY:  # an entry of the model folder outside the allow-list: why
            return f"{self.file} {self.actual}"
        detail = f" (expected {self.expected}, found {self.actual})" if self.expected or self.actual else ""
        return f"{self.file} {what}{detail}"

    def to_dict(self) -> dict[str, str]:
        return {"file": self.file, "problem": self.problem, "expected": self.expected, "actual": self.actual}


@dataclass
class Verification:
    store: str
    model: str
    version: str
    digest: str | None = None  # the manifest's version digest
    files: int = 0
    bytes: int = 0
    hashed_bytes: int = 0  # bytes read and hashed by this check
    reused: int = 0  # files whose digest the cache proved
    unverified: list[str] = field(default_factory=list)  # files not hashed (hashing="none")
    problems: list[FileProblem] = field(default_factory=list)
    bytecode: list[str] = field(default_factory=list)  # keys of Python bytecode caches (never hashed)
    note: str = ""  # what was not compared, and why (e.g. a version MLflow does not know)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unverified

    @property
    def entries(self) -> list[FileProblem]:
        """The unexpected entries of the model folder (closed_world)."""
        return [p for p in self.problems if p.problem == ENTRY]

    @property
    def status(self) -> str:
        """verified | corrupt | corrupt manifest | incomplete | unverified | unexpected entries."""
        if self.problems and len(self.entries) == len(self.problems):
            return "unexpected entries"
        if any(p.problem == "incomplete" for p in self.problems):
            return "incomplete"
        if any(p.problem == "unreadable" for p in self.problems):
            return "corrupt manifest"
        if self.problems:
            return "corrupt"
        return "unverified" if self.unverified else "verified"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "status": self.status,
            "digest": self.digest,
            "files": self.files,
            "bytes": self.bytes,
            "hashed_bytes": self.hashed_bytes,
            "reused": self.reused,
            "unverified": self.unverified,
            "problems": [p.to_dict() for p in self.problems],
            **({"note": self.note} if self.note else {}),
        }

    def raise_if_bad(self) -> None:
        """StorageError naming every bad file (the first ``MAX_NAMED``) unless all is verified."""
        if not self.problems:
            return
        where = f"{self.store}: {self.model}/{self.version}"
        lines = [p.line() for p in self.problems[:MAX_NAMED]]
        if len(self.problems) > MAX_NAMED:
            lines.append(f"... and {len(self.problems) - MAX_NAMED} more")
        fix = (
            f"put the registered bytes back ('mlreg store repair {self.model} {self.version}'; a "
            "promotion of this version re-sends every file whose stored bytes differ), then check "
            f"with 'mlreg store verify {self.model} {self.version}'"
        )
        if self.entries:
            fix = (
                f"{ENTRIES_FIX.format(model=self.model)}; {fix}"
                if len(self.entries) < len(self.problems)
                else (ENTRIES_FIX.format(model=self.model))
            )
        raise StorageError(
            f"{where} does not match what was registered; refusing to use it:\n  " + "\n  ".join(lines),
            fix=fix,
            model=self.model,
            version=self.version,
            files=[p.file for p in self.problems],
            entries=[p.file for p in self.entries],  # of the model folder, outside the allow-list
        )


def check_version(
    store: ObjectStore,
    model: str,
    version: str,
    expected_digest: str | None = None,
    hashing: str = "changed",
    *,
    closed_world: bool = True,
    loading: tuple[str, ...] = (),
) -> Verification:
    """See :meth:`Versions.check_version`."""
    if hashing not in HASHING:
        raise ValueError(f"hashing must be one of {HASHING}")
    result = Verification(store.uri, model, version)
    prefix = f"{model}/{version}/"
    with ThreadPoolExecutor(2) as pool:  # the listing, the config's and the manifest's reads, at once
        listing = pool.submit(_listing, store, model, prefix, closed_world)
        config = pool.submit(store.read, f"{model}/{CONFIG}") if closed_world else None
        manifest, unreadable = parse_manifest(store.read(prefix + MANIFEST))
        everything, odd = listing.result()
        text = _text(config.result()) if config is not None else None
    stamps = {k: s for k, s in everything.items() if k.startswith(prefix)} if closed_world else everything
    if closed_world:
        _closed_world(store, model, version, (manifest, text), everything, odd, loading, result)
    if manifest is None:
        problem = FileProblem(MANIFEST, "unreadable", "a manifest", unreadable) if unreadable else None
        result.problems.insert(0, problem or FileProblem(MANIFEST, "incomplete"))
        return result
    result.digest = manifest.digest
    result.problems.extend(_manifest_problems(manifest, expected_digest))
    if not closed_world:  # the closed world names every link under the model folder
        result.problems.extend(FileProblem(link, "link") for link in store.outside_links(model, version))
    _check_files(store, manifest, prefix, stamps, hashing, result)
    store.digests.save()
    return result


def _listing(
    store: ObjectStore, model: str, prefix: str, closed: bool
) -> tuple[dict[str, Stamp], list[tuple[str, str]]]:
    """The model folder's entries (closed world: one listing), else the version folder's."""
    return store.model_entries(model) if closed else (store.object_stamps(prefix), [])


def _text(data: bytes | None) -> str | None:
    return data.decode("utf-8", "replace") if data is not None else None


def _closed_world(
    store: ObjectStore,
    model: str,
    version: str,
    read: tuple[Manifest | None, str | None],
    stamps: dict[str, Stamp],
    odd: list[tuple[str, str]],
    loading: tuple[str, ...],
    result: Verification,
) -> None:
    """Every entry of the model folder outside the allow-list (closed_world.py), and the config's
    execution environment (``read``: the version's manifest and the config's text) outside the
    versions this load verifies, as ``entry`` problems."""
    manifest, config = read
    versions = world.manifests(store, model, stamps, skip=[version])
    versions[version] = manifest
    found = world.unexpected(model, stamps, odd, versions, checked=[version])
    found += world.env_problems(model, config, loading or (version,), versions)
    result.problems.extend(FileProblem(f"{model}/{rel}", ENTRY, "", why) for rel, why in found)


def _manifest_problems(manifest: Manifest, expected: str | None) -> list[FileProblem]:
    problems = []
    if manifest.recorded_digest is not None and manifest.recorded_digest != manifest.digest:
        problems.append(FileProblem(MANIFEST, "manifest", manifest.recorded_digest, manifest.digest))
    if expected is not None and expected != manifest.digest:
        found = manifest.digest if manifest.config is not None else f"{manifest.digest} (no config recorded)"
        problems.append(FileProblem(MANIFEST, "digest", expected, found))
    return problems


def _check_files(
    store: ObjectStore,
    manifest: Manifest,
    prefix: str,
    stamps: dict[str, Stamp],
    hashing: str,
    result: Verification,
) -> None:
    known = {prefix + f for f in manifest.files} | {prefix + MANIFEST, prefix + SIGNATURE_FILE}
    for rel in sorted(stamps.keys() - known):
        if bytecode_guard(rel):
            if int(stamps[rel][0]) != 0:  # not the empty guard: dropped and made again
                result.bytecode.append(rel)
        elif bytecode_cache(rel):
            result.bytecode.append(rel)
        else:
            result.problems.append(FileProblem(rel[len(prefix) :], "unexpected"))
    for rel, meta in sorted(manifest.files.items()):
        result.files += 1
        result.bytes += int(meta["size"])
        stamp = stamps.get(prefix + rel)
        if stamp is None:
            result.problems.append(FileProblem(rel, "missing"))
        elif int(stamp[0]) != int(meta["size"]):
            result.problems.append(FileProblem(rel, "size", f"{meta['size']} bytes", f"{stamp[0]} bytes"))
        else:
            _check_digest(store, prefix + rel, rel, str(meta["sha256"]), stamp, hashing, result)


BYTECODE_GUARD = "__pycache__"


def bytecode_guard(key: str) -> bool:
    """The empty regular file named ``__pycache__`` a local store keeps in each folder of a
    version that holds Python source (``ObjectStore.guard_bytecode``): Python cannot make its
    cache folder there, so Triton's python stub -- which writes one whatever
    PYTHONDONTWRITEBYTECODE says -- changes nothing in a served version folder, and the next load
    does not re-create that version (Triton re-creates a loaded version whose files changed).
    Never read, never run: not hashed; one that is not empty is dropped and made again."""
    return key.rsplit("/", 1)[-1] == BYTECODE_GUARD


def bytecode_cache(key: str) -> bool:
    """Python's bytecode cache, which Triton's python backend writes into a local store's version
    folder when it loads ``model.py`` (2.51's stub runs its interpreter isolated, so the
    PYTHONDONTWRITEBYTECODE=1 mlreg starts it with is ignored; other servers may not set it): never
    uploaded, never registered, so not "unexpected" either -- but never trusted: Python imports a
    valid cache in place of ``model.py`` (a timestamp .pyc carrying its mtime and size, or an
    unchecked-hash one), so every one is removed right before Triton reads the folder
    (``Versions.drop_bytecode``, ``verify_version(drop_bytecode=True)``)."""
    parts = key.split("/")
    return "__pycache__" in parts[:-1] and parts[-1].endswith(".pyc")


def _check_digest(
    store: ObjectStore,
    key: str,
    rel: str,
    expected: str,
    stamp: Stamp,
    hashing: str,
    result: Verification,
) -> None:
    cache_key = store.cache_key(key)
    actual = store.digests.lookup(cache_key, stamp) if hashing != "all" else None
    if actual is not None:
        result.reused += 1
    elif hashing == "none":
        result.unverified.append(rel)
        return
    else:
        found = store.hash_object(key)
        if found is None:
            result.problems.append(FileProblem(rel, "missing"))
            return
        actual, read_stamp = found
        result.hashed_bytes += int(read_stamp[0])
        store.digests.remember(cache_key, read_stamp, actual)
    if actual != expected:
        result.problems.append(FileProblem(rel, "sha256", f"sha256 {expected}", f"sha256 {actual}"))


# -- write-once versions -------------------------------------------------------------------------


def other_bytes(stored: dict[str, dict[str, Any]], pushed: dict[str, dict[str, Any]]) -> list[str]:
    """One line per file whose bytes differ between a stored version's manifest and the files
    pushed as that version (empty: the same bytes)."""
    lines = []
    for rel in sorted(stored.keys() | pushed.keys()):
        mine, theirs = pushed.get(rel), stored.get(rel)
        if theirs is None:
            lines.append(f"{rel}: not a file of the stored version")
        elif mine is None:
            lines.append(f"{rel}: stored, but not in the folder pushed")
        elif (mine["sha256"], int(mine["size"])) != (theirs["sha256"], int(theirs["size"])):
            stored_sha, pushed_sha = str(theirs["sha256"])[:12], str(mine["sha256"])[:12]
            lines.append(f"{rel}: other bytes (stored sha256 {stored_sha}..., pushed {pushed_sha}...)")
    return lines


def rewrite_refused(uri: str, model: str, version: str, lines: list[str]) -> StorageError:
    """The refusal of a push that would change a version already stored (written once)."""
    named = lines[:MAX_NAMED] + ([f"... and {len(lines) - MAX_NAMED} more"] if len(lines) > MAX_NAMED else [])
    return StorageError(
        f"{uri}: {model} v{version} is already stored with other bytes, and a stored version never "
        "changes; nothing was sent:\n  " + "\n  ".join(named),
        fix=f"register these bytes as a new version of {model} ('mlreg register {model} FOLDER') and push "
        f"or promote that version; to put v{version}'s registered bytes back: "
        f"'mlreg store repair {model} {version}'",
        model=model,
        version=version,
        files=lines,
    )


def root_marker(uri: str) -> bytes:
    """The root marker's contents: what it is for, for whoever finds it in a bucket."""
    return json.dumps(
        {
            "what": "mlreg model repository root (Triton ignores files at the root)",
            "why": "Triton refuses to start on an S3 prefix that holds no object",
            "store": uri,
            "created_at": time.time(),
        },
        indent=1,
    ).encode()
