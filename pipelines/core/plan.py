"""The promotion plan: what is uploaded, which configs change, which servers load what.

Built from the registry (what the version is) and the store (what serves now); nothing
changes while planning, so ``--dry-run`` prints exactly this.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines.core.environment import Environment
from pipelines.core.policy import waves_of
from pipelines.core.ports import RegistryReader
from pipelines.core.warmup import PYTHON_WARMUP, peak_sample, recreating_fields
from pipelines.storage.base import Repository
from registry.contracts.config import CONFIG_NAME, format_config, model_config_pb2, parse_config
from registry.errors import MlregError, PromotionError

Serves = Callable[[str, str], bool]  # (model, version) -> every target serves exactly that version


class Role(StrEnum):
    MEMBER = "member"  # a member an ensemble promotion brings along
    MODEL = "model"  # the version asked for
    ENSEMBLE = "ensemble"  # an ensemble re-pointed to the new version


@dataclass(frozen=True)
class ConfigFacts:
    """What a promotion needs to know of a config.pbtxt, parsed once."""

    platform: str
    backend: str
    pins: tuple[tuple[str, str], ...]  # (member, version) of an ensemble's steps
    versions: tuple[str, ...]  # version_policy.specific

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    @property
    def runtime(self) -> tuple[str, str]:
        return self.platform, self.backend


@lru_cache(maxsize=256)
def config_facts(text: str) -> ConfigFacts:
    config = parse_config(text)
    specific = config.version_policy.specific.versions if config.version_policy.HasField("specific") else []
    return ConfigFacts(
        config.platform,
        config.backend,
        tuple((s.model_name, str(s.model_version)) for s in config.ensemble_scheduling.step),
        tuple(str(v) for v in sorted(specific)),
    )


@dataclass
class Step:
    """One model put in service at one version (a member, the model, or a re-pointed ensemble)."""

    model: str
    version: str
    role: Role
    folder: Path | None  # local Triton model folder (config + <version>/); None: re-point
    config_text: str  # the desired config written to the store at the end
    previous_config: str | None  # the store's config before this promotion (rollback)
    previous_versions: list[str]  # versions serving before
    upload: bool = True
    reload: bool = False  # the store is as wanted, but a target does not serve it: load again
    digest: str = ""  # the artifact digest registered in MLflow for this version
    previous_digests: dict[str, str] = field(default_factory=dict)  # the same for previous_versions

    @property
    def facts(self) -> ConfigFacts:
        return config_facts(self.config_text)

    @property
    def is_ensemble(self) -> bool:
        return self.facts.is_ensemble

    @property
    def platform(self) -> str:
        return self.facts.platform

    @property
    def runtime_changes(self) -> bool:
        """Old and new versions cannot share one config (e.g. SavedModel -> ONNX)."""
        if self.previous_config is None:
            return False
        return config_facts(self.previous_config).runtime != self.facts.runtime

    @property
    def noop(self) -> bool:
        return (
            self.previous_versions == [self.version]
            and not self.upload
            and not self.reload
            and (self.previous_config == self.config_text)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "role": self.role.value,
            "upload": self.upload,
            "from": self.previous_versions,
            "config_changes": self.previous_config != self.config_text,
        }


@dataclass
class Plan:
    env: Environment
    targets: tuple[str, ...]
    model: str
    version: str
    steps: list[Step] = field(default_factory=list)
    workdir: Path | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # unreachable replicas left out -> why
    notes: list[str] = field(default_factory=list)  # choices the plan made (a -1 member's version)

    @property
    def noop(self) -> bool:
        return all(s.noop for s in self.steps)

    def step(self, model: str) -> Step:
        return next(s for s in self.steps if s.model == model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.env.name,
            "store": self.env.store,
            "targets": list(self.targets),
            "model": self.model,
            "version": self.version,
            "noop": self.noop,
            "steps": [s.to_dict() for s in self.steps],
            "skipped": dict(self.skipped),
            "rollout": self.rollout(),
            "notes": list(self.notes),
        }

    def rollout(self) -> dict[str, Any] | None:
        """The environment's roll-out over these targets: the canary and each wave's replicas, the
        bake and its thresholds (None: every target at once, first = canary)."""
        policy = self.env.policy
        if policy is None:
            return None
        return {
            "waves": waves_of(self.targets, policy),
            "bake_seconds": policy.bake_seconds,
            "max_parallel": policy.max_parallel,
            "max_unavailable": policy.max_unavailable,
            "checks": [check.to_dict() for check in policy.checks],
        }


def serving_versions(config_text: str | None) -> list[str]:
    """The versions a stored config declares serving (its version_policy)."""
    return [] if config_text is None else list(config_facts(config_text).versions)


def desired_config(text: str, versions: list[str], gpu: bool, pins: dict[str, str] | None = None) -> str:
    """``text`` with version_policy = exactly ``versions``, devices adapted, ensemble pins set."""
    config = parse_config(text)
    config.version_policy.specific.versions[:] = sorted(int(v) for v in versions)
    if not gpu:
        kinds = model_config_pb2().ModelInstanceGroup
        for group in config.instance_group:
            if group.kind == kinds.KIND_GPU:
                group.kind = kinds.KIND_CPU
                del group.gpus[:]
    for step in config.ensemble_scheduling.step:
        if pins and step.model_name in pins:
            step.model_version = int(pins[step.model_name])
    return format_config(config)


def fetch_version(
    registry: RegistryReader, model: str, version: str, workdir: Path
) -> tuple[Path, dict[str, str]]:
    """A registered version as a Triton model folder ``workdir/<model>``, and its tags; a version
    that failed validation when it was registered is refused."""
    folder = workdir / model
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tags = registry.fetch_version(model, version, folder)
    if tags.get("validation") == "failed":
        raise PromotionError(
            f"{model} version {version} failed validation when it was registered",
            fix=f"see 'mlreg show {model} --version {version}', fix the model and register again",
        )
    return folder, tags


def ensemble_pins(config_text: str) -> dict[str, str]:
    return dict(config_facts(config_text).pins)


def ensembles_pinning(store: Repository, models: Iterable[str] | None = None) -> dict[str, str]:
    """The store's ensembles (platform "ensemble") whose steps pin one of ``models`` -- every
    ensemble of the store when ``models`` is None: name -> stored config, in the store's order."""
    wanted = None if models is None else set(models)
    found = {}
    for name in store.list_models():
        text = store.read_config(name)
        if text and config_facts(text).is_ensemble and (wanted is None or wanted & set(ensemble_pins(text))):
            found[name] = text
    return found


