"""A fenced promotion's upload, removed by the lock's next holder (issue 45, item 8).

A promotion that lost its lock (its lease ran out while it was frozen or cut off, and another
promotion took the lock over) writes nothing any more -- its undo included -- so a version folder
it uploaded, new to the store, stays under the prefix Triton reads: litter nobody owns.

Proof of ownership, written before the upload while the lock is held: a marker object at the
store's root, beside the lock objects (Triton reads only folders there), named
``.mlreg-upload.<model>.<version>.json`` and holding the uploader's lock owner and lease token.  It
is removed when the upload is no litter: by ``record`` once the promotion succeeded, by the undo
once it removed the folder.  A marker left behind is a promotion's that never finished either way.

The lock's next holder (a promotion, in ``resolve``, under the locks it took) reads the marker of
each version of its models that the store does not serve (no config lists it, no ensemble pins
it): one whose token is not its own lease's was written by a promotion that no longer holds the
lock -- fenced, or killed -- so the folder it names was that promotion's upload, new to the store:
removed, with its marker.  A marker of a version that serves now is only dropped (the version is
no litter).  Nothing else is ever removed: no marker, no removal; a marker that does not parse is
left and named.

"Serves" is asked of the replicas too, not only of the store's configs (issue 45 review, F4): a
promotion fenced during its canary gate leaves its candidate loaded there (its undo writes nothing),
while the store's config still lists only the serving version.  A version any replica reports
READY, LOADING or UNLOADING (its own name or the gate's private one) is kept, marker included;
while a replica cannot be asked, no upload of the model is removed (deferred, said so).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping

from pipelines.core.plan import ensemble_pins, ensembles_pinning, serving_versions
from pipelines.storage.base import Repository
from registry.errors import MlregError

log = logging.getLogger(__name__)
MARKER = ".mlreg-upload.{model}.{version}.json"
MAX_MARKER_BYTES = 4096  # a marker is ~150 bytes; anything bigger is not one of ours
LIVE_STATES = frozenset({"READY", "LOADING", "UNLOADING"})  # a replica holds (or is getting) its files
PRIVATE_MARK = "__mlreg"  # the quality gate's private name for a candidate: <model>__mlreg_quality
# url -> model -> version -> state, or the error that kept the replica from answering
Replicas = Mapping[str, "dict[str, dict[str, str]] | MlregError"]


def marker_key(model: str, version: str) -> str:
    return MARKER.format(model=model, version=version)


def note_upload(store: Repository, model: str, version: str) -> None:
    """Before ``model/version`` is uploaded new to the store: the marker naming this promotion's
    lease (none without a held lock: a write nobody could fence is not a promotion's)."""
    lease = store.session.leases.get(model)
    if lease is None:
        return
    body = {"model": model, "version": version, "owner": lease.owner, "token": lease.token, "at": time.time()}
    store.objects.write(marker_key(model, version), json.dumps(body).encode("utf-8"))


def forget_uploads(store: Repository, uploads: Iterable[tuple[str, str]]) -> list[str]:
    """The markers of ``uploads`` (model, version) removed: the promotion finished (or put its
    upload back).  A marker that cannot be removed now is a note; its owner's token proves it
    belongs to nobody once the lock is let go, and the version serves: only the marker goes then."""
    notes = []
    for model, version in uploads:
        try:
            store.objects.delete(marker_key(model, version))
        except MlregError as exc:
            notes.append(f"the upload marker of {model}/{version} stays in {store.uri}: {exc.message}")
    return notes


def live_on_replicas(replicas: Replicas, model: str) -> tuple[set[str], list[str]]:
    """The versions of ``model`` some replica holds or loads (under its name or the gate's private
    one), and the replicas that could not be asked."""
    live: set[str] = set()
    unknown: list[str] = []
    for url, states in replicas.items():
        if isinstance(states, MlregError):
            unknown.append(url)
            continue
        for name, versions in states.items():
            if name == model or name.startswith(f"{model}{PRIVATE_MARK}"):
                live |= {v for v, state in versions.items() if v and state in LIVE_STATES}
    return live, unknown


def remove_fenced_uploads(store: Repository, models: Iterable[str], replicas: Replicas) -> list[str]:
    """Under this process's locks of ``models``: every version folder a promotion that no longer
    holds the lock uploaded and never finished, removed (see the module's docstring) unless a
    replica of ``replicas`` (url -> what it holds) holds it; one line each, for the report."""
    lines: list[str] = []
    for model in sorted(set(models)):
        lease = store.session.leases.get(model)
        if lease is None:  # not held here: nobody else's promotion is proven finished
            continue
        live, unknown = live_on_replicas(replicas, model)
        if unknown and any(
            store.objects.read(marker_key(model, v)) is not None for v in store.list_versions(model)
        ):
            lines.append(
                f"upload markers of {model} not checked: {', '.join(sorted(unknown))} cannot be asked what "
                "it serves, so no upload is removed now (the next promotion or 'mlreg store gc' does)"
            )
            continue
        try:
            served = set(serving_versions(store.read_config(model)))
            served |= {
                ensemble_pins(text).get(model, "") for text in ensembles_pinning(store, [model]).values()
            }
        except MlregError as exc:  # what serves is unknown: nothing is removed
            log.warning("upload markers of %s not checked: %s", model, exc.message)
            continue
        for version in store.list_versions(model):
            lines.extend(_one(store, model, version, lease.token, version in served, version in live))
    return lines


def _one(store: Repository, model: str, version: str, token: str, served: bool, live: bool) -> list[str]:
    key = marker_key(model, version)
    raw = store.objects.read(key)
    if raw is None:
        return []
    marker = _parsed(raw, model, version)
    if marker is None:
        return [f"{store.uri}: {key} is not an upload marker mlreg wrote: left as it is (remove it by hand)"]
    owner, theirs = marker
    if theirs == token:
        return []  # this promotion's own (a rerun within it): never litter
    if live and not served:  # a fenced canary still holds it: its files stay, so does the proof
        return [
            f"{model}/{version} (uploaded by {owner}'s promotion, which lost its lock) kept in {store.uri}: "
            "a replica still holds it; 'mlreg status' names where -- put that replica back, then rerun"
        ]
    if served:
        store.objects.delete(key)  # the version serves: no litter, only a stale marker
        return []
    store.versions.delete_version(model, version)
    store.objects.delete(key)
    return [
        f"{model}/{version} removed from {store.uri}: uploaded by {owner}'s promotion, which lost its lock "
        "before it finished (a fenced promotion writes nothing, its undo included)"
    ]


def _parsed(raw: bytes, model: str, version: str) -> tuple[str, str] | None:
    """(owner, token) of a marker naming ``model/version``; None for anything else (bounded)."""
    if len(raw) > MAX_MARKER_BYTES:
        return None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("model") != model or str(body.get("version")) != version:
        return None
    owner, token = body.get("owner"), body.get("token")
    if not isinstance(owner, str) or not isinstance(token, str) or not token or len(owner) > 300:
        return None
    return owner, token
