"""``mlreg export``: run the template's exporters, then register every result.

``mlreg export --dry-run`` registers into a ``PlanRegistry`` instead: the real registry read
only, what would be registered kept in memory and listed (folder and tags) in the ``--json``
document, which ``mlreg promote --from-file F --dry-run`` plans from.  A pull request's plan runs
the pull request's code (exporters, ``mlreg.toml``) with a read-only MLflow token: it can write
nothing, and needs to write nothing.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry import template
from registry.contracts.config import CONFIG_NAME, load_config
from registry.errors import RegistryError, UsageError
from registry.mlflow import MlflowRegistry
from registry.mlflow.versions import not_found
from registry.ports import RegistrarRuns, RegistrarVersions, RegistryReader, RegistryWriter
from registry.register import Candidate, RegisterResult, find_candidate, register
from registry.settings import EXPORTS_EXPERIMENT, Settings, redact_uri

if TYPE_CHECKING:
    from registry.logged_model import LoggedTritonModel
    from registry.mlflow.runs import MlflowRuns
    from registry.mlflow.versions import MlflowVersions
    from registry.signing import SigningKey


def _is_ensemble(model_dir: Path) -> bool:
    return load_config(model_dir / CONFIG_NAME).platform == "ensemble"


def member_versions(registry: RegistryReader, model_dir: Path) -> dict[str, str]:
    """For an ensemble: the registry version of each member it was built against."""
    config = load_config(model_dir / CONFIG_NAME)
    members = {}
    for step in config.ensemble_scheduling.step:
        if step.model_version > 0:
            members[step.model_name] = str(step.model_version)
        else:
            versions = registry.versions(step.model_name)
            members[step.model_name] = str(max((int(v.version) for v in versions), default=0))
    return members


def export_models(
    settings: Settings,
    registry: MlflowRegistry | PlanRegistry,
    models: list[str] | None = None,
    seed: int = 0,
    force: bool = False,
    on_model: Callable[[str], None] | None = None,
    signer: SigningKey | None = None,
) -> list[RegisterResult]:
    """Build every template model (``on_model("exporting NAME (i/n)")`` before each) and register
    the results, members before ensembles (``on_model("registering NAME (i/n)")``)."""
    tell = on_model or (lambda _: None)
    chosen = template.chosen_models(settings.template_dir, models, "gpu")
    exporting = iter(range(1, len(chosen) + 1))
    staging = settings.home / "exports"
    if staging.exists():
        shutil.rmtree(staging)
    # registered configs are the template's own (KIND_GPU kept): devices are adapted at deploy
    built = template.build(
        settings.template_dir,
        staging,
        models=models,
        seed=seed,
        device="gpu",
        force=True,
        on_model=lambda name: tell(f"exporting {name} ({next(exporting, len(chosen))}/{len(chosen)})"),
    )
    folders = sorted(
        (p for p in staging.iterdir() if (p / CONFIG_NAME).is_file()), key=lambda p: (_is_ensemble(p), p.name)
    )  # members before ensembles
    results = []
    for index, folder in enumerate(folders, 1):
        tell(f"registering {folder.name} ({index}/{len(folders)})")
        exporter = template.exporter_path(settings.template_dir / folder.name)
        members = member_versions(registry.models, folder) if _is_ensemble(folder) else None
        info = dict(built.exported.get(folder.name) or {})
        results.append(
            register(
                registry,
                find_candidate(folder),
                force=force,
                exporter=exporter,
                export_info=info,
                members=members,
                signer=None if isinstance(registry, PlanRegistry) else signer,  # a plan signs nothing
            )
        )
    return results


def export(
    settings: Settings,
    registry: MlflowRegistry | PlanRegistry,
    models: list[str] | None = None,
    *,
    seed: int = 0,
    force: bool = False,
    against: str | None = None,
    signer: SigningKey | None = None,
    on_step: Callable[[str], None] | None = None,
) -> list[RegisterResult]:
    """Export the template and register every result in ``registry`` (a ``PlanRegistry``: nothing
    written); with ``against``, return only the versions that alias does not hold yet, refused
    before any exporter runs when no model holds it (``require_base``).  ``signer``: each version
    registered is signed (``registry.signing``).  ``on_step``: told what it does now ("exporting
    NAME (1/4)", "registering NAME (1/4)"), for a progress line."""
    if against is not None:
        require_base(registry.models, against)
    results = export_models(
        settings, registry, models, seed=seed, force=force, on_model=on_step, signer=signer
    )
    return results if against is None else changed_versions(registry.models, results, against)


def require_base(registry: RegistryReader, alias: str) -> None:
    """``mlreg export --changed`` compares with ``alias``: a UsageError, before anything is exported
    or registered, when no registered model holds it.  Then there is nothing to compare with (a
    fresh registry, e.g. MLREG_HOME outside the project, or a typo) and "changed" would silently
    mean every model."""
    if registry.alias_versions(alias):
        return
    raise UsageError(
        f"--changed lists the versions alias '{alias}' does not hold yet, but no registered model "
        f"in MLflow ({redact_uri(registry.uri)}) holds '{alias}': there is nothing to compare with",
        fix="pass --against the alias of an environment promoted to, or point MLFLOW_TRACKING_URI "
        "at the project's registry; before the first promotion, drop --changed (every model is new)",
    )


def changed_versions(
    registry: RegistryReader, results: list[RegisterResult], alias: str
) -> list[RegisterResult]:
    """The results an environment owning ``alias`` does not have yet (``mlreg export --changed``):
    a version registered just now, or one newer than the version the alias holds (registered by
    an earlier export, e.g. a pull request's plan).  An ensemble re-pointed by a promotion holds a
    newer alias than its template's version, so it is not listed again."""
    changed = []
    for r in results:
        held = registry.aliases(r.model).get(alias)
        if r.created or held is None or int(r.version) > int(held):
            changed.append(r)
    return changed


# -- the plan: what an export would register, nothing written -----------------------------------


@dataclass
class PlannedVersion:
    """A version an export would register: its files on disk and the tags registering gives it."""

    name: str
    version: str
    config_path: Path
    version_dir: Path
    tags: dict[str, str] = field(default_factory=dict)
    run_id: str = ""  # never logged
    aliases: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": str(self.config_path),
            "version_dir": str(self.version_dir),
            "tags": dict(self.tags),
        }

    @classmethod
    def from_dict(cls, name: str, version: str, data: dict[str, Any]) -> PlannedVersion:
        """The ``planned`` entry of an ``mlreg export --dry-run --json`` document; its files must
        still be there (the same job: the export's folder is MLREG_HOME/exports)."""
        planned = cls(name, version, Path(data["config"]), Path(data["version_dir"]), dict(data["tags"]))
        for path in (planned.config_path, planned.version_dir):
            if not path.exists():
                raise UsageError(
                    f"{name} v{version}: the planned version's files are gone ({path})",
                    fix="run 'mlreg export --dry-run' and the plan in the same job (same MLREG_HOME)",
                )
        return planned


