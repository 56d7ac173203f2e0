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
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

from pipelines.promote.plan import ensemble_pins, ensembles_pinning, serving_versions
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError

log = logging.getLogger(__name__)
MARKER = ".mlreg-upload.{model}.{version}.json"
MAX_MARKER_BYTES = 4096  # a marker is ~150 bytes; anything bigger is not one of ours


def marker_key(model: str, version: str) -> str:
    return MARKER.format(model=model, version=version)


def note_upload(store: RepositoryStore, model: str, version: str) -> None:
    """Before ``model/version`` is uploaded new to the store: the marker naming this promotion's
    lease (none without a held lock: a write nobody could fence is not a promotion's)."""
    lease = store.leases.get(model)
    if lease is None:
        return
    body = {"model": model, "version": version, "owner": lease.owner, "token": lease.token, "at": time.time()}
    store.write(marker_key(model, version), json.dumps(body).encode("utf-8"))


def forget_uploads(store: RepositoryStore, uploads: Iterable[tuple[str, str]]) -> list[str]:
    """The markers of ``uploads`` (model, version) removed: the promotion finished (or put its
    upload back).  A marker that cannot be removed now is a note; its owner's token proves it
    belongs to nobody once the lock is let go, and the version serves: only the marker goes then."""
    notes = []
    for model, version in uploads:
        try:
            store.delete(marker_key(model, version))
        except MlregError as exc:
            notes.append(f"the upload marker of {model}/{version} stays in {store.uri}: {exc.message}")
    return notes


def remove_fenced_uploads(store: RepositoryStore, models: Iterable[str]) -> list[str]:
    """Under this process's locks of ``models``: every version folder a promotion that no longer
    holds the lock uploaded and never finished, removed (see the module's docstring); one line
    each, for the report."""
    lines: list[str] = []
    for model in sorted(set(models)):
        lease = store.leases.get(model)
        if lease is None:  # not held here: nobody else's promotion is proven finished
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
            lines.extend(_one(store, model, version, lease.token, version in served))
    return lines


def _one(store: RepositoryStore, model: str, version: str, token: str, served: bool) -> list[str]:
    key = marker_key(model, version)
    raw = store.read(key)
    if raw is None:
        return []
    marker = _parsed(raw, model, version)
    if marker is None:
        return [f"{store.uri}: {key} is not an upload marker mlreg wrote: left as it is (remove it by hand)"]
    owner, theirs = marker
    if theirs == token:
        return []  # this promotion's own (a rerun within it): never litter
    if served:
        store.delete(key)  # the version serves: no litter, only a stale marker
        return []
    store.delete_version(model, version)
    store.delete(key)
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
