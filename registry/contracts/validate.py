"""``validate_path``: every contract check on a repository or one model folder."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.contracts.checks import check_artifacts
from registry.contracts.ensemble import check_ensembles
from registry.contracts.findings import Finding
from registry.contracts.links import link_findings
from registry.contracts.repository import read_repository
from registry.contracts.rules import check_model
from registry.errors import UsageError

GPUS_ENV = "MLREG_GPUS"


@dataclass
class Report:
    path: str
    models: list[str]
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.is_error]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if not f.is_error]

    @property
    def beyond_triton(self) -> list[Finding]:
        """Findings mlreg adds beyond Triton's own refusals (labelled [mlreg])."""
        return [f for f in self.findings if f.origin == "mlreg"]

    def summary(self) -> str:
        text = (
            f"{len(self.models)} model(s) checked: {len(self.errors)} error(s), "
            f"{len(self.warnings)} warning(s)"
        )
        extra = len(self.beyond_triton)
        return f"{text} ({extra} of them [mlreg]: beyond what Triton refuses)" if extra else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "models": self.models,
            "ok": not self.errors,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "beyond_triton": len(self.beyond_triton),
            "findings": [f.to_dict() for f in self.findings],
        }


def gpus_from_env() -> int | None:
    """The serving machine's GPU count from ``MLREG_GPUS``; None (unknown) when unset."""
    text = os.environ.get(GPUS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise UsageError(
            f"{GPUS_ENV}={text!r} is not a GPU count", fix=f"set {GPUS_ENV} to 0, 1, 2, ... or unset it"
        )
    return int(text)


def validate_path(path: Path, gpus: int | None = None) -> Report:
    """Every check; ``gpus``: the serving machine's GPU count (default: ``MLREG_GPUS``, else unknown)."""
    gpus = gpus if gpus is not None else gpus_from_env()
    repo = read_repository(path)
    report = Report(str(path), sorted(repo.models), list(repo.findings))
    for entry in repo.models.values():
        report.findings.extend(link_findings(entry.name, entry.path))
        rule_findings = list(check_model(entry, gpus))
        report.findings.extend(rule_findings)
        broken_files = any(f.rule == "model-file" for f in rule_findings)
        if not broken_files:
            report.findings.extend(check_artifacts(entry))
    report.findings.extend(check_ensembles(repo))
    return report
