"""`mlreg status` and `mlreg history`: registry alias vs the store's desired state vs what serves.

``model_status`` composes four reads, each on its own: the store (``read_store``), the servers
(``probe_targets``: model states and each loaded ensemble's pins), MLflow (``read_aliases``),
and the drift rules (``drift``).  A part that cannot be reached is drift, said per target,
within the configured timeouts; the store is read through a client that gives up within seconds
(``status_store``), and a store that does not answer leaves the servers' columns as they are.
A replica's repository index polls the store (a frozen S3 blocks it): it is given
``INDEX_TIMEOUT_S``, then what the replica serves is read from calls on its loaded models
(statistics, ``ModelReady``), the rows marked so (``read_by_readiness``) and the store named.
Every column speaks one numbering, MLflow's versions; the Triton folders they serve from come
beside them (``desired_folders``, ``serving_folders``): a re-pointed ensemble is a new
registered version in its old folder.  A row is a ``ModelRow`` (a target that cannot say what it
serves: ``Unreachable``); its ``to_dict()`` is the row of ``mlreg status --json``.
"""

from __future__ import annotations

import calendar
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.plan import config_facts, ensemble_pins, serving_versions
from pipelines.core.ports import Registry, ServingTarget
from pipelines.fleet.fleet import Fleet, loading_versions, ready_versions
from pipelines.fleet.replicas import Connect, hung_loads, open_control, triton_connector
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.promote.integrity import (
    folder_problems,
    manifest_problems,
    signature_problems,
    unregistered_problems,
)
from pipelines.storage import open_store
from pipelines.storage.base import RepositoryStore
from registry.errors import MlregError, StorageError
from registry.settings import Settings

Serving = dict[str, list[str] | str]  # url -> READY versions, or why the target cannot say

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


def read_store(store: RepositoryStore, names: list[str]) -> dict[str, StoreView]:
    views = {}
    for model in names:
        config = store.read_config(model)
        desired = serving_versions(config)
        present = set(store.list_versions(model)) if desired else set()
        views[model] = StoreView(config, desired, [v for v in desired if v not in present])
    return views


def status_store(uri: str | Path, digest_cache: Path | None = None) -> RepositoryStore:
    """The environment's store for status's reads (and `mlreg store ls`'s): on S3, a request is
    given up after ``STORE_READ_TIMEOUT_S`` and retried ``STORE_RETRIES`` times (seconds, not
    minutes)."""
    return open_store(uri, digest_cache=digest_cache, patience=(STORE_READ_TIMEOUT_S, STORE_RETRIES))


def read_views(store: RepositoryStore, names: list[str], why: str = "") -> tuple[dict[str, StoreView], str]:
    """``read_store``; when the store cannot be read (or ``why`` says it could not), every view
    is unknown and carries why (the store is not asked again)."""
    if not why:
        try:
            return read_store(store, names), ""
        except StorageError as exc:
            why = exc.message
    return {model: StoreView(None, [], [], error=why) for model in names}, why


def listed_models(store: RepositoryStore) -> tuple[list[str], str]:
    """The store's models, and why it could not list them ("" when it could)."""
    try:
        return store.list_models(), ""
    except StorageError as exc:
        return [], exc.message


Pins = dict[str, dict[str, dict[str, str]]]  # url -> ensemble -> member -> version pinned there


# The repository index polls the repository: with S3 frozen, Triton 2.51's blocks while liveness,
# ``ModelReady``, statistics and model config answer in milliseconds -- until an index call is
# made: tritonserver answers these gRPC calls on one thread, and every one of them then waits
# behind the blocked index (inference does not; measured on the pytriton wheel's tritonserver
# with a SIGSTOPed moto_server, H10).  So a store that did not answer status is not followed by an
# index call: what each replica serves is read from the calls on its loaded models (statistics'
# models, ``ModelReady``); an index that blocks all the same is given seconds.
INDEX_TIMEOUT_S = 5.0
# what the store's client says when the endpoint did not answer (an answer -- credentials
# rejected, no such bucket -- says nothing of what Triton reads)
NO_ANSWER = ("ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError")
INDEX_BLOCKED = (
    "unreachable: its control calls did not answer within {seconds:.0f}s (tritonserver answers them on "
    "one thread, behind any repository index call, which blocks while the store it reads, {uri}, does "
    "not answer)"
)
KNOWN_VERSIONS = 16  # a known model's newest registered versions, asked by name
READINESS_CAP = 256  # (model, version) readiness questions per replica, at most
DEADLINE = "StatusCode.DEADLINE_EXCEEDED"
Known = Callable[[], dict[str, set[str]]]  # model -> versions worth asking by name (the alias's)