READ_ONLY = "a plan (--dry-run) writes nothing to MLflow"


class PlanRuns(RegistrarRuns):
    """A plan's runs: none is created, nothing logged; a logged model kept in memory until its
    planned version takes its files (``PlanVersions.create_version``); what real runs hold read
    from ``base``."""

    def __init__(self, base: MlflowRuns) -> None:
        self.base = base
        self.logged: dict[str, LoggedTritonModel] = {}
        self._ids = itertools.count(1)

    def experiment_id(self, name: str = EXPORTS_EXPERIMENT) -> str:
        return ""

    def start_run(
        self, experiment: str, name: str, tags: dict[str, str], start_time: float | None = None
    ) -> str:
        return ""  # no run: a plan's report links to none

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        return None

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        return None

    def finish_run(self, run_id: str, ok: bool) -> None:
        return None

    def link_promotion(
        self,
        run_id: str,
        experiment: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        return None

    def discard_run(self, run_id: str) -> None:
        return None

    def log_model(self, run_id: str, experiment: str, model: LoggedTritonModel) -> str:
        model_id = f"planned-{next(self._ids)}"
        self.logged[model_id] = model
        return model_id

    def artifact_uri(self, run_id: str) -> str:
        return self.base.artifact_uri(run_id)

    def download(self, run_id: str, path: str, dest: Path) -> Path:
        return self.base.download(run_id, path, dest)

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        return self.base.promotions(name, env)


class PlanVersions(RegistryReader, RegistryWriter, RegistrarVersions):
    """The registered versions as a plan sees them (``PlanRegistry.models``): ``base``'s, read
    only, and in memory the versions a plan would register (numbered as MLflow would number them
    next).  ``create_version`` keeps a planned version's files and tags (its logged model:
    ``runs``); a planned version's tags are kept; moving an alias, tagging or describing a
    registered version is refused."""

    def __init__(self, base: MlflowVersions, runs: PlanRuns, planned: Iterable[PlannedVersion] = ()) -> None:
        self.base = base
        self.runs = runs
        self.planned: dict[tuple[str, str], PlannedVersion] = {}
        for version in planned:
            self._add(version)

    def _add(self, version: PlannedVersion) -> None:
        taken = {str(v.version) for v in self.base.versions(version.name)}
        if version.version in taken:
            raise RegistryError(
                f"{version.name} version {version.version} was registered in MLflow ({redact_uri(self.uri)}) "
                "since the plan's export numbered it",
                fix="run 'mlreg export --dry-run' again, then the plan",
            )
        self.planned[(version.name, version.version)] = version

    def planned_version(self, name: str, version: str) -> PlannedVersion | None:
        """The version only this plan registers (``registry.ports.VersionPlan``), else None."""
        return self.planned.get((name, version))

    @property
    def uri(self) -> str:
        return self.base.uri

    # -- reads: the real registry, then the plan --------------------------------------------------

    def warm_up(self) -> None:
        self.base.warm_up()

    def ping(self) -> None:
        self.base.ping()

    def versions(self, name: str) -> list[Any]:
        mine = [v for (model, _), v in self.planned.items() if model == name]
        return [*self.base.versions(name), *mine]

    def version(self, name: str, version: str) -> Any:
        return self.planned.get((name, version)) or self.base.version(name, version)

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        planned = self.planned.get((name, version))
        return dict(planned.tags) if planned is not None else self.base.version_tags(name, version)

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]:
        mine = [v for (model, _), v in self.planned.items() if model == name and v.tags.get(key) == value]
        return [*self.base.find_by_tag(name, key, value, like), *mine]

    def require_model(self, name: str) -> dict[str, str]:
        if any(model == name for model, _ in self.planned):
            return self.aliases(name)  # a model only the plan registers: no alias yet
        return self.base.require_model(name)

    def aliases(self, name: str) -> dict[str, str]:
        """A model only the plan registers holds no alias yet."""
        try:
            return self.base.aliases(name)
        except RegistryError as exc:
            new = any(model == name for model, _ in self.planned)
            if new and not_found(exc):
                return {}
            raise

    def alias_versions(self, alias: str) -> dict[str, str]:
        return self.base.alias_versions(alias)

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        planned = self.planned.get((name, version))
        if planned is None:
            return self.base.fetch_version(name, version, dest)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        shutil.copy2(planned.config_path, dest / CONFIG_NAME)
        shutil.copytree(planned.version_dir, dest / version)
        return dict(planned.tags)

    # -- writes: kept in memory, or refused -------------------------------------------------------

    def ensure_model(self, name: str, description: str) -> None:
        return None

    def create_version(
        self,
        name: str,
        source: str,
        run_id: str,
        tags: dict[str, str],
        description: str,
        model_id: str | None = None,
    ) -> str:
        logged = self.runs.logged.pop(str(model_id))
        number = str(max((int(v.version) for v in self.versions(name)), default=0) + 1)
        self._add(PlannedVersion(name, number, logged.config_path, logged.version_dir, dict(tags)))
        return number

    def delete_version(self, name: str, version: str) -> None:
        """A planned version forgotten; a registered one is never touched (read-only)."""
        if self.planned.pop((name, version), None) is None:
            raise RegistryError(f"{READ_ONLY}: delete {name} v{version}", fix="drop --dry-run")

    def delete_model(self, name: str) -> None:
        """Never: a plan deletes nothing registered (a dry run never reaches the deploy that registers)."""
        raise RegistryError(f"{READ_ONLY}: delete model {name}", fix="drop --dry-run")

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        planned = self.planned.get((name, version))
        if planned is None:
            raise RegistryError(f"{READ_ONLY}: tag {key} of {name} v{version}", fix="drop --dry-run")
        planned.tags[key] = value

    def set_alias(self, name: str, alias: str, version: str) -> None:
        raise RegistryError(f"{READ_ONLY}: alias {alias} of {name}", fix="drop --dry-run")

    def delete_alias(self, name: str, alias: str) -> None:
        raise RegistryError(f"{READ_ONLY}: alias {alias} of {name}", fix="drop --dry-run")

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        raise RegistryError(f"{READ_ONLY}: tag {key} of {name} v{version}", fix="drop --dry-run")

    def update_version_description(self, name: str, version: str, description: str) -> None:
        raise RegistryError(f"{READ_ONLY}: description of {name} v{version}", fix="drop --dry-run")


