"""``mlreg register``: register a Triton model folder exported elsewhere as an MLflow version.

The folder is validated: a failing contract is still registered, tagged ``validation=failed`` (no
promotion takes it), and ``failed_validation`` is the error the CLI exits with unless the user
says it is meant (``--allow-invalid``).  The name must fit every store's lock key before anything
is written.  :class:`RegisterReport` is also what
``mlreg export`` returns: the versions registered, or for a dry run the ones that would be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import open_registry
from mlreg.ops.sign import SignerSpec
from pipelines.storage import check_model_name_fits
from registry.errors import ContractError, UsageError
from registry.register import RegisterResult, find_candidate, register
from registry.settings import Settings

if TYPE_CHECKING:
    from registry.export import PlannedVersion


@dataclass
class RegisterReport:
    """The versions registered; with ``dry_run``, those a plan would register (``planned``: their
    files and tags, by (model, version))."""

    results: list[RegisterResult]
    dry_run: bool = False
    planned: dict[tuple[str, str], PlannedVersion] = field(default_factory=dict)

    def planned_version(self, result: RegisterResult) -> PlannedVersion | None:
        return self.planned.get((result.model, result.version))

    def failed_validation(self) -> ContractError | None:
        """The error of a registration whose version failed validation (None when every one
        passed, or for a plan): what was recorded, and how to go on."""
        failed = [r for r in self.results if r.validation == "failed" and not self.planned_version(r)]
        if not failed:
            return None
        names = ", ".join(f"{r.model} v{r.version}" for r in failed)
        return ContractError(
            f"{names} failed validation: registered, tagged validation=failed, and no promotion takes it",
            fix="fix the errors listed above and register the folder again (a new version); "
            "pass --allow-invalid where a failing version is meant",
            model=failed[0].model,
            version=failed[0].version,
        )

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for result in self.results:
            row = result.to_dict()
            if (version := self.planned_version(result)) is not None:
                row["planned"] = version.to_dict()
            rows.append(row)
        doc: dict[str, Any] = {"versions": rows}
        if self.dry_run:
            doc["dry_run"] = True
        return doc


def register_version(
    settings: Settings,
    model: str,
    path: Path,
    config: Path | None = None,
    *,
    force: bool = False,
    signing: SignerSpec | None = None,
) -> RegisterReport:
    """Register the folder at ``path`` (a model folder, or a version folder with ``config``) as a
    new version of ``model`` (``force``: even when identical bytes are registered)."""
    check_model_name_fits(model)  # every store must be able to lock it: before anything is written
    candidate = find_candidate(path, config)
    if candidate.name != model:
        raise UsageError(
            f"'{path}' holds model '{candidate.name}', not '{model}'",
            fix=f"run 'mlreg register {candidate.name} {path}' or fix the config's name",
        )
    signer = signing.signer() if signing is not None else None
    return RegisterReport([register(open_registry(settings), candidate, force=force, signer=signer)])


__all__ = ["RegisterReport", "register_version"]