class ReadinessStates(dict[str, dict[str, str]]):
    """A replica's model states read from its readiness, not its repository index (which did not
    answer within ``INDEX_TIMEOUT_S``): only READY versions are seen (a LOADING or UNAVAILABLE
    one is not)."""


def probe_targets(
    settings: Settings,
    env: Environment,
    store: RepositoryStore,
    ensembles: Sequence[str] | None = (),
    known: Known | None = None,
    store_silent: bool = False,
) -> tuple[dict[str, Any], Pins]:
    """url -> model states, or the reason the target cannot be asked (a string); and, over the
    same connections, the member versions each READY ensemble of ``ensembles`` pins there (None:
    the store cannot say which are ensembles; every READY model is asked, the ensembles kept).
    A target whose repository index does not answer within ``INDEX_TIMEOUT_S`` is read from its
    readiness (``ReadinessStates``): the statistics' models and ``known()``'s, asked by name;
    ``store_silent`` (the store did not answer): every target is, its index never asked."""
    try:
        targets = resolve_targets(settings, env)
    except MlregError as exc:
        return {"local stack" if env.local_stack else "(no target)": f"unreachable: {exc.message}"}, {}
    with Fleet(store, targets, _bounded_connector(settings, env), settings.triton_timeout) as fleet:
        found: dict[str, Any] = dict.fromkeys(targets) if store_silent else fleet.states()
        blocked = [url for url, f in found.items() if f is None or _index_blocked(f)]
        wanted = known() if blocked and known is not None else {}
        read: dict[str, Any] = _read_by_readiness(fleet, blocked, wanted)
        for url, states in read.items():  # what still did not answer waits behind a blocked index
            if isinstance(states, MlregError) and _index_blocked(states):
                read[url] = INDEX_BLOCKED.format(seconds=INDEX_TIMEOUT_S, uri=env.store)
        live = {
            url: f"unreachable: {found.message}" if isinstance(found, MlregError) else found
            for url, found in {**found, **read}.items()
        }
        return live, _live_pins(fleet, live, ensembles)


def store_silent(why: str) -> bool:
    """The store's error says its endpoint did not answer (not that it answered with a refusal)."""
    return any(marker in why for marker in NO_ANSWER)


def _bounded_connector(settings: Settings, env: Environment) -> Connect:
    """The environment's connector, every call (the repository index first) given
    ``INDEX_TIMEOUT_S`` at most: status asks nothing that takes longer on a healthy replica."""
    short = min(settings.triton_timeout, INDEX_TIMEOUT_S)
    bounded = (
        dataclasses.replace(settings, triton_timeout=short)
        if dataclasses.is_dataclass(settings)
        else settings
    )
    return triton_connector(bounded, env.key(settings))


def _index_blocked(exc: object) -> bool:
    """A call ran past its deadline (the replica may still answer by name)."""
    return isinstance(exc, MlregError) and exc.context.get("status") == DEADLINE


def _read_by_readiness(
    fleet: Fleet, urls: Sequence[str], known: dict[str, set[str]]
) -> dict[str, ReadinessStates | MlregError]:
    """What each of ``urls`` serves, read without its repository index, in parallel; a replica
    that does not answer these either is its error (unreachable)."""
    if not urls:
        return {}

    def read(url: str) -> ReadinessStates | MlregError:
        try:
            return _readiness_states(fleet.target(url), known)
        except MlregError as exc:
            return exc

    with ThreadPoolExecutor(max(1, min(16, len(urls)))) as pool:
        return dict(zip(urls, pool.map(read, urls), strict=True))


def _readiness_states(target: ServingTarget, known: dict[str, set[str]]) -> ReadinessStates:
    """The READY versions of every model the statistics list (Triton's loaded models) and of each
    ``known`` model (its loaded config's specific versions, and the versions given), each
    confirmed by ``ModelReady``; bounded by ``READINESS_CAP`` questions.  Raises when the
    replica does not answer (liveness first)."""
    target.is_live()
    asked: dict[str, set[str]] = {m: set(v) for m, v in known.items()}
    try:
        for entry in target.statistics():
            asked.setdefault(str(entry.get("name", "")), set()).add(str(entry.get("version", "")))
    except MlregError:
        pass  # readiness by name still answers for the known models
    for model in known:
        try:
            config = target.model_config(model)
        except MlregError:
            continue  # not loaded there
        specific = config.get("version_policy", {}).get("specific", {}).get("versions", [])
        asked[model].update(str(v) for v in specific)
    pairs = sorted((m, v) for m, vs in asked.items() if m for v in vs if v.isdigit())[:READINESS_CAP]
    states = ReadinessStates()
    for model, version in pairs:
        if target.is_ready(model, version):
            states.setdefault(model, {})[version] = "READY"
    return states


