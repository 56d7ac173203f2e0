"""The model folder is one closed, verified unit: the only entries allowed under ``<model>/``.

Triton reads more of a model folder than the version it loads, so checking that version's files is
not enough.  What Triton 2.51 and its backends read for a model (core's repository scan, the python
stub's import system, each backend's file parameters):

- ``<model>/config.pbtxt`` -- the model's config (mlreg's own; recorded in every manifest);
- ``<model>/<n>/`` -- every version folder (core localizes the *whole* model folder from S3, every
  version in it; a version folder's name is an integer);
- the python stub puts the *model* folder on ``sys.path`` and imports ``<version>.model``: Python
  prefers a module ``<model>/<version>.py`` (or a package ``<version>/__init__.py``, a sourceless
  ``<version>.pyc``, an extension module) over the namespace folder ``<version>/``, and any other
  module there (``numpy.py``) shadows the one the model imports: *every* file under ``<model>/`` is
  code Triton may run;
- files a config names: ``label_filename`` (beside the config), warmup ``input_data_file`` (under
  ``warmup/``) and the python backend's ``EXECUTION_ENV_PATH``.

mlreg writes exactly two kinds of entry there: the config, and version folders whose manifest
(``.mlreg-manifest.json``, written last) lists every file.  So the allow-list is, and nothing else:

1. ``config.pbtxt``;
2. ``<n>/...`` (``n`` a canonical integer: no ``09``) whose manifest is readable and lists the file,
   plus mlreg's own files there: the manifest, the signature beside it, the empty ``__pycache__``
   guard a local store keeps and Python's bytecode caches under ``__pycache__/`` (dropped before
   the version loads: :func:`pipelines.storage.verify.bytecode_cache`).

Labels and initial-state data files are never stored by mlreg (nothing covers them): ``validate``
refuses a config that names one (:mod:`registry.contracts.file_refs`; core joins the name to the
model folder as given, so ``../../etc/passwd`` would leave it), and a planted one is an unexpected
entry.  A version folder whose manifest parses is still not *registered*: a load names only
versions this run held to MLflow's ``artifact_digest`` (``Versions.verify_load``; an ensemble's,
whose folders Triton never reads, excepted), and ``status`` names a manifest the registry does not
know (:func:`pipelines.promote.integrity.unregistered_problems`).  A folder mlreg cannot list is an
unexpected entry too (Triton, maybe another user, may read it).
An ``EXECUTION_ENV_PATH`` must name a file of a version folder this very load verifies
(:func:`env_problems`; ``validate`` refuses one naming a version folder the model lacks).

Anything else -- ``<model>/9.py``, ``foo.pth``, ``__init__.py``, a subfolder, a version folder
without a manifest (``99/``: an upload that did not finish, or not mlreg's), a file in a version
folder its manifest does not list, and on a local store a symbolic link, a hard link (its bytes can
change through a name mlreg does not watch), a FIFO or an empty folder -- is *unexpected*, and
refuses every load of the model (promotion, rollback, undo, retention's bring-back, ``mlreg
deployments``), ``mlreg store verify`` and ``mlreg status`` name it.

Cost: one listing of the model folder (which replaces the version folder's own listing in
:func:`pipelines.storage.verify.check_version`), one small read per other version's manifest, and
the config read only where it names an execution environment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pipelines.storage.manifest import MANIFEST, Manifest, Stamp, parse_manifest
from pipelines.storage.objects import CONFIG, ObjectStore
from registry.errors import ContractError
from registry.signing import SIGNATURE_FILE

VERSION_FOLDER = re.compile(r"0|[1-9][0-9]{0,18}")  # how mlreg names one (Triton reads an int64)
ENTRY = "entry"  # FileProblem.problem of an unexpected entry
ENV_KEY = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
GUARD = "__pycache__"  # pipelines.storage.verify.BYTECODE_GUARD (the leaf cannot import verify)


def is_version_folder(name: str) -> bool:
    return VERSION_FOLDER.fullmatch(name) is not None


def own_file(rel: str) -> bool:
    """mlreg's own files inside a version folder (``rel`` relative to it): the manifest, the
    signature, the bytecode guard and Python's bytecode caches."""
    parts = rel.split("/")
    return (
        rel in {MANIFEST, SIGNATURE_FILE}
        or parts[-1] == GUARD
        or (GUARD in parts[:-1] and parts[-1].endswith(".pyc"))
    )


def version_of(model: str, key: str) -> str | None:
    """The version folder ``key`` lies in (``<model>/<n>/...``), else None."""
    parts = key[len(model) + 1 :].split("/", 1)
    return parts[0] if len(parts) == 2 and is_version_folder(parts[0]) else None


def manifests(
    store: ObjectStore, model: str, stamps: Mapping[str, Stamp], skip: Iterable[str] = ()
) -> dict[str, Manifest | None]:
    """The manifest of every version folder in ``stamps`` (None: none readable), but ``skip``."""
    skipped = set(skip)
    found: dict[str, Manifest | None] = {}
    for key in stamps:
        version = version_of(model, key)
        if version is None or version in found or version in skipped:
            continue
        present = f"{model}/{version}/{MANIFEST}" in stamps
        found[version] = parse_manifest(store.read(f"{model}/{version}/{MANIFEST}"))[0] if present else None
    return found