def follow_latest(text: str, versions: list[str], gpu: bool, members: Iterable[str]) -> str:
    """Ensemble config ``text`` serving ``versions``, each of ``members`` it pins followed at its
    latest loaded version (-1): while those members swap versions on a replica, the ensemble serves
    whatever the replica has, old then new, and no request through it fails."""
    return desired_config(text, versions, gpu, dict.fromkeys(members, "-1"))


def build_plan(
    registry: RegistryReader,
    store: Repository,
    env: Environment,
    targets: tuple[str, ...],
    model: str,
    version: str,
    workdir: Path,
    serves: Serves = lambda model, version: True,
) -> Plan:
    """``serves(model, version)``: every target serves exactly that version (asked of the targets, so
    that a store that is as wanted but a server that lost its models is not taken for a no-op)."""
    plan = Plan(env, targets, model, version, workdir=workdir)
    folder, tags = fetch_version(registry, model, version, workdir)
    text = (folder / CONFIG_NAME).read_text()
    if config_facts(text).is_ensemble:
        for member, pinned in ensemble_pins(text).items():
            member_version, chosen = member_version_of(registry, model, member, pinned)
            plan.notes.extend(chosen)
            stored = member_version in serving_versions(store.read_config(member))
            if not stored or not serves(member, member_version):
                plan.steps.append(_step(registry, store, env, member, member_version, Role.MEMBER, workdir))
    plan.steps.append(_step(registry, store, env, model, version, Role.MODEL, workdir, (folder, tags)))
    for ensemble, ens_text in ensembles_pinning(store, [model]).items():
        if ensemble == model:
            continue
        pins = ensemble_pins(ens_text)
        if pins.get(model) not in (version, "-1"):
            current = store.read_config(ensemble)
            serving = serving_versions(current)
            plan.steps.append(
                Step(
                    ensemble,
                    serving[-1] if serving else "1",
                    Role.ENSEMBLE,
                    None,
                    desired_config(ens_text, serving or ["1"], env.gpu, {model: version}),
                    current,
                    serving,
                    upload=False,
                )
            )
    for step in plan.steps:
        step.reload = step.previous_versions == [step.version] and not serves(step.model, step.version)
    return plan