def readiness_read(live: dict[str, Any]) -> list[str]:
    """The targets whose states were read from their readiness, not their repository index."""
    return [url for url, states in live.items() if isinstance(states, ReadinessStates)]


def _live_pins(fleet: Fleet, live: dict[str, Any], ensembles: Sequence[str] | None) -> Pins:
    """What each ensemble loaded on a reachable target pins (-1: the latest), probed in parallel;
    a target that stops answering meanwhile is left out (its states already say so).  ``ensembles``
    None: every READY model is asked, and those with ensemble steps kept."""

    def probe(url: str) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        asked = sorted(live[url]) if ensembles is None else ensembles
        for model in (m for m in asked if ready_versions(live[url], m)):
            try:
                config = fleet.target(url).model_config(model)
            except MlregError:
                break
            steps = config.get("ensemble_scheduling", {}).get("step", [])
            if steps or ensembles is not None:
                found[model] = {s["model_name"]: str(int(s.get("model_version", -1))) for s in steps}
        return found

    urls = [url for url, states in live.items() if not isinstance(states, str)]
    if not urls or (ensembles is not None and not ensembles):
        return {}
    with ThreadPoolExecutor(max(1, min(16, len(urls)))) as pool:
        return dict(zip(urls, pool.map(probe, urls), strict=True))


def pin_drift(stored: dict[str, str], live: Pins, model: str) -> list[str]:
    """Each target whose loaded ensemble pins a member to another version than the store's config."""
    found: list[str] = []
    for url, ensembles in live.items():
        pins = ensembles.get(model)
        if pins is None:
            continue
        found.extend(
            f"{url} pins {member} v{version}, the store's config pins v{stored.get(member, 'nothing')}"
            for member, version in sorted(pins.items())
            if stored.get(member) != version
        )
    return found


def read_aliases(registry: Registry, names: list[str], alias: str) -> tuple[dict[str, str], str]:
    """model -> the version ``alias`` names ("" when none), and why MLflow could not be asked."""
    try:
        registry.ping()
    except MlregError as exc:
        return dict.fromkeys(names, ""), exc.message
    found = {}
    for model in names:
        try:
            found[model] = registry.aliases(model).get(alias, "")
        except MlregError:
            found[model] = ""  # not registered (yet)
    return found, ""


# -- one numbering: MLflow versions, with the Triton folder where it differs ---------------------
#
# A model's registered version N is stored and served as Triton folder N, except an ensemble
# re-pointed by a member's promotion: it is registered as a new version (its ``member_<name>``
# tags record the pins) but keeps its folder.  An ensemble folder's registered version is the one
# whose member pins are the pins that folder's config serves: the alias's version when it agrees
# (the drift rules below say when it does not), else the newest one that does.

UNKNOWN = "?"  # no registered version pins what the folder's config pins (or MLflow unreachable)
Tags = dict[str, dict[str, str]]  # registered version -> its tags


def pin_disagreements(tags: dict[str, str], pins: dict[str, str]) -> list[tuple[str, str, str]]:
    """(member, registered pin, config pin) for each member the version's tags pin otherwise than
    ``pins`` (a config pin of -1, the latest, agrees with any)."""
    found = []
    for key, wanted in sorted(tags.items()):
        member = key.removeprefix("member_")
        stored = pins.get(member)
        if key.startswith("member_") and stored is not None and int(stored) > 0 and stored != wanted:
            found.append((member, wanted, stored))
    return found


def labels(versions: Sequence[str], folders: Sequence[str]) -> str:
    """``2 [1]``: MLflow version 2, served from Triton folder 1 (the folder shown only where it
    differs); several are comma-separated."""
    return ",".join(v if v == f else f"{v} [{f}]" for v, f in zip(versions, folders, strict=True))


@dataclass
class Numbering:
    """Which registered version each Triton folder of one model is."""

    alias: str = ""
    registered: Tags | None = None  # an ensemble's registered versions; None: not an ensemble
    store_pins: dict[str, str] = field(default_factory=dict)  # what the store's config pins
    live_pins: dict[str, dict[str, str]] = field(default_factory=dict)  # url -> pins loaded there

    def versions(self, folders: list[str], url: str = "") -> list[str]:
        """The registered versions of the store's folders (``url`` "") or of a target's."""
        if self.registered is None:
            return list(folders)
        pins = self.live_pins.get(url) if url else self.store_pins
        return [self._version_pinning(pins) for _ in folders]

    def label(self, folders: list[str], url: str = "") -> str:
        return labels(self.versions(folders, url), folders)

    def _version_pinning(self, pins: dict[str, str] | None) -> str:
        if pins is None:
            return UNKNOWN
        matching = [v for v, tags in (self.registered or {}).items() if not pin_disagreements(tags, pins)]
        if self.alias in matching:
            return self.alias
        return max(matching, key=int, default=UNKNOWN)


