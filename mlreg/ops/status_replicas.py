"""`mlreg status`'s read of the replicas: what each serves (its repository index, or its readiness
when the index does not answer within ``INDEX_TIMEOUT_S``), what each loaded ensemble pins, and
what the alias names in MLflow; each within seconds, in parallel."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipelines.core.ports import ServingTarget
from pipelines.fleet.fleet import Fleet, ready_versions
from pipelines.fleet.replicas import Connect, triton_connector
from pipelines.promote.environments import Environment, resolve_targets
from pipelines.storage.base import Repository
from registry.errors import MlregError
from registry.ports import RegistryReader
from registry.settings import Settings

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
    store: Repository,
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
    with Fleet(store, targets, bounded_connector(settings, env), settings.triton_timeout) as fleet:
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


def bounded_connector(settings: Settings, env: Environment) -> Connect:
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


def read_aliases(registry: RegistryReader, names: list[str], alias: str) -> tuple[dict[str, str], str]:
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


def ready_outside_index(connect: Connect, live: dict[str, Any], wanted: dict[str, str], pins: Pins) -> None:
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


def aliased_models(registry: RegistryReader, alias: str) -> set[str]:
    """Every registered model ``alias`` names a version of (none when MLflow cannot say: the
    alias column says why)."""
    try:
        return set(registry.alias_versions(alias))
    except MlregError:
        return set()
