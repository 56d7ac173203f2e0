"""`mlreg status`'s rows: one numbering (MLflow's versions, the Triton folder beside where it
differs), the drift rules, and one ``ModelRow`` per model (``to_dict()``: the row of
``mlreg status --json``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlreg.ops.status_replicas import Pins, pin_drift, readiness_read
from mlreg.ops.status_views import StoreView
from pipelines.core.plan import ensemble_pins
from pipelines.fleet.fleet import loading_versions, ready_versions
from pipelines.fleet.replicas import hung_loads
from pipelines.promote.environments import Environment
from pipelines.promote.integrity import (
    folder_problems,
    manifest_problems,
    signature_problems,
    unregistered_problems,
)
from pipelines.storage.base import Repository
from pipelines.storage.objects import ObjectStore
from registry.errors import MlregError
from registry.ports import RegistryReader, RegistryView

Serving = dict[str, list[str] | str]  # url -> READY versions, or why the target cannot say

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
    registry: RegistryReader, model: str, view: StoreView, alias: str, live_pins: Pins, reachable: bool
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
    registry: RegistryReader,
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
    registry: RegistryReader, model: str, version: str, alias: str, config: str, known: Tags | None
) -> list[str]:
    try:
        tags = (known or {}).get(version) or registry.version(model, version).tags or {}
    except MlregError as exc:
        return [f"alias {alias}=v{version} cannot be read: {exc.message}"]
    return [
        f"alias {alias}=v{version} pins {member} v{wanted}, the store's config pins v{stored}"
        for member, wanted, stored in pin_disagreements(dict(tags), ensemble_pins(config))
    ]


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


def model_row(
    env: Environment,
    registry: RegistryView,
    store: Repository,
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
    numbered = numbering(registry.models, model, view, alias, live_pins, reachable=not mlflow_error)
    serving: Serving = {u: f if isinstance(f, str) else numbered.versions(f, u) for u, f in folders.items()}
    row = ModelRow(
        model,
        alias,
        numbered.versions(view.desired),
        view.desired,
        {url: _as_served(found) for url, found in serving.items()},
        {url: _as_served(found) for url, found in folders.items()},
        drift(registry.models, env.alias, view, alias, folders, model, numbered)
        + ([f"MLflow unreachable: {mlflow_error}"] if mlflow_error else []),
    )
    row.read_by_readiness = readiness_read(live) or None
    _add_loading(row, store.objects, live, view)
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


def _add_loading(row: ModelRow, store: ObjectStore, live: dict[str, Any], view: StoreView) -> None:
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
    registry: RegistryView,
    store: Repository,
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
    row.drift.extend(manifest_problems(store.versions, model, view.desired))  # its bytes cannot be verified
    row.drift.extend(folder_problems(store.objects, model, view.desired))  # not in a manifest: loads refused
    if not view.is_ensemble:  # a manifest the registry does not know covers nothing (issue 44, F2)
        row.drift.extend(unregistered_problems(store, registry.models, model))
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