def numbering(
    registry: Registry, model: str, view: StoreView, alias: str, live_pins: Pins, reachable: bool
) -> Numbering:
    live = {url: pins[model] for url, pins in live_pins.items() if model in pins}
    if not view.is_ensemble and not ((view.error or view.config is None) and live):  # the servers say
        return Numbering(alias)
    registered: Tags = {}
    if reachable:
        try:
            registered = {str(v.version): dict(v.tags or {}) for v in registry.versions(model)}
        except MlregError:
            pass  # every folder is UNKNOWN; the alias's own drift check says why
    stored = ensemble_pins(view.config) if view.config is not None else {}
    return Numbering(alias, registered, stored, live)


# -- drift -----------------------------------------------------------------------------------------


def drift(
    registry: Registry,
    env_alias: str,
    view: StoreView,
    alias: str,
    serving: Serving,
    model: str,
    numbered: Numbering | None = None,
) -> list[str]:
    """What disagrees: the alias and the store, the store and its own folders, the store and each
    target.  Folders are compared; ``numbered`` names them by registered version in the messages."""
    numbered = numbered or Numbering(alias)
    if view.error:  # nothing to compare with: what serves is in the row, and the targets' errors
        unreachable = [f"{url} {folders}" for url, folders in serving.items() if isinstance(folders, str)]
        return [f"store unreachable: {view.error}", *unreachable]
    found: list[str] = []
    if view.is_ensemble:
        # an ensemble's Triton folder keeps its number when it is re-pointed; its registered
        # version changes: compare the member versions the alias's version pins instead
        if alias:
            assert view.config is not None
            found.extend(_pin_drift(registry, model, alias, env_alias, view.config, numbered.registered))
    elif alias and view.desired and view.desired != [alias]:
        found.append(f"alias {env_alias}=v{alias} but the store serves v{','.join(view.desired)}")
    found.extend(
        f"the store has no folder {model}/{v}/ for the version its config serves" for v in view.missing
    )
    wanted = _versions(numbered.label(view.desired))
    for url, folders in serving.items():
        if isinstance(folders, str):
            found.append(f"{url} {folders}")
        elif folders != view.desired:
            found.append(f"{url} serves {_versions(numbered.label(folders, url))}, store wants {wanted}")
    return found


def _versions(label: str) -> str:
    """ "v2", "v2,3 [1]", or "nothing" (no "vnothing")."""
    return f"v{label}" if label else "nothing"


def _pin_drift(
    registry: Registry, model: str, version: str, alias: str, config: str, known: Tags | None
) -> list[str]:
    try:
        tags = (known or {}).get(version) or registry.version(model, version).tags or {}
    except MlregError as exc:
        return [f"alias {alias}=v{version} cannot be read: {exc.message}"]
    return [
        f"alias {alias}=v{version} pins {member} v{wanted}, the store's config pins v{stored}"
        for member, wanted, stored in pin_disagreements(dict(tags), ensemble_pins(config))
    ]


# -- the report ------------------------------------------------------------------------------------


def model_status(
    settings: Settings, env: Environment, registry: Registry, models: list[str] | None = None
) -> list[ModelRow]:
    """One row per model: the alias, the store's desired versions and what each target serves, as
    registered (MLflow) versions, with the Triton folders beside them; drift flagged."""
    return _model_rows(settings, env, registry, status_store(env.store), models)[0]


@dataclass
class EnvironmentStatus:
    """`mlreg status`: the rows, the store's locks, and why the store could not be read."""

    rows: list[ModelRow]
    locks: list[dict[str, Any]] = field(default_factory=list)  # the store's, with leases
    store_error: str = ""  # "": the store answered; else the rows' store columns are unknown
    store_fix: str = ""
    open_control: list[str] = field(default_factory=list)  # replicas whose control API takes anyone's calls
    readiness: str = ""  # "": every replica answered its index; else which were read from readiness, why
    unreachable: dict[str, str] = field(default_factory=dict)  # url -> why it cannot say what it serves


