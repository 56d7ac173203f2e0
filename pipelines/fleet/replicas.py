"""How mlreg reaches an environment's replicas, before and beside the ``Fleet`` that moves them.

``triton_connector`` makes the connection a promotion drives a replica through (the control key
on every call, the environment's load deadline); ``reachable`` tells the live replicas from the
ones a roll-out may skip; ``open_control`` finds a replica whose model-control API takes anyone's
calls; ``note_hung_load``/``hung_loads`` remember, at the store's root, a load that was still
running past its deadline, so that ``mlreg status`` can say since when a replica is LOADING it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipelines.core.ports import ServingTarget
from pipelines.storage.base import ObjectStore
from pipelines.triton.control_key import ControlKey, control_key
from registry.errors import MlregError, PromotionError
from registry.settings import Settings

Connect = Callable[[str], ServingTarget]


def triton_connector(
    settings: Settings, key: ControlKey | None = None, load_timeout: float | None = None
) -> Connect:
    """Real targets: Triton over gRPC with the configured timeouts, every call carrying ``key``
    (the environment's: ``Environment.key``; None: ``MLREG_CONTROL_KEY``/the local stack's, if any);
    a load waits ``load_timeout`` seconds at most (the environment's ``load_deadline``)."""
    key = key if key is not None else control_key(settings.home)
    deadline = load_timeout or settings.triton_timeout * 10

    def connect(url: str) -> ServingTarget:
        from pipelines.triton.control import TritonControl  # lazy: tritonclient's gRPC stack, ~0.3 s

        return TritonControl(url, timeout=settings.triton_timeout, load_timeout=deadline, key=key)

    return connect


OPEN_CONTROL = (
    "{url} takes model-control calls from anyone: whoever reaches it can load, unload or re-point "
    "a model (start it with the restriction flags of infra/: pipelines/triton/control_key.py)"
)
ALLOWED_OPEN = (
    "{url} takes model-control calls from anyone (whoever reaches it can load, unload or re-point a "
    "model); promoted to it because environment '{env}' says open_control = \"allow\""
)


def open_control(urls: Sequence[str], timeout: float) -> list[str]:
    """The replicas whose model-control API takes a call without the key (``control_api_open``'s
    unload of a fresh unguessable name, which loads nothing, all at once); one that does not answer
    is not listed (status says so)."""
    from pipelines.triton.control import control_api_open  # lazy: tritonclient's gRPC stack, ~0.3 s

    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        opened = list(pool.map(lambda url: control_api_open(url, timeout), urls))
    return [url for url, is_open in zip(urls, opened, strict=True) if is_open]


def open_control_notes(
    env_name: str, allowed: bool, urls: Sequence[str], target: Callable[[str], ServingTarget], timeout: float
) -> list[str]:
    """Before a promotion changes anything: every replica of ``urls`` that is a Triton and takes
    model-control calls without the key refuses it (PromotionError naming them) unless the
    environment ``allowed`` it (open_control = "allow"): then one note per open replica, for every
    output and the promotion's run.  ``target``: the promotion's connections (a replica that is not
    a Triton, a test's stand-in object, cannot be probed and is not listed)."""
    from pipelines.triton.control import TritonControl  # lazy: tritonclient's gRPC stack, ~0.3 s

    tritons = [url for url in urls if isinstance(target(url), TritonControl)]
    opened = open_control(tritons, timeout)
    if not opened or allowed:
        return [ALLOWED_OPEN.format(url=url, env=env_name) for url in opened]
    raise PromotionError(
        f"environment '{env_name}': {', '.join(opened)} take(s) model-control calls from anyone "
        "(an unload without the control key was not refused): whoever reaches them can load, unload or "
        "re-point a model, so the promotion was refused before any change",
        fix="restart them with the restriction flags (pipelines/triton/control_key.py, infra/) and name the "
        f"key in the environment's control_key; or, to accept the risk, write open_control = "
        f'"allow" in [environments.{env_name}] of mlreg.toml',
        status="open-control",
        replicas=opened,
    )


HUNG_LOADS = ".mlreg-loading.{model}.json"  # at the store's root (never a model): loads past their deadline


def note_hung_load(store: ObjectStore, model: str, url: str, versions: Sequence[str], started: float) -> None:
    """Remember that ``url`` was still loading ``model`` past the deadline (since ``started``,
    epoch seconds), for ``mlreg status``; best effort: a store that cannot be written says nothing."""
    try:
        found = hung_loads(store, model)
        if found.get(url, {}).get("versions") != list(versions):
            found[url] = {"versions": list(versions), "since": started}
            store.write(HUNG_LOADS.format(model=model), json.dumps(found).encode())
    except MlregError:
        pass


def hung_loads(store: ObjectStore, model: str) -> dict[str, dict[str, Any]]:
    """url -> {"versions": [...], "since": epoch seconds} of ``model``'s loads past their deadline."""
    try:
        data = store.read(HUNG_LOADS.format(model=model))
        found = json.loads(data) if data else {}
    except (MlregError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def reachable(
    targets: Sequence[str], connect: Connect, max_unavailable: int, keep_open: bool = False
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The live replicas, and the ones skipped (url -> why); more than ``max_unavailable``
    unreachable ones, or none reachable, refuse the promotion.  ``keep_open``: ``connect`` hands
    out connections someone keeps (a ``Fleet``'s): they stay open for the promotion."""

    def live(url: str) -> str:
        try:
            replica = connect(url)
        except MlregError as exc:
            return exc.message
        try:
            replica.is_live()
        except MlregError as exc:
            return exc.message
        finally:
            if not keep_open:
                replica.close()
        return ""

    with ThreadPoolExecutor(max(1, min(8, len(targets)))) as pool:
        errors = dict(zip(targets, pool.map(live, targets), strict=True))
    down = [u for u, e in errors.items() if e]
    if len(down) > max_unavailable:
        raise PromotionError(
            f"{len(down)} replica(s) unreachable ({', '.join(down)}), max_unavailable = "
            f"{max_unavailable}: {errors[down[0]]}",
            fix="bring the replica back (or raise max_unavailable in mlreg.toml), then promote again",
        )
    if len(down) == len(targets):
        raise PromotionError(
            f"no replica is reachable ({', '.join(down)}): {errors[down[0]]}",
            fix="bring at least one replica back: the version must serve somewhere before the alias moves",
        )
    return tuple(u for u in targets if u not in down), {u: errors[u] for u in down}
