"""`mlreg status`'s read of the store (and `mlreg store ls`'s): each model's config, the versions it
serves and the folders missing, through a client that gives up within seconds (``status_store``);
a store that cannot be read leaves every view unknown, carrying why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.core.plan import config_facts, serving_versions
from pipelines.storage import open_store
from pipelines.storage.base import Repository
from registry.errors import StorageError

# A frozen S3 accepts connections and never answers: the promotion's client waits 60 s a request,
# four times; status reads a few small objects, and what the servers say must not wait on them.
STORE_READ_TIMEOUT_S = 5.0
STORE_RETRIES = 1
STORE_FIX = (
    "what each replica serves is read from Triton, not the store: check that {uri} answers "
    "(endpoint up, credentials valid), then rerun 'mlreg status' for the desired versions and locks"
)


@dataclass
class StoreView:
    """One model as the store holds it."""

    config: str | None
    desired: list[str]  # the versions its config serves
    missing: list[str]  # of those, versions with no folder in the store
    error: str = ""  # why the store could not be read ("": it was; then nothing above is known)

    @property
    def is_ensemble(self) -> bool:
        return self.config is not None and config_facts(self.config).is_ensemble


def read_store(store: Repository, names: list[str]) -> dict[str, StoreView]:
    views = {}
    for model in names:
        config = store.read_config(model)
        desired = serving_versions(config)
        present = set(store.list_versions(model)) if desired else set()
        views[model] = StoreView(config, desired, [v for v in desired if v not in present])
    return views


def status_store(uri: str | Path, digest_cache: Path | None = None) -> Repository:
    """The environment's store for status's reads (and `mlreg store ls`'s): on S3, a request is
    given up after ``STORE_READ_TIMEOUT_S`` and retried ``STORE_RETRIES`` times (seconds, not
    minutes)."""
    return open_store(uri, digest_cache=digest_cache, patience=(STORE_READ_TIMEOUT_S, STORE_RETRIES))


def read_views(store: Repository, names: list[str], why: str = "") -> tuple[dict[str, StoreView], str]:
    """``read_store``; when the store cannot be read (or ``why`` says it could not), every view
    is unknown and carries why (the store is not asked again)."""
    if not why:
        try:
            return read_store(store, names), ""
        except StorageError as exc:
            why = exc.message
    return {model: StoreView(None, [], [], error=why) for model in names}, why


def listed_models(store: Repository) -> tuple[list[str], str]:
    """The store's models, and why it could not list them ("" when it could)."""
    try:
        return store.list_models(), ""
    except StorageError as exc:
        return [], exc.message


def views_with_config(views: dict[str, StoreView]) -> set[str]:
    return {m for m, v in views.items() if v.config is not None}
