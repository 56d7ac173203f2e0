"""The contract diff between two versions of a model, and its effect on every ensemble using it.

A model's contract is what its config.pbtxt promises to callers and ensembles: the
inputs and outputs with data types and full shapes (batch dimension included),
and the largest batch it takes.  A change is *breaking* when a caller or ensemble
that worked with the old version can fail with the new one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from registry.contracts.config import data_type_name, full_shape
from registry.contracts.ensemble import check_ensemble
from registry.contracts.findings import Finding, shape_text
from registry.contracts.repository import ModelEntry, Repository
from registry.contracts.rules import kind

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

Impact = Literal["breaking", "compatible"]


@dataclass(frozen=True)
class Change:
    kind: str  # input-added, input-removed, output-added, output-removed, retyped, reshaped, max-batch-size
    tensor: str | None
    impact: Impact
    old: str | None
    new: str | None

    def line(self) -> str:
        where = f" '{self.tensor}'" if self.tensor else ""
        return f"{self.impact}: {self.kind}{where}: {self.old or '-'} -> {self.new or '-'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tensor": self.tensor,
            "impact": self.impact,
            "old": self.old,
            "new": self.new,
        }


@dataclass
class ContractDiff:
    model: str
    changes: list[Change]
    ensemble_findings: list[Finding]

    @property
    def breaking(self) -> bool:
        return any(c.impact == "breaking" for c in self.changes) or any(
            f.is_error for f in self.ensemble_findings
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "breaking": self.breaking,
            "changes": [c.to_dict() for c in self.changes],
            "ensemble_findings": [f.to_dict() for f in self.ensemble_findings],
        }


def _tensors(config: ModelConfig, io: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        t.name: (data_type_name(t.data_type), full_shape(config, list(t.dims))) for t in getattr(config, io)
    }


def _generalizes(wide: tuple[int, ...], narrow: tuple[int, ...]) -> bool:
    """Every shape ``narrow`` allows, ``wide`` allows too."""
    return len(wide) == len(narrow) and all(w in (n, -1) for w, n in zip(wide, narrow, strict=True))


def diff_configs(old: ModelConfig, new: ModelConfig) -> list[Change]:
    changes: list[Change] = []
    for io in ("input", "output"):
        before, after = _tensors(old, io), _tensors(new, io)
        for name in sorted(before.keys() - after.keys()):
            changes.append(Change(f"{io}-removed", name, "breaking", _spec(before[name]), None))
        for name in sorted(after.keys() - before.keys()):
            # a new required input breaks every caller; a new output breaks no one
            impact: Impact = "breaking" if io == "input" else "compatible"
            changes.append(Change(f"{io}-added", name, impact, None, _spec(after[name])))
        for name in sorted(before.keys() & after.keys()):
            (old_type, old_shape), (new_type, new_shape) = before[name], after[name]
            if old_type != new_type:
                changes.append(Change("retyped", name, "breaking", old_type, new_type))
            if old_shape != new_shape:
                # inputs may widen (accept more), outputs may narrow (promise more)
                ok = (
                    _generalizes(new_shape, old_shape)
                    if io == "input"
                    else _generalizes(old_shape, new_shape)
                )
                changes.append(
                    Change(
                        "reshaped",
                        name,
                        "compatible" if ok else "breaking",
                        shape_text(old_shape),
                        shape_text(new_shape),
                    )
                )
    if new.max_batch_size != old.max_batch_size:
        impact = "compatible" if new.max_batch_size > old.max_batch_size > 0 else "breaking"
        changes.append(
            Change("max-batch-size", None, impact, str(old.max_batch_size), str(new.max_batch_size))
        )
    return changes


def _spec(spec: tuple[str, tuple[int, ...]]) -> str:
    return f"TYPE_{spec[0]} {shape_text(spec[1])}"


def users_of(repo: Repository, model: str) -> list[ModelEntry]:
    """Ensembles in ``repo`` with a step that runs ``model``."""
    return [
        e
        for e in repo.models.values()
        if e.config is not None
        and kind(e) == "ensemble"
        and any(s.model_name == model for s in e.config.ensemble_scheduling.step)
    ]


def diff_model(old: ModelConfig, new: ModelConfig, repo: Repository | None = None) -> ContractDiff:
    """The changes, plus every error the new contract causes in the ensembles of ``repo``."""
    name = new.name or old.name
    findings: list[Finding] = []
    if repo is not None and name in repo.models:
        trial = copy.copy(repo)
        trial.models = dict(repo.models)
        trial.models[name] = ModelEntry(name, repo.models[name].path, new)
        for ensemble in users_of(trial, name):
            findings.extend(f for f in check_ensemble(ensemble, trial) if f.is_error)
    return ContractDiff(name, diff_configs(old, new), findings)
