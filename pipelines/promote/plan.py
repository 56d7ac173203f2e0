"""The promotion plan: what is uploaded, which configs change, which servers load what.

Built from the registry (what the version is) and the store (what serves now); nothing
changes while planning, so ``--dry-run`` prints exactly this.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.promote.environments import Environment
from pipelines.storage.base import RepositoryStore
from registry import mlflow_sqlite
from registry.contracts.config import CONFIG_NAME, format_config, load_config, parse_config
from registry.errors import PromotionError
from registry.mlflow_registry import MlflowRegistry


@dataclass
class Step:
    """One model put in service at one version (a member, the model, or a re-pointed ensemble)."""

    model: str
    version: str
    role: str  # "member", "model" or "ensemble"
    folder: Path | None  # local Triton model folder (config + <version>/); None: re-point
    config_text: str  # the desired config written to the store at the end
    previous_config: str | None  # the store's config before this promotion (rollback)
    previous_versions: list[str]  # versions serving before
    upload: bool = True

    @property
    def noop(self) -> bool:
        return (
            self.previous_versions == [self.version]
            and not self.upload
            and (self.previous_config == self.config_text)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "role": self.role,
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
        }


def serving_versions(config_text: str | None) -> list[str]:
    """The versions a stored config declares serving (its version_policy)."""
    if config_text is None:
        return []
    config = parse_config(config_text)
    if config.version_policy.HasField("specific"):
        return [str(v) for v in sorted(config.version_policy.specific.versions)]
    return []


def desired_config(text: str, versions: list[str], gpu: bool, pins: dict[str, str] | None = None) -> str:
    """``text`` with version_policy = exactly ``versions``, devices adapted, ensemble pins set."""
    from tritonclient.grpc import model_config_pb2

    config = parse_config(text)
    config.version_policy.specific.versions[:] = sorted(int(v) for v in versions)
    if not gpu:
        for group in config.instance_group:
            if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
                group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
    for step in config.ensemble_scheduling.step:
        if pins and step.model_name in pins:
            step.model_version = int(pins[step.model_name])
    return format_config(config)


def fetch_version(registry: MlflowRegistry, model: str, version: str, workdir: Path) -> Path:
    """Download a registered version as a Triton model folder ``workdir/<model>``."""
    record = mlflow_sqlite.model_version(registry.uri, model, version)
    local = record.local_source() if record else None
    tags = record.tags if record else dict(registry.version(model, version).tags or {})
    if tags.get("validation") == "failed":
        raise PromotionError(
            f"{model} version {version} failed validation when it was registered",
            fix=f"see 'mlreg show {model} --version {version}', fix the model and register again",
        )
    folder = workdir / model
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if local is not None and (local.parent / CONFIG_NAME).is_file():
        # the embedded registry's artifacts are local files: copy them, no MLflow import needed
        shutil.copy2(local.parent / CONFIG_NAME, folder / CONFIG_NAME)
        if local.is_dir():
            shutil.copytree(local, folder / version)
        else:
            (folder / version).mkdir()
        return folder
    mv = registry.version(model, version)
    download = workdir / f".download-{model}-{version}"
    registry.download(mv.run_id, CONFIG_NAME, download)
    shutil.copy2(download / CONFIG_NAME, folder / CONFIG_NAME)
    try:
        registry.download(mv.run_id, "model", download)
        shutil.copytree(download / "model", folder / version)
    except Exception:
        (folder / version).mkdir()
    shutil.rmtree(download, ignore_errors=True)
    return folder


def ensemble_pins(config_text: str) -> dict[str, str]:
    return {s.model_name: str(s.model_version) for s in parse_config(config_text).ensemble_scheduling.step}


def build_plan(
    registry: MlflowRegistry,
    store: RepositoryStore,
    env: Environment,
    targets: tuple[str, ...],
    model: str,
    version: str,
    workdir: Path,
) -> Plan:
    plan = Plan(env, targets, model, version, workdir=workdir)
    folder = fetch_version(registry, model, version, workdir)
    text = (folder / CONFIG_NAME).read_text()
    if load_config(folder / CONFIG_NAME).platform == "ensemble":
        for member, pinned in ensemble_pins(text).items():
            member_version = pinned if int(pinned) > 0 else _latest(registry, member)
            if member_version not in serving_versions(store.read_config(member)):
                plan.steps.append(
                    _step(registry, store, env, member, member_version, "member", workdir, final=True)
                )
    plan.steps.append(
        _step(registry, store, env, model, version, "model", workdir, final=False, folder=folder)
    )
    for ensemble, ens_text in _ensembles_using(store, model):
        pins = ensemble_pins(ens_text)
        if pins.get(model) not in (version, "-1"):
            current = store.read_config(ensemble)
            serving = serving_versions(current)
            plan.steps.append(
                Step(
                    ensemble,
                    serving[-1] if serving else "1",
                    "ensemble",
                    None,
                    desired_config(ens_text, serving or ["1"], env.gpu, {model: version}),
                    current,
                    serving,
                    upload=False,
                )
            )
    return plan


def _latest(registry: MlflowRegistry, model: str) -> str:
    versions = [int(v.version) for v in registry.versions(model)]
    if not versions:
        raise PromotionError(
            f"ensemble member '{model}' has no registered version",
            fix=f"register it first ('mlreg export {model}')",
        )
    return str(max(versions))


def _step(
    registry: MlflowRegistry,
    store: RepositoryStore,
    env: Environment,
    model: str,
    version: str,
    role: str,
    workdir: Path,
    final: bool,
    folder: Path | None = None,
) -> Step:
    folder = folder or fetch_version(registry, model, version, workdir)
    previous = store.read_config(model)
    serving = serving_versions(previous)
    stored = store.read_manifest(model, version) is not None
    text = (folder / CONFIG_NAME).read_text()
    return Step(
        model,
        version,
        role,
        folder,
        desired_config(text, [version], env.gpu),
        previous,
        serving,
        upload=not stored,
    )


def _ensembles_using(store: RepositoryStore, model: str) -> list[tuple[str, str]]:
    found = []
    for name in store.list_models():
        text = store.read_config(name)
        if (
            text
            and name != model
            and parse_config(text).platform == "ensemble"
            and any(s.model_name == model for s in parse_config(text).ensemble_scheduling.step)
        ):
            found.append((name, text))
    return found
