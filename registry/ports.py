"""The model registry as its callers use it, as Protocols, one per part of a registry.

A registry is parts, each a public attribute its callers take alone: ``models`` reads and writes
registered models, versions, aliases and tags (``RegistryReader``, ``RegistryWriter``), ``runs``
records and reads runs (``RunRecorder``, ``RunReader``), ``deployed`` records where a version
serves (``DeploymentRecorder``).  A caller takes the one part it uses; one that reads a version's
run too takes the ``RegistryView`` (both read parts).  ``MlflowRegistry`` (registry.mlflow) is
the real one (``MlflowVersions``, ``MlflowRuns``, ``MlflowDeployments``); ``PlanRegistry``
(registry.export) is the same parts over a real registry read only, keeping what it would write
in memory.  The promotion's ``Registry`` (pipelines.core.ports) is the three parts and what
composes them (``DerivedVersions``).  ``Registrar`` is what ``register()`` and
``sign_registered()`` (registry.register) write a version through: a run, its logged model and
the registered version.  Nothing here imports MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from registry.logged_model import LoggedTritonModel


class RegistryReader(Protocol):
    """Reads registered models and versions: their tags and files, aliases (a registry's
    ``models`` part); where the registry is and whether it answers."""

    @property
    def uri(self) -> str:
        """Where the registry is (MLflow's tracking URI)."""
        ...

    def warm_up(self) -> None: ...

    def ping(self) -> None:
        """Raise RegistryError unless the registry answers (a tracking server within its timeout;
        the embedded sqlite registry is created where it does not exist yet)."""
        ...

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        """Write the registered files of ``name`` ``version`` as a Triton model folder:
        ``dest/config.pbtxt`` and ``dest/<version>/``; return the version's tags."""
        ...

    def version(self, name: str, version: str) -> Any: ...

    def versions(self, name: str) -> list[Any]: ...

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        """The tags of one version (cheap where the registry can answer without a client)."""
        ...

    def aliases(self, name: str) -> dict[str, str]: ...

    def require_model(self, name: str) -> dict[str, str]:
        """``name``'s aliases; RegistryError naming it when it is not registered."""
        ...

    def alias_versions(self, alias: str) -> dict[str, str]:
        """Every registered model whose ``alias`` names a version -> that version."""
        ...

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]: ...


class RegistryWriter(Protocol):
    """Writes registered models and versions: aliases, version tags, a model deleted (a
    registry's ``models`` part)."""

    def delete_model(self, name: str) -> None:
        """Delete a registered model: only one the caller's registration created and that has no
        version and no alias left (``pipelines/core/undo.py``)."""
        ...

    def set_alias(self, name: str, alias: str, version: str) -> None: ...

    def delete_alias(self, name: str, alias: str) -> None: ...

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None: ...

    def delete_version_tag(self, name: str, version: str, key: str) -> None: ...


class RunReader(Protocol):
    """Reads what runs logged: a run's files, the promotions recorded (a registry's ``runs``)."""

    def download(self, run_id: str, path: str, dest: Path) -> Path: ...

    def promotions(self, name: str, env: str | None = None) -> list[dict[str, Any]]:
        """The promotions of ``name`` (in ``env``; None: everywhere) recorded by ``start_run``,
        newest first: when (epoch ms), environment, from, to, result, user, run_id."""
        ...


class RegistryView(Protocol):
    """The registry's two read parts, for a reader of a version's run too (its manifest,
    signature or replay set): ``models`` and ``runs``."""

    @property
    def models(self) -> RegistryReader: ...

    @property
    def runs(self) -> RunReader: ...


class DeploymentRecorder(Protocol):
    """Records where a version serves (a registry's ``deployed`` part)."""

    def record_deployment(
        self, model: str, version: str, env: str, run_id: str, targets: tuple[str, ...] | list[str]
    ) -> None: ...


class DerivedVersions(Protocol):
    """What composes a registry's parts: a version mlreg derived registered (a run, its logged
    model, the version), one it made deleted with its run."""

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
        """Register a version mlreg derived (a re-pointed ensemble, an ONNX conversion): validated,
        manifest and digest recorded like any other; an identical one is reused. ``tags`` are set
        on a version created now, in the same call that creates it (never on one reused: they
        prove who made it). Returns its number."""
        ...

    def delete_version(self, name: str, version: str) -> None:
        """Delete a version (and the run that registered it): only for one the caller proved it
        made (``pipelines/core/undo.py``: a promotion's re-pointed ensemble, on its way back)."""
        ...