def environment_status(
    settings: Settings, env: Environment, registry: Registry, models: list[str] | None = None
) -> EnvironmentStatus:
    """``model_status`` and the store's locks; a store that does not answer within seconds leaves
    what the servers serve in the rows, and says why with a fix (the locks are then unknown)."""
    store = status_store(env.store)
    rows, why, read, lost = _model_rows(settings, env, registry, store, models)
    opened = _open_control(settings, env)
    if not why:
        try:
            found = store.locks()
        except StorageError as exc:
            why = exc.message
        else:
            locks = [lock.to_dict() for lock in found if not models or lock.model in models]
            note = readiness_note(str(env.store), read, "")
            return EnvironmentStatus(rows, locks, open_control=opened, readiness=note, unreachable=lost)
    note = readiness_note(str(env.store), read, why)
    return EnvironmentStatus(rows, [], why, STORE_FIX.format(uri=env.store), opened, note, lost)


def _open_control(settings: Settings, env: Environment) -> list[str]:
    try:
        targets = resolve_targets(settings, env)
    except MlregError:
        return []  # the rows say why
    return open_control(targets, min(5.0, settings.triton_timeout))


def _model_rows(
    settings: Settings,
    env: Environment,
    registry: Registry,
    store: RepositoryStore,
    models: list[str] | None,
) -> tuple[list[ModelRow], str, list[str], dict[str, str]]:
    """The rows, why the store could not be read ("" when it could), the targets read from
    their readiness (their repository index did not answer), and those that cannot say (why)."""
    names, why = (list(models), "") if models else listed_models(store)
    views, why = read_views(store, names, why)
    ensembles = None if why else [m for m in names if views[m].is_ensemble]
    known = _known(registry, env, names)
    live, live_pins = probe_targets(settings, env, store, ensembles, known, store_silent(why))
    if not models:  # what serves and what the alias names, though the store lost it, is drift too
        names = sorted(set(names) | served_models(live) | aliased_models(registry, env.alias))
        more, why = read_views(store, [m for m in names if m not in views], why)
        views.update(more)
    aliases, mlflow_error = read_aliases(registry, names, env.alias)
    lost = {m: a for m, a in aliases.items() if a and m not in views_with_config(views)}
    if lost:  # served, though the store lost its folder: asked by name
        _ready_outside_index(_bounded_connector(settings, env), live, lost, live_pins)
    rows = [
        _row(env, registry, store, model, views[model], aliases[model], live, live_pins, mlflow_error)
        for model in names
    ]
    return rows, why, readiness_read(live), {u: s for u, s in live.items() if isinstance(s, str)}


def _known(registry: Registry, env: Environment, names: list[str]) -> Known:
    """The models (and versions) a replica read without its index is asked about by name: those
    listed or given, and each version the environment's alias names (MLflow's, when it answers)."""

    def known() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {name: set() for name in names}
        try:
            named = registry.alias_versions(env.alias)
        except MlregError:
            named = {}
        for model, version in named.items():
            found.setdefault(model, set()).add(str(version))
        for model, versions in found.items():  # a re-pointed ensemble serves an older folder
            try:
                registered = sorted((str(v.version) for v in registry.versions(model)), key=int)
            except (MlregError, ValueError):
                continue
            versions.update(registered[-KNOWN_VERSIONS:])
        return found

    return known


READINESS_NOTE = (
    "the store ({uri}) did not answer: what each replica serves was read from its readiness, not its "
    "repository index ({urls}; a version still loading or unavailable there is not seen)"
)
INDEX_NOTE = (
    "the repository index of {urls} did not answer within {seconds:.0f}s (Triton polls the store {uri} "
    "for it): what serves there was read from its readiness (a version still loading or unavailable "
    "there is not seen)"
)


def readiness_note(uri: str, urls: Sequence[str], store_error: str) -> str:
    """What status says when replicas were read from their readiness: the store named as down
    when it did not answer either, else the index that did not answer ("": none was)."""
    if not urls:
        return ""
    where = ", ".join(urls)
    if store_error:
        return READINESS_NOTE.format(uri=uri, urls=where)
    return INDEX_NOTE.format(urls=where, seconds=INDEX_TIMEOUT_S, uri=uri)


@dataclass(frozen=True)
class Unreachable:
    """A target that could not say what it serves: ``text`` says why (``unreachable: why``), and
    is what the JSON document shows in its place."""

    text: str

    def to_json(self) -> str:
        return self.text


Served = list[str] | Unreachable  # what one target serves, or why it cannot say


def _as_served(found: list[str] | str) -> Served:
    return Unreachable(found) if isinstance(found, str) else found


def _served_json(found: Served) -> list[str] | str:
    return found.to_json() if isinstance(found, Unreachable) else found