def unexpected(
    model: str,
    stamps: Mapping[str, Stamp],
    odd: Iterable[tuple[str, str]],
    versions: Mapping[str, Manifest | None],
    checked: Iterable[str] = (),
) -> list[tuple[str, str]]:
    """(path under the model folder, why) of every entry the allow-list does not hold.  ``versions``:
    the manifest of each version folder; ``checked``: versions whose own files the caller compares
    with their manifest (only what lies outside them is judged here); ``odd``: entries the listing
    found that are not plain files (a local store's links, FIFOs, empty folders)."""
    skip = set(checked)
    found: dict[str, str] = {rel: why for rel, why in odd}
    folders_named: set[str] = set()
    prefix = f"{model}/"
    for key in sorted(stamps):
        rel = key[len(prefix) :]
        if rel == CONFIG or ((rel.endswith("/") or not rel) and int(stamps[key][0]) == 0):
            continue  # the config; an S3 "folder" marker (no bytes: an empty folder where localized)
        top, _, inside = rel.partition("/")
        if not inside:
            found.setdefault(rel, _beside_why(rel))
        elif not is_version_folder(top):
            found.setdefault(rel, _folder_why(top))
        elif top in skip:
            continue
        elif (manifest := versions.get(top)) is None:
            if top not in folders_named:
                folders_named.add(top)
                found.setdefault(
                    f"{top}/", "is a version folder without a readable manifest: nobody verified its files"
                )
        elif inside not in manifest.files and not own_file(inside):
            found.setdefault(rel, f"is not listed in the manifest of {top}/")
    return sorted(found.items())


def _beside_why(rel: str) -> str:
    if rel.endswith((".py", ".pyc", ".so", ".pth")) or rel == "__init__.py":
        return (
            "lies beside the version folders, where Triton's python stub imports modules from "
            "(it puts the model folder on sys.path): code nobody verified"
        )
    return "lies beside the version folders: only config.pbtxt may"


def _folder_why(top: str) -> str:
    if top.isdigit():
        return (
            f"is in {top}/, a version folder name with a leading zero (or not ASCII digits): Triton 2.51 "
            f"ignores it, and mlreg never writes one (version {int(top)} is {int(top)}/)"
        )
    return f"is in the folder {top}/, which mlreg never writes (Triton or a model may read it)"


# -- what a load config names ---------------------------------------------------------------------


def policy_versions(config_text: str | None, present: Iterable[str]) -> tuple[str, ...]:
    """Every version a load with ``config_text`` makes Triton read (core's version_policy): the
    ``specific`` ones; ``all``: every version folder ``present``; ``latest`` (the default, 1):
    the highest ones.  A config that cannot be parsed names nothing (Triton refuses it)."""
    if not config_text:
        return ()
    from registry.contracts.config import parse_config  # lazy: protobuf + tritonclient's config

    try:
        policy = parse_config(config_text).version_policy
    except ContractError:
        return ()
    folders = sorted((v for v in present if is_version_folder(v)), key=int)
    kind = policy.WhichOneof("policy_choice")
    if kind == "specific":
        return tuple(str(v) for v in sorted(policy.specific.versions))
    if kind == "all":
        return tuple(folders)
    latest = max(1, policy.latest.num_versions) if kind == "latest" else 1
    return tuple(folders[-latest:])


def runs_no_code(config_text: str | None) -> bool:
    """Whether a load with ``config_text`` reads nothing of its version folders (an ensemble: core
    runs its steps from the config alone, no backend opens the folder)."""
    if not config_text or "ensemble" not in config_text:
        return False
    from registry.contracts.config import parse_config  # lazy: protobuf + tritonclient's config

    try:
        config = parse_config(config_text)
    except ContractError:
        return False
    return config.platform == "ensemble" and not config.backend


# -- EXECUTION_ENV_PATH ---------------------------------------------------------------------------


def env_path(config_text: str | None) -> str | None:
    """The ``EXECUTION_ENV_PATH`` a config names (None: none); the config parsed only when its text
    mentions one."""
    if not config_text or ENV_KEY not in config_text:
        return None
    from registry.contracts.config import parse_config  # lazy: protobuf + tritonclient's config

    try:
        config = parse_config(config_text)
    except ContractError:  # a config Triton cannot parse loads nothing at all
        return None
    parameter = config.parameters.get(ENV_KEY)
    return parameter.string_value if parameter is not None and parameter.string_value else None


def env_problems(
    model: str, config_text: str | None, loading: Iterable[str], versions: Mapping[str, Manifest | None]
) -> list[tuple[str, str]]:
    """(path, why) when the config's ``EXECUTION_ENV_PATH`` does not name a file of one of the
    versions this load verifies (``loading``), listed in that version's manifest."""
    value = env_path(config_text)
    if value is None:
        return []
    loaded = set(loading)
    rest = value[len(MODEL_DIRECTORY) + 1 :] if value.startswith(MODEL_DIRECTORY + "/") else None
    top, _, inside = (rest or "").partition("/")
    manifest = versions.get(top)
    if rest is None or not is_version_folder(top) or ".." in inside.split("/"):
        why = "lies outside the model's version folders"
    elif top not in loaded:
        why = (
            f"lies in version folder {top}/, which this load does not load nor verify "
            f"(it loads v{', v'.join(sorted(loaded, key=int))}): the archive's bin/activate would run "
            "unverified"
        )
    elif manifest is None or inside not in manifest.files:
        why = f"is not a file listed in the manifest of {top}/"
    else:
        return []
    return [(f"config.pbtxt {ENV_KEY} '{value}'", why)]


def folder_entries(store: ObjectStore, model: str, loading: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(path under the model folder, why) of every unexpected entry of ``<model>/`` -- nothing
    hashed: one listing, each version's manifest read, the config read where it names an execution
    environment (judged against ``loading``, the versions the store's config serves)."""
    stamps, odd = store.model_entries(model)
    versions = manifests(store, model, stamps)
    found = unexpected(model, stamps, odd, versions)
    if f"{model}/{CONFIG}" in stamps and loading:
        data = store.read(f"{model}/{CONFIG}")
        found += env_problems(model, data.decode("utf-8", "replace") if data else None, loading, versions)
    return found
