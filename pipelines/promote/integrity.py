"""Never load unverified bytes: every version a promotion may make a server load -- the new one,
and the versions it would go back to on an abort or a rollback -- is checked against the digest
registered in MLflow before the first change, and again by the undo log before it loads one.

A stored version whose bytes are corrupt is restored from the registry's artifacts when those
match the registered digest (``Repair``: planned by ``validate``, written by ``assemble``, the
first live stage); otherwise the promotion is refused before any change, naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.promote.plan import Step
from pipelines.promote.ports import Registry
from pipelines.promote.undo import VerifyStored
from pipelines.storage.base import RepositoryStore
from registry.contracts.config import CONFIG_NAME
from registry.errors import MlregError, PromotionError, StorageError
from registry.manifest import artifact_digest


@dataclass(frozen=True)
class Repair:
    """A stored version to rewrite from the registry's copy in ``folder`` (config + <version>/)."""

    model: str
    version: str
    folder: Path
    problem: str  # what the store's copy got wrong

    def detail(self) -> str:
        return f"{self.model}/{self.version} restored from the registry ({self.problem})"


def check_stored(
    store: RepositoryStore, registry: Registry, step: Step, version: str, digest: str, workdir: Path
) -> Repair | None:
    """None when ``step.model``/``version`` in the store is the registered version; a Repair when
    the registry's copy is; else PromotionError naming what is wrong in both."""
    try:
        store.verify_version(step.model, version, digest or None)
        return None
    except StorageError as exc:
        problem = exc.message
    if not digest:
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} does not verify ({problem}) and MLflow records no "
            "digest to restore it against",
            fix="promote a version registered with its digest, or push it again ('mlreg store push')",
        )
    folder = workdir / f"registered-{step.model}-{version}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        registry.fetch_version(step.model, version, folder)
        found = artifact_digest(folder / version, folder / CONFIG_NAME)
    except (MlregError, OSError) as exc:
        reason = exc.message if isinstance(exc, MlregError) else str(exc)
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} does not verify ({problem}); the registry's copy "
            f"cannot be read either: {reason}",
            fix="restore the version's files, then promote again",
        ) from exc
    if found != digest:
        raise PromotionError(
            f"{step.model} v{version} in {store.uri} does not verify ({problem}), and the registry's "
            f"copy does not match its registered digest either",
            fix="the version's bytes are lost: promote another version",
        )
    return Repair(step.model, version, folder, problem)


def apply_repair(store: RepositoryStore, repair: Repair) -> str:
    """Rewrite the stored version from the registry's copy, then verify it; returns the detail."""
    folder = repair.folder
    store.put_version(repair.model, repair.version, folder / repair.version, config=folder / CONFIG_NAME)
    store.verify_version(repair.model, repair.version, None)
    return repair.detail()


def verifier(store: RepositoryStore, digests: dict[tuple[str, str], str]) -> VerifyStored:
    """What the undo log asks before it loads a version again: "" when the bytes verify."""

    def verify(model: str, version: str) -> str:
        try:
            store.verify_version(model, version, digests.get((model, version)) or None)
        except StorageError as exc:
            return f"{model} v{version} does not verify ({exc.message})"
        return ""

    return verify
