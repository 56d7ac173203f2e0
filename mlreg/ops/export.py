"""``mlreg export``: run the template's exporters and register every result as an MLflow version.

With ``changed`` only versions the ``against`` alias does not hold yet are listed (for CI: some
registered model must hold that alias, else a ``UsageError`` before anything is registered).
With ``dry_run`` nothing is registered -- MLflow is only read -- and the report lists what would
be, for ``mlreg promote --from-file F --dry-run`` (a pull request's plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlreg.ops.context import open_registry
from mlreg.ops.register import RegisterReport
from mlreg.ops.sign import SignerSpec
from registry.errors import UsageError
from registry.export import PlanRegistry, export
from registry.settings import Settings

DEFAULT_BASE = "staging"


def export_versions(
    settings: Settings,
    models: Sequence[str] | None = None,
    *,
    seed: int = 0,
    force: bool = False,
    changed: bool = False,
    against: str | None = None,
    dry_run: bool = False,
    signing: SignerSpec | None = None,
    on_step: Callable[[str], None] | None = None,
) -> RegisterReport:
    """Export ``models`` (default: every template model) with ``seed`` and register them."""
    if against is not None and not changed:
        raise UsageError(
            "--against only applies with --changed",
            fix=f"pass --changed --against {against}, or drop --against",
        )
    registry = open_registry(settings)
    plan = PlanRegistry(registry) if dry_run else None
    base = (against or DEFAULT_BASE) if changed else None
    signer = signing.signer() if signing is not None and not dry_run else None
    results = export(
        settings,
        plan or registry,
        list(models) if models else None,
        seed=seed,
        force=force,
        against=base,
        signer=signer,
        on_step=on_step,
    )
    planned = {
        (r.model, r.version): p
        for r in results
        if plan and (p := plan.models.planned_version(r.model, r.version))
    }
    return RegisterReport(results, dry_run=dry_run, planned=planned)


__all__ = ["export_versions"]