class RunRecorder(Protocol):
    """Runs: what an export or a promotion did, with its parameters, metrics and files (a
    registry's ``runs`` part: ``MlflowRuns``, ``PlanRuns``)."""

    def experiment_id(self, name: str = ...) -> str: ...

    def start_run(
        self, experiment: str, name: str, tags: dict[str, str], start_time: float | None = None
    ) -> str:
        """A new run (``start_time``: when what it records began, epoch seconds; None: now)."""
        ...

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None: ...

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None: ...

    def finish_run(self, run_id: str, ok: bool) -> None: ...

    def link_promotion(
        self,
        run_id: str,
        experiment: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        """The promotion run and the versions it moved or tried, linked both ways in the UI
        (``registry.mlflow.story``)."""
        ...


class SignatoryRuns(Protocol):
    """What signing reads and writes of a version's run: its files."""

    def artifact_uri(self, run_id: str) -> str: ...

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None: ...


class SignatoryVersions(Protocol):
    """What signing reads and writes of a registered version: its files, tags and description."""

    def version(self, name: str, version: str) -> Any: ...

    def version_tags(self, name: str, version: str) -> dict[str, str]: ...

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]: ...

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None: ...

    def update_version_description(self, name: str, version: str, description: str) -> None: ...


class Signatory(Protocol):
    """What ``sign_registered`` reads and writes: the version's files, tags and description
    (``models``) and its run's files (``runs``)."""

    @property
    def runs(self) -> SignatoryRuns: ...

    @property
    def models(self) -> SignatoryVersions: ...


class RegistrarRuns(RunRecorder, SignatoryRuns, Protocol):
    """What ``register()`` records a version's run through: the run, its logged model (MLflow
    3), and the run dropped when its version is not created."""

    def discard_run(self, run_id: str) -> None: ...

    def log_model(self, run_id: str, experiment: str, model: LoggedTritonModel) -> str: ...


class RegistrarVersions(SignatoryVersions, Protocol):
    """What ``register()`` registers a version through: identical bytes found by their digest
    tag, the registered model, the version."""

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]: ...

    def ensure_model(self, name: str, description: str) -> None: ...

    def create_version(
        self,
        name: str,
        source: str,
        run_id: str,
        tags: dict[str, str],
        description: str,
        model_id: str | None = None,
    ) -> str: ...


class Registrar(Signatory, Protocol):
    """What ``register()`` writes a version through: its run and logged model (``runs``) and the
    registered version (``models``); identical bytes found by their digest tag (and signed when
    asked)."""

    @property
    def runs(self) -> RegistrarRuns: ...

    @property
    def models(self) -> RegistrarVersions: ...

    @property
    def local_root(self) -> Path:
        """Where a local registry writes (a full disk is named by it)."""
        ...


class LoggedRuns(RegistrarRuns, Protocol):
    """What the NVIDIA flavors' import reads of the run a version was logged from."""

    def download_model(self, model: str, version: str, dest: Path) -> Path:
        """The registered version's MLflow Model folder (MLmodel + its files), written to ``dest``."""
        ...

    def logged_model_name(self, model_id: str) -> str: ...

    def artifact_paths(self, run_id: str, path: str) -> set[str]:
        """The paths of the artifacts run ``run_id`` logged under ``path`` (one level)."""
        ...

    def download(self, run_id: str, path: str, dest: Path) -> Path: ...


class LoggedModels(Registrar, Protocol):
    """What turning a version NVIDIA's flows logged into an mlreg version reads and registers
    through (``registry.nvidia_flavors``): its MLflow Model and the run it was logged from
    (``runs``)."""

    @property
    def runs(self) -> LoggedRuns: ...


@runtime_checkable
class VersionPlan(Protocol):
    """A registry that also holds versions only planned (``mlreg export --dry-run``): not signed
    yet, never registered for real."""

    def planned_version(self, name: str, version: str) -> object | None: ...


def is_planned(registry: object, name: str, version: str) -> bool:
    """``name`` ``version`` is a version only a plan would register."""
    return isinstance(registry, VersionPlan) and registry.planned_version(name, version) is not None