class PlanDeployments:
    """Where versions serve, as a plan records it: never (``PlanRegistry.deployed``)."""

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None:
        raise RegistryError(f"{READ_ONLY}: deployment of {model} v{version}", fix="drop --dry-run")


class PlanRegistry:
    """The registry as a plan sees it, in the real one's parts: ``base`` for everything
    registered, read only, and in memory the versions a plan would register (``models``:
    ``PlanVersions``).  ``register()`` runs unchanged on it (a ``Registrar``): runs and
    artifacts are dropped (``runs``: ``PlanRuns``), ``create_version`` keeps the files and tags.
    A derived version is planned; a deployment is refused (``deployed``: ``PlanDeployments``)."""

    def __init__(self, base: MlflowRegistry, planned: Iterable[PlannedVersion] = ()) -> None:
        self.base = base
        self.settings = base.settings
        self.runs = PlanRuns(base.runs)
        self.models = PlanVersions(base.models, self.runs, planned)
        self.deployed = PlanDeployments()

    @property
    def uri(self) -> str:
        return self.base.uri

    @property
    def local_root(self) -> Path:
        return self.base.local_root

    def register_version(
        self,
        name: str,
        version_dir: Path,
        config_path: Path,
        *,
        members: dict[str, str] | None = None,
        export_info: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A version the promotion derives (an ONNX conversion, a re-pointed ensemble): planned."""
        candidate = Candidate(name, version_dir, config_path)
        registered = register(self, candidate, members=members, export_info=export_info, version_tags=tags)
        return registered.version

    def delete_version(self, name: str, version: str) -> None:
        """A planned version forgotten (it has no run); a registered one is never touched."""
        self.models.delete_version(name, version)
