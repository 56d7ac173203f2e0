"""What a (re)started local stack serves: what its store says should serve (issue 48 item 4).

The local stack runs Triton in explicit model control, so a tritonserver started on a repository
serves nothing until asked -- restarting the stack dropped everything promoted.  The store says
what should serve: each model config a promotion wrote names its versions in
``version_policy.specific`` (a config without one -- a built template nobody promoted -- names
nothing: those models load only on demand, ``stack up --load``).  ``restore_served`` loads exactly
that, and only verified bytes, as a promotion does: every version is held to the digest MLflow
registered for it (``artifact_digest``), the model folder to the closed world
(``Versions.verify_load``), before Triton is asked; an ensemble (which Triton would load
with its members, read unverified) only when every member it names was loaded here.  A model
that does not verify, or whose load fails, is left unloaded and named with why -- never a
half-trusted load, never a failed start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipelines.storage.base import Repository
from pipelines.storage.versions import Versions
from registry.errors import ContractError, MlregError

Registered = Callable[[str, str], "str | None"]  # (model, version) -> MLflow's artifact_digest


class Loader(Protocol):
    """What the restore asks of one replica (``pipelines.triton.control.TritonControl``)."""

    def load(self, model: str, config: str | None = None) -> None: ...

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None: ...


@dataclass(frozen=True)
class Desired:
    """One model the store says should serve: its stored config and the versions it names."""

    model: str
    config: str
    versions: tuple[str, ...]
    members: tuple[str, ...] = ()  # an ensemble's steps' models


@dataclass
class Restored:
    """What ``restore_served`` loaded (``model:version``) and what it left out, with why."""

    loaded: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"loaded": self.loaded, "left": self.left}


def desired_state(store: Repository) -> list[Desired]:
    """The models whose stored config names versions to serve, every ensemble after its members."""
    from registry.contracts.config import parse_config  # lazy: protobuf + tritonclient's config

    found = []
    for model in store.list_models():
        text = store.read_config(model)
        if text is None:
            continue
        try:
            config = parse_config(text)
        except ContractError:
            continue  # Triton would refuse it too; nothing to bring back
        if config.version_policy.WhichOneof("policy_choice") != "specific":
            continue
        versions = tuple(str(v) for v in sorted(config.version_policy.specific.versions))
        steps = tuple(s.model_name for s in config.ensemble_scheduling.step)
        found.append(Desired(model, text, versions, steps))
    return sorted(found, key=lambda d: (bool(d.members), d.model))


def _verify(store: Versions, wanted: Desired, registered: Registered) -> str:
    """Why ``wanted`` may not be loaded ("" when every version verified)."""
    try:
        if not wanted.members:  # an ensemble's version folders hold no code Triton reads
            for version in wanted.versions:
                digest = registered(wanted.model, version)
                if digest is None:
                    return f"v{version} has no digest registered in MLflow"
                store.verify_version(wanted.model, version, digest, loading=wanted.versions)
        store.verify_load(wanted.model, wanted.versions, wanted.config)
    except MlregError as exc:
        return exc.message
    return ""


def restore_served(
    store: Repository,
    urls: Sequence[str],
    connect: Callable[[str], Loader],
    registered: Registered,
    ready_timeout: float = 120.0,
) -> Restored:
    """Load on each of ``urls`` what the store says should serve (see the module); never raises
    for one model: what was not loaded is in ``left``, with why."""
    from registry.contracts.config import config_json  # lazy: protobuf + tritonclient's config

    result = Restored()
    loaded: set[str] = set()
    for wanted in desired_state(store):
        missing = [m for m in wanted.members if m not in loaded]
        why = f"its member(s) {', '.join(missing)} were not loaded" if missing else ""
        why = why or _verify(store.versions, wanted, registered)
        if not why:
            why = _load_everywhere(
                urls, connect, wanted, config_json(wanted.config, wanted.model), ready_timeout
            )
        if why:
            result.left.append(f"{wanted.model} v{','.join(wanted.versions)}: {why}")
            continue
        loaded.add(wanted.model)
        result.loaded.extend(f"{wanted.model}:{v}" for v in wanted.versions)
    return result


def _load_everywhere(
    urls: Sequence[str], connect: Callable[[str], Loader], wanted: Desired, config: str, timeout: float
) -> str:
    for url in urls:
        try:
            target = connect(url)
            target.load(wanted.model, config=config)
            for version in wanted.versions:
                target.wait_ready(wanted.model, version, timeout=timeout)
        except MlregError as exc:
            return f"{url}: {exc.message}"
    return ""


__all__ = ["Desired", "Restored", "desired_state", "restore_served"]