# the optional fields of a row, in the order its JSON document lists them (absent when None)
OPTIONAL = ("loading", "store", "pins", "target_pins", "read_by_readiness")


@dataclass
class ModelRow:
    """One model's line of ``mlreg status``: registered versions, Triton folders beside them."""

    model: str
    alias: str  # the version the environment's alias names ("": none)
    desired: list[str]  # the store's config, as registered versions
    desired_folders: list[str]  # ... as Triton folders
    serving: dict[str, Served]  # url -> registered versions READY there
    serving_folders: dict[str, Served]  # url -> Triton folders READY there
    drift: list[str]  # what disagrees, one line each ([]: nothing)
    loading: dict[str, list[str]] | None = None  # url -> versions still LOADING there
    store: str | None = None  # "store unreachable: why" (then the store's columns are unknown)
    pins: dict[str, str] | None = None  # an ensemble's members as the store's config pins them
    target_pins: dict[str, dict[str, str]] | None = None  # url -> what the ensemble loaded there pins
    read_by_readiness: list[str] | None = None  # urls whose serving was read from readiness, not the index

    def to_dict(self) -> dict[str, Any]:
        """The row's JSON document (``mlreg status --json``'s ``models``)."""
        row: dict[str, Any] = {
            "model": self.model,
            "alias": self.alias,
            "desired": self.desired,
            "desired_folders": self.desired_folders,
            "serving": {url: _served_json(found) for url, found in self.serving.items()},
            "serving_folders": {url: _served_json(found) for url, found in self.serving_folders.items()},
            "drift": self.drift,
        }
        row.update({key: getattr(self, key) for key in OPTIONAL if getattr(self, key) is not None})
        return row

    def desired_label(self) -> str:
        """``2 [1]``: the store's versions, each folder beside where it differs."""
        return labels(self.desired, self.desired_folders)

    def serving_labels(self) -> dict[str, str]:
        """url -> ``2 [1]`` (what serves there), or ``unreachable: why``."""
        return {url: self._label(found, self.serving_folders.get(url)) for url, found in self.serving.items()}

    @staticmethod
    def _label(found: Served, folders: Served | None) -> str:
        if isinstance(found, Unreachable):
            return found.to_json()
        return labels(found, folders if isinstance(folders, list) else found)

    def __getitem__(self, key: str) -> Any:
        """A field of the JSON document (``row["drift"]``), for callers that read rows as dicts."""
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)


def _row(
    env: Environment,
    registry: Registry,
    store: RepositoryStore,
    model: str,
    view: StoreView,
    alias: str,
    live: dict[str, Any],
    live_pins: Pins,
    mlflow_error: str,
) -> ModelRow:
    folders: Serving = {
        url: states if isinstance(states, str) else ready_versions(states, model)
        for url, states in live.items()
    }
    numbered = numbering(registry, model, view, alias, live_pins, reachable=not mlflow_error)
    serving: Serving = {u: f if isinstance(f, str) else numbered.versions(f, u) for u, f in folders.items()}
    row = ModelRow(
        model,
        alias,
        numbered.versions(view.desired),
        view.desired,
        {url: _as_served(found) for url, found in serving.items()},
        {url: _as_served(found) for url, found in folders.items()},
        drift(registry, env.alias, view, alias, folders, model, numbered)
        + ([f"MLflow unreachable: {mlflow_error}"] if mlflow_error else []),
    )
    row.read_by_readiness = readiness_read(live) or None
    _add_loading(row, store, live, view)
    row.drift.extend(_reapply_lines(env, row, folders))
    if view.error:  # the store's columns are unknown, the servers' are not
        row.store = f"store unreachable: {view.error}"
        return row
    _add_store_findings(row, env, registry, store, view, folders, serving, numbered, live_pins)
    return row


def _reapply_lines(env: Environment, row: ModelRow, folders: Serving) -> list[str]:
    """The exact command that loads what the store wants on a replica serving nothing of the model
    (restarted in explicit mode, or put back only in part): a promotion of the version the store
    serves is no no-op there (``already_serving`` asks every target), so it loads it -- and moves
    nothing on the replicas that serve it already (issue 45, item 3)."""
    if not row.desired or not any(found == [] for found in folders.values()):
        return []
    command = f"mlreg promote {row.model} --version {row.desired[-1]} --env {env.name}"
    return [
        f"{url} serves nothing of {row.model}: to load what the store wants there, run '{command}'"
        for url, found in folders.items()
        if found == []
    ]