def member_version_of(
    registry: RegistryReader, ensemble: str, member: str, pinned: str
) -> tuple[str, list[str]]:
    """The version of ``member`` that ``ensemble`` pins: the pinned number, or for -1 (latest) the
    newest registered version that did not fail validation (one that did is never promoted:
    ``fetch_version``), with the plan's note saying which and what it passed over."""
    if int(pinned) > 0:
        return pinned, []
    found = sorted(
        ((int(v.version), dict(getattr(v, "tags", None) or {})) for v in registry.versions(member)),
        reverse=True,
    )
    failed = [str(number) for number, tags in found if tags.get("validation") == "failed"]
    usable = [str(number) for number, tags in found if tags.get("validation") != "failed"]
    if not usable:
        failing = f" (version {', '.join(failed)} failed validation)" if failed else ""
        raise PromotionError(
            f"ensemble member '{member}' of {ensemble} has no registered version that passed "
            f"validation{failing}",
            fix=f"register a version of {member} that passes 'mlreg validate', or pin its step "
            f"in {ensemble}'s config.pbtxt to a version",
        )
    newer = [v for v in failed if int(v) > int(usable[0])]
    passed_over = f"; newer version {', '.join(newer)} failed validation" if newer else ""
    return usable[0], [
        f"{ensemble}: member {member} at version -1 (latest) is version {usable[0]}, the newest "
        f"that passed validation{passed_over}"
    ]


def _step(
    registry: RegistryReader,
    store: Repository,
    env: Environment,
    model: str,
    version: str,
    role: Role,
    workdir: Path,
    fetched: tuple[Path, dict[str, str]] | None = None,
) -> Step:
    folder, tags = fetched or fetch_version(registry, model, version, workdir)
    previous = store.read_config(model)
    serving = serving_versions(previous)
    stored = store.versions.read_manifest(model, version) is not None
    text = (folder / CONFIG_NAME).read_text()
    earlier = {v: _digest_of(registry, model, v) for v in serving if v != version}
    return Step(
        model,
        version,
        role,
        folder,
        desired_config(peak_sample(text)[0] if env.warmup else text, [version], env.gpu),
        previous,
        serving,
        upload=not stored,
        digest=tags.get("artifact_digest", ""),
        previous_digests=earlier,
    )


def _digest_of(registry: RegistryReader, model: str, version: str) -> str:
    """The artifact digest MLflow records for a version ("" when it has none, or no such version)."""
    try:
        return registry.version_tags(model, version).get("artifact_digest", "")
    except (MlregError, LookupError):
        return ""


def swap_notes(env: Environment, plan: Plan) -> list[str]:
    """What the plan's loads will do beyond the swap: a serving version Triton must re-create (its
    config changes in more than version_policy/instance_group: peak memory 2 x old + new, and it
    restarts), and a model that gets no peak-batch warmup, and why; first, the choices the plan
    made (which version a -1 member resolves to)."""
    notes = list(plan.notes)
    for step in plan.steps:
        if step.is_ensemble:
            continue
        fields = recreating_fields(step.previous_config, step.config_text)
        if fields and step.previous_versions:
            notes.append(
                f"{step.model}: this promotion re-creates the serving v{','.join(step.previous_versions)} "
                f"on each replica once (its config changes in {', '.join(fields)}, not only in "
                "version_policy): peak memory is 2 x old + new, and it restarts"
            )
        why = peak_sample(step.config_text)[1] if env.warmup else ""
        if why and why != PYTHON_WARMUP:
            notes.append(
                f"{step.model}: no peak-batch warmup ({why}); declare a model_warmup in its config.pbtxt "
                "to have a candidate that fails at peak refused at its load"
            )
    return notes
