"""The no-op's repair of a re-pointed ensemble's ``promoted_<env>`` stamps (issue 45, item 6).

A promotion of a member re-points every ensemble over it and registers the re-pointed config as a
new ensemble version, stamped ``promoted_<env>`` by ``record``.  When the attempt fails and its
undo cannot put that stamp back (MLflow down during the replay), the stamp outlives the attempt:
retention and ``rollback`` rank versions by it, so the never-served ensemble version reads as the
newest that served.  ``record.repair_record`` repairs the models the rerun names (and, for an
ensemble, its members); a rerun of the *member* that serves never named the ensemble.

Here the stamps are compared with what serves: the no-op holds only where every target serves the
store's configs, so the store's ensemble config pins what serves.  For each store ensemble over
the rerun's models, its stamped versions are read newest first; the newest whose registered pins
are the served ones is the version that serves, and every stamp newer than its own is a failed
attempt's: removed.  When no stamped version pins what serves, nothing is removed (no proof of
which stamp is whose).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path

from pipelines.core.plan import ensemble_pins, ensembles_pinning
from pipelines.core.ports import RegistryEditor, RegistryReader, RegistryWriter
from pipelines.storage import locking
from pipelines.storage.base import Repository
from pipelines.storage.session import StoreSession
from registry.contracts.config import CONFIG_NAME
from registry.errors import MlregError
from registry.settings import Settings

log = logging.getLogger(__name__)
MAX_STAMPED = 20  # stamped versions of one ensemble read back (each is one registry fetch)


def repair_lock_names(store: Repository, serving: Mapping[str, str]) -> list[str]:
    """The models whose lock the repair holds (issue 45 review, F1): the models that serve and the
    store ensembles over them, sorted as ``resolve`` takes its locks."""
    return sorted({*serving, *ensembles_pinning(store, serving)})


def hold_repair_locks(stack: ExitStack, store: StoreSession, names: Iterable[str], settings: Settings) -> str:
    """Take each lock of ``names`` into ``stack`` under the one lock policy (no wait); '' when all
    are held, else why the repair is skipped (a lock another writer holds, or the store down):
    the no-op then writes nothing, since a promotion running now may be changing what serves."""
    for name in names:
        if name in store.leases:  # held already by this promotion (resolve's locks): kept as they are
            continue
        try:
            stack.enter_context(locking.held(store, name, settings))
        except MlregError as exc:
            return f"registry repair skipped (nothing changed): {name}'s lock not taken: {exc.message}"
    return ""


def repair_ensemble_stamps(
    registry: RegistryEditor, store: Repository, env_name: str, models: Iterable[str], workdir: Path
) -> list[str]:
    """Remove the ``promoted_<env_name>`` stamps newer than the serving version's from every store
    ensemble pinning one of ``models`` (see the module's docstring); what was removed, one line
    each.  MLflow or the store unreachable: a warning, the no-op still holds."""
    tag = f"promoted_{env_name}"
    repaired: list[str] = []
    try:
        for name, text in ensembles_pinning(store, models).items():
            served = ensemble_pins(text)
            if any(int(pin) <= 0 for pin in served.values()):
                continue  # following a latest version: not a served state a stamp can match
            repaired.extend(_repair_one(registry, name, served, tag, workdir))
    except MlregError as exc:
        log.warning("could not check the '%s' stamps of the ensembles in MLflow: %s", tag, exc)
    return repaired


def _repair_one(
    registry: RegistryEditor, name: str, served: dict[str, str], tag: str, workdir: Path
) -> list[str]:
    stamped = sorted(
        (
            (str(dict(getattr(v, "tags", None) or {}).get(tag, "")), str(v.version))
            for v in registry.find_by_tag(name, tag, "%", like=True)
        ),
        reverse=True,
    )[:MAX_STAMPED]
    newer: list[tuple[str, str]] = []
    for stamp, version in stamped:
        if _registered_pins(registry, name, version, workdir) == served:
            return [_removed(registry, name, v, tag, s) for s, v in newer]
        newer.append((stamp, version))
    return []  # no stamped version pins what serves: no proof which stamp is a failed attempt's


def _registered_pins(registry: RegistryReader, name: str, version: str, workdir: Path) -> dict[str, str]:
    folder = workdir / f"stamps-{name}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    registry.fetch_version(name, version, folder)
    return ensemble_pins((folder / CONFIG_NAME).read_text())


def _removed(registry: RegistryWriter, name: str, version: str, tag: str, stamp: str) -> str:
    registry.delete_version_tag(name, version, tag)
    return f"tag {tag} of {name} v{version} (a failed attempt's, {stamp}: it never served) removed"