def _add_loading(row: ModelRow, store: RepositoryStore, live: dict[str, Any], view: StoreView) -> None:
    """A load that has not finished (past a promotion's deadline?): nothing loads behind it."""
    loading = {
        url: found
        for url, states in live.items()
        if not isinstance(states, str) and (found := loading_versions(states, row.model))
    }
    if not loading:
        return
    row.loading = loading
    hung = hung_loads(store, row.model) if not view.error else {}
    row.drift.extend(
        f"{url}: v{','.join(versions)} LOADING{_loading_for(hung.get(url), versions)} (a load that has "
        f"not finished: a promotion of {row.model} is refused there until it does; read the replica's "
        "log, restart it if it never ends)"
        for url, versions in loading.items()
    )


def _add_store_findings(
    row: ModelRow,
    env: Environment,
    registry: Registry,
    store: RepositoryStore,
    view: StoreView,
    folders: Serving,
    serving: Serving,
    numbered: Numbering,
    live_pins: Pins,
) -> None:
    """What the store says of the row's model: its config lost, its bytes or signatures that do
    not verify, an ensemble's pins against what each target loaded."""
    model = row.model
    if view.config is None and (row.alias or any(f for f in folders.values() if not isinstance(f, str))):
        row.drift.insert(0, _lost_line(model, row.alias, serving, folders))
        if numbered.live_pins:  # an ensemble the store lost: what each target's loaded one pins
            row.target_pins = numbered.live_pins
    row.drift.extend(manifest_problems(store, model, view.desired))  # its bytes cannot be verified
    row.drift.extend(folder_problems(store, model, view.desired))  # what no manifest covers: loads refused
    if not view.is_ensemble:  # a manifest the registry does not know covers nothing (issue 44, F2)
        row.drift.extend(unregistered_problems(store, registry, model))
    if not view.is_ensemble:  # where the environment checks signatures: the versions it serves
        row.drift.extend(signature_problems(store, registry, model, view.desired, env.signatures))
        return
    assert view.config is not None
    row.pins = ensemble_pins(view.config)  # its alias names a registered version, not a folder
    row.target_pins = numbered.live_pins
    row.drift.extend(pin_drift(row.pins, live_pins, model))


def _loading_for(note: dict[str, Any] | None, versions: list[str]) -> str:
    """ " for 4 min (since 12:01:03 UTC)" when a promotion noted that load past its deadline."""
    if not note or [str(v) for v in note.get("versions", [])] != versions:
        return ""
    since = float(note.get("since", 0))
    minutes = max(0.0, time.time() - since) / 60
    return f" for {minutes:.0f} min (since {time.strftime('%H:%M:%S', time.gmtime(since))} UTC)"


def views_with_config(views: dict[str, StoreView]) -> set[str]:
    return {m for m, v in views.items() if v.config is not None}


def _ready_outside_index(connect: Connect, live: dict[str, Any], wanted: dict[str, str], pins: Pins) -> None:
    """A model whose folder left the repository is gone from Triton's index but still loaded:
    each ``model: version`` the alias names and the store lacks is asked for by name, and added to
    ``live`` where it is READY (an ensemble's pins to ``pins``: they say which registered version
    its folder is)."""
    for url, states in live.items():
        if isinstance(states, str):
            continue
        target = connect(url)
        try:
            for model, version in wanted.items():
                if model not in states:
                    _ask_by_name(target, model, version, states, pins.setdefault(url, {}))
        except MlregError:
            pass  # the target's own row says it is unreachable when it is
        finally:
            target.close()


def _ask_by_name(
    target: ServingTarget, model: str, version: str, states: dict[str, Any], pins: dict[str, dict[str, str]]
) -> None:
    """The folders ``model``'s loaded config serves (a re-pointed ensemble keeps its old folder, so
    not always the alias's number; that number when the config says none), READY ones added to
    ``states``; an ensemble's steps to ``pins``.  A model not loaded there: nothing added."""
    try:
        config = target.model_config(model)
    except MlregError:
        config = {}  # not loaded (Triton: unknown model); asked for the alias's version below
    specific = config.get("version_policy", {}).get("specific", {}).get("versions", [])
    ready = [str(v) for v in (specific or [version]) if target.is_ready(model, str(v))]
    if ready:
        states[model] = dict.fromkeys(ready, "READY")
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    if ready and steps:
        pins[model] = {s["model_name"]: str(int(s.get("model_version", -1))) for s in steps}


def served_models(live: dict[str, Any]) -> set[str]:
    """Every model a reachable target's repository index lists with a READY version."""
    return {
        model
        for states in live.values()
        if not isinstance(states, str)
        for model in states
        if ready_versions(states, model)
    }


def aliased_models(registry: Registry, alias: str) -> set[str]:
    """Every registered model ``alias`` names a version of (none when MLflow cannot say: the
    alias column says why)."""
    try:
        return set(registry.alias_versions(alias))
    except MlregError:
        return set()


def _lost_line(model: str, alias: str, serving: Serving, folders: Serving) -> str:
    """The drift line of a model whose store config is gone: what the alias names, what Triton
    still serves (registered versions, the folder beside where it differs) and the way back."""
    labelled: Serving = {
        url: [labels([v], [f]) for v, f in zip(found, folders[url], strict=True)]
        for url, found in serving.items()
        if not isinstance(found, str) and not isinstance(folders[url], str)
    }
    line = f"the store has no {model}/config.pbtxt" + _missing_detail(alias, labelled)
    served = _served(labelled)
    if not served:
        return line
    again = alias or served[0].split()[0]
    again = "the version it serves" if again == UNKNOWN else f"v{again}"
    return (
        f"{line}; the store lost its folder; Triton still serves v{','.join(served)} "
        f"(promote {again} again to put it back)"
    )


def _served(folders: Serving) -> list[str]:
    """Every version (or ``version [folder]`` label) a reachable target serves, in order."""
    found = {v for f in folders.values() if not isinstance(f, str) for v in f}
    return sorted(found, key=lambda v: int(v.split()[0]) if v.split()[0].isdigit() else -1)


def _missing_detail(alias: str, folders: Serving) -> str:
    serving = _served(folders)
    parts = [f"alias names v{alias}"] if alias else []
    parts += [f"v{','.join(serving)} serves"] if serving else ["nothing serves it"]
    return f" ({', '.join(parts)}): a restarted replica cannot load it"


def history(registry: Registry, model: str, env: str | None) -> list[dict[str, Any]]:
    """Every promotion of ``model`` (in ``env``), newest first."""
    return registry.promotions(model, env)


@dataclass(frozen=True)
class RollbackTarget:
    """Where `mlreg rollback MODEL` (no --to-version) goes, and what it leaves."""

    version: str | None  # the newest version promoted in the environment that is not serving now
    serving: tuple[str, ...]  # what serves now, as MLflow records it (the alias, the last promotion)


def rollback_target(registry: Registry, model: str, env: str, alias: str) -> RollbackTarget:
    """The newest successful promotion in ``env`` to a version other than what serves now.

    What serves is the version ``alias`` names and the one the newest successful promotion
    went to (they differ when a promotion was cut short after moving the alias); a repair rerun
    (``N -> N``) and a failed attempt are never a way back.  A version that arrived as a member of
    an ensemble's promotion (no run of its own: its ``promoted_<env>`` stamp) counts too, when it
    is newer than the model's own promotion found."""
    done = [h for h in history(registry, model, env) if h.get("result") == "promoted" and h.get("to")]
    serving = {str(done[0]["to"])} if done else set()
    if named := registry.aliases(model).get(alias):
        serving.add(str(named))
    earlier = next(((str(h["to"]), h.get("when")) for h in done if str(h["to"]) not in serving), None)
    arrived = member_arrival(registry, model, env, serving)
    if arrived is not None and (earlier is None or _ms(arrived[1]) > _number(earlier[1])):
        earlier = (arrived[0], None)
    return RollbackTarget(
        earlier[0] if earlier else None, tuple(sorted(serving, key=lambda v: int(v) if v.isdigit() else -1))
    )


def member_arrival(registry: Registry, model: str, env: str, serving: set[str]) -> tuple[str, str] | None:
    """The newest version of ``model`` stamped ``promoted_<env>`` (every model a promotion moved
    is: members brought along by an ensemble's too) that does not serve now and is older than
    what serves (a stamp newer than the serving one's is a failed attempt's), with its stamp."""
    tag = f"promoted_{env}"
    stamps = {
        str(found.version): str(dict(getattr(found, "tags", None) or {}).get(tag, ""))
        for found in registry.find_by_tag(model, tag, "%", like=True)
    }
    newest_serving = max((stamps.get(v, "") for v in serving), default="")
    older = [
        (stamp, v) for v, stamp in stamps.items() if v not in serving and stamp and stamp <= newest_serving
    ]
    if not older or not newest_serving:
        return None
    stamp, version = max(older)
    return version, stamp


def _ms(stamp: str) -> float:
    """A ``promoted_<env>`` stamp (registry.lineage.deployment_stamp) as epoch milliseconds."""
    try:
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) * 1000 + int(fraction or 0) / 1000
    except ValueError:
        return 0.0


def _number(value: object) -> float:
    """A history row's ``when`` (epoch ms; absent: the oldest)."""
    return float(value) if isinstance(value, int | float) else -1.0
