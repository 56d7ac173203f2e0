"""The promotion as an MLflow run: who, when, from -> to, targets, store, the stage reports."""

from __future__ import annotations

import getpass
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pipelines.core.plan import Plan, Role
from pipelines.core.ports import DeploymentRecorder, RegistryEditor, RegistryWriter, RunRecorder
from pipelines.core.reports import PromotionResult
from pipelines.fleet.fleet import checkpoint
from pipelines.promote.environments import Environment
from pipelines.promote.plots import memory_plot, shadow_plot
from pipelines.promote.verdicts import complete
from registry.errors import MlregError, PromotionError
from registry.settings import redact_uri

log = logging.getLogger(__name__)


class PromotionLog(Protocol):
    """What recording a promotion writes through: its run (``runs``), the footprints' version tags
    (``models``) and where each moved version serves (``deployed``; the aliases and
    ``promoted_<env>`` tags go through ``RecordWrites``)."""

    @property
    def runs(self) -> RunRecorder: ...

    @property
    def models(self) -> RegistryWriter: ...

    @property
    def deployed(self) -> DeploymentRecorder: ...


def record_promotion(
    registry: PromotionLog,
    result: PromotionResult,
    env: Environment,
    experiment: str,
    writes: RecordWrites | None = None,
) -> None:
    """Log ``result`` as a run of ``experiment``; a registry that cannot be written is a warning
    (the promotion's outcome does not depend on its record).  A promotion that succeeded records
    the deployment of every model it moved (``writes.deployed``: members brought along and
    re-pointed ensembles too), each tag noted in ``writes`` first so that an exit puts it back."""
    plan = result.plan
    complete(result)  # every check's and guard's verdict, on every exit (pipelines/promote/verdicts.py)
    try:
        previous = ",".join(plan.step(plan.model).previous_versions) or "none"
    except StopIteration:
        previous = "unknown"
    try:
        run_id = registry.runs.start_run(
            experiment,
            f"{plan.model}-v{plan.version}-{env.name}",
            {
                "mlreg_model": plan.model,
                "mlreg_version": plan.version,
                "environment": env.name,
                "result": result.outcome,
                "user": getpass.getuser(),
            },
            start_time=result.started,  # the run lasts as long as the promotion, not its record
        )
        registry.runs.log(
            run_id,
            {
                "from_version": previous,
                "to_version": plan.version,
                "targets": redact_uri(",".join(plan.targets)),
                "store": redact_uri(env.store),  # never a secret in MLflow (refused already, too)
            }
            | headroom_params(result),
            {f"{s.stage}_seconds": s.seconds for s in result.stages}
            | perf_metrics(result)
            | footprint_metrics(result)
            | shadow_metrics(result)
            | verdict_metrics(result.verdicts),
        )
        with tempfile.TemporaryDirectory() as tmp:
            report = result.to_dict()  # URIs redacted: the plot's labels too
            (Path(tmp) / "report.json").write_text(json.dumps(report, indent=1, default=str))
            plot_memory(report.get("headroom") or {}, memory_title(plan), Path(tmp) / "memory.png")
            write_shadow(report.get("shadow") or [], Path(tmp))
            # every check's record, refused or not (pipelines/core/check.py), on every exit: [] too
            (Path(tmp) / "verdict.json").write_text(json.dumps(report["verdicts"], indent=1, default=str))
            registry.runs.log_artifacts(run_id, Path(tmp))
        registry.runs.finish_run(run_id, ok=not result.error)
        result.run_id = run_id
        registry.runs.link_promotion(  # the run and the versions link each other in the UI (story.py)
            run_id, experiment, env.name, result.outcome, story_versions(result, writes), result.error
        )
        if not result.error:  # version tags, run link, the model's environments
            deployed = writes.deployed if writes is not None else [(plan.model, plan.version)]
            for model, version in deployed:
                if writes is not None:
                    writes.note_deployment(model, version, env.name)
                registry.deployed.record_deployment(model, version, env.name, run_id, plan.targets)
    except MlregError as exc:
        log.warning("could not record the promotion in MLflow: %s", redact_uri(str(exc)))
    record_footprints(registry.models, result)


def story_versions(result: PromotionResult, writes: RecordWrites | None) -> list[tuple[str, str]]:
    """The versions a promotion run links: the promoted model's version first, then every other
    version it moved (``writes.deployed``: members and re-pointed ensembles as registered) or, when
    it did not record them, every model it tried to move at its planned version (an ensemble it
    would have re-pointed is left out: its planned number is the version that serves, not one tried)."""
    plan = result.plan
    tried = [(s.model, s.version) for s in plan.steps if s.role is not Role.ENSEMBLE]
    moved = writes.deployed if writes is not None and writes.deployed else tried
    first = (plan.model, plan.version)
    return [first] + [pair for pair in dict.fromkeys(moved) if pair != first]


# -- memory headroom (pipelines/guards/headroom.py): footprints measured, what the checks found --


def headroom_params(result: PromotionResult) -> dict[str, str]:
    """One line of what the headroom checks found (the figures are in the run's report.json)."""
    return {"headroom": result.headroom.summary()} if result.headroom is not None else {}


def footprint_metrics(result: PromotionResult) -> dict[str, float]:
    """Each footprint this promotion measured, as ``footprint_<model>_bytes``."""
    found = result.headroom.footprints() if result.headroom is not None else []
    return {f"footprint_{model}_bytes": float(size) for model, _, size, _ in found}


def memory_title(plan: Plan) -> str:
    """The plot's title: every model the promotion moves, and where."""
    moved = ", ".join(f"{s.model} v{s.version}" for s in plan.steps if not s.noop)
    return f"Memory over the promotion of {moved or plan.model + ' v' + plan.version} to '{plan.env.name}'"


def plot_memory(headroom: dict[str, Any], title: str, path: Path) -> None:
    """Each replica's memory over the promotion as ``path`` (plots.py), where the headroom guard
    read any; a plot that fails is a warning, never a failed record."""
    try:
        memory_plot(headroom, title, path)
    except Exception as exc:  # matplotlib missing or failing: the record goes on without the picture
        log.warning("could not plot the replicas' memory: %s: %s", type(exc).__name__, exc)


def record_footprints(registry: RegistryWriter, result: PromotionResult) -> None:
    """Each measured footprint as version tags, so later loads are checked without measuring:
    a fact about the version, written whatever the promotion's outcome and never put back; a
    registry that cannot be written is a warning (the next promotion measures again)."""
    for model, version, tags in result.headroom.version_tags() if result.headroom is not None else []:
        try:
            for key, value in tags.items():
                registry.set_version_tag(model, version, key, value)
        except MlregError as exc:
            log.warning("could not record the footprint of %s v%s: %s", model, version, redact_uri(str(exc)))


# -- the shadow replay (pipelines/checks/replay.py) ------------------------------------------------


VERDICT_FIGURES = ("value", "threshold", "sample", "noise_floor")


def verdict_metrics(verdicts: list[dict[str, Any]]) -> dict[str, float]:
    """One metric per measured value of each check's verdict (``verdict_<check>_<model>_value``,
    ``..._threshold``, ``..._sample``, ``..._noise_floor``), so MLflow charts them; where records
    share a name (a check's enforced and noted findings), a refusing record's figures, else the first's."""
    found: dict[str, float] = {}
    for verdict in sorted(verdicts, key=lambda v: not v.get("refuses")):
        model = str(verdict.get("subject") or "").split(" ")[0]
        prefix = "_".join(p for p in ("verdict", str(verdict.get("name", "")), model) if p)
        for figure in VERDICT_FIGURES:
            value = verdict.get(figure)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.setdefault(f"{prefix}_{figure}", float(value))
    return found


def shadow_metrics(result: PromotionResult) -> dict[str, float]:
    """Per replayed model: its divergence, the noise floor and how many requests were judged
    (``shadow_<model>_divergence`` ...), and the latency pairs' p95, so MLflow charts them."""
    found: dict[str, float] = {}
    for shadow in result.shadow:
        if not shadow.get("judged"):
            continue
        prefix = f"shadow_{shadow['model']}"
        found[f"{prefix}_divergence"] = float(shadow["divergence"])
        found[f"{prefix}_floor"] = float(shadow["floor_rate"])
        found[f"{prefix}_judged"] = float(shadow["judged"])
        for side, figures in (shadow.get("latency_ms") or {}).items():
            found[f"{prefix}_{side}_p95_ms"] = float(figures["p95"])
    return found


def write_shadow(shadows: list[dict[str, Any]], folder: Path) -> None:
    """The divergence table (``shadow.json``: per model and output, the first divergent requests)
    and one picture per replayed model (``shadow_<model>.png``); a plot that fails is a warning."""
    replayed = [s for s in shadows if s.get("judged")]
    if not replayed:
        return
    table = [
        {
            "model": s["model"],
            "candidate": s["candidate"],
            "serving": s["serving"],
            "verdict": s["verdict"],
            "judged": s["judged"],
            "diverged": s["diverged"],
            "floor": s["floor"],
            "outputs": [{k: v for k, v in o.items() if k != "histogram"} for o in s["outputs"]],
            "first": s["first"],
        }
        for s in replayed
    ]
    (folder / "shadow.json").write_text(json.dumps(table, indent=1, default=str))
    for shadow in replayed:
        title = f"Shadow replay of {shadow['model']} v{shadow['candidate']} against v{shadow['serving']}"
        try:
            shadow_plot(shadow, title, folder / f"shadow_{shadow['model']}.png")
        except Exception as exc:  # matplotlib missing or failing: the record goes on without it
            log.warning("could not plot the shadow replay: %s: %s", type(exc).__name__, exc)


def perf_metrics(result: PromotionResult) -> dict[str, float]:
    """The quality gate's performance figures as run metrics (``perf_<model>_candidate_p95_ms`` ...),
    so MLflow charts them across promotions."""
    found: dict[str, float] = {}
    for stage in result.stages:
        for perf in getattr(stage.report, "perf", None) or []:
            prefix = f"perf_{perf['model']}"
            for side in ("candidate", "serving"):
                figures = perf.get(side) or {}
                for key in ("p50_ms", "p95_ms", "throughput_rps"):
                    if isinstance(figures.get(key), int | float) and figures[key] == figures[key]:
                        found[f"{prefix}_{side}_{key}"] = float(figures[key])
            for key in ("p95_ratio", "threshold", "spread"):
                if isinstance(perf.get(key), int | float):
                    found[f"{prefix}_{key}"] = float(perf[key])
            load = (perf.get("triton") or {}).get("load_seconds")
            if isinstance(load, int | float):
                found[f"{prefix}_load_seconds"] = float(load)
    return found


# -- the record stage's MLflow writes, aliases last ------------------------------------------------


@dataclass
class RecordWrites:
    """What the record stage changed in MLflow, noted in the undo log before the first write
    (``UndoLog.wrote_registry``) so that any exit -- an error, an interrupt, a signal -- puts it
    back: ``tags`` (model, version) -> the ``promoted_<env>`` value before (None: none), and
    ``aliases`` model -> the version the alias named before (None: none), in the order moved; the
    deployment tags of every model moved (``serving_<env>``, ``promotion_run_<env>``, on the new
    version and on the versions that served before) are noted the same way (``note_deployment``)."""

    registry: RegistryEditor
    alias: str
    tag: str
    tags: dict[tuple[str, str, str], str | None] = field(default_factory=dict)  # (model, version, key)
    aliases: dict[str, str | None] = field(default_factory=dict)
    moved_to: dict[str, str] = field(default_factory=dict)
    deployed: list[tuple[str, str]] = field(default_factory=list)  # (model, version) this promotion serves
    read: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # tags as first read

    @property
    def changed(self) -> bool:
        return bool(self.tags or self.aliases)

    def _note(self, model: str, version: str, keys: tuple[str, ...]) -> None:
        if (model, version) not in self.read:  # read once: the values before this stage wrote any
            self.read[(model, version)] = self.registry.version_tags(model, version)
        found = self.read[(model, version)]
        for key in keys:
            self.tags.setdefault((model, version, key), found.get(key))  # noted before the write

    def tag_version(self, model: str, version: str, stamp: str) -> None:
        self._note(model, version, (self.tag,))
        self.deployed.append((model, version))
        self.registry.set_version_tag(model, version, self.tag, stamp)

    def note_deployment(self, model: str, version: str, env: str) -> None:
        """Before ``record_deployment``: the tags it writes on ``version`` and removes elsewhere."""
        keys = (f"serving_{env}", f"promotion_run_{env}")
        self._note(model, version, keys)
        for other in self.registry.find_by_tag(model, keys[0], "%", like=True):
            self._note(model, str(other.version), keys[:1])

    def move_alias(self, model: str, version: str) -> None:
        before = self.registry.aliases(model).get(self.alias)
        if before == version:
            return
        self.aliases.setdefault(model, before)  # noted before the write
        self.moved_to[model] = version
        self.registry.set_alias(model, self.alias, version)
        checkpoint(f"alias-moved:{model}")

    def put_back(self) -> tuple[list[str], list[str]]:
        """Aliases back (newest first), then the tags; (what was put back, what could not be)."""
        back: list[str] = []
        left: list[str] = []
        for model, before in reversed(list(self.aliases.items())):
            was = f"alias '{self.alias}' of {model} (moved to v{self.moved_to[model]})"
            try:
                if before is None:
                    self.registry.delete_alias(model, self.alias)
                else:
                    self.registry.set_alias(model, self.alias, before)
                back.append(f"{was} back to {'none' if before is None else 'v' + before}")
            except MlregError as exc:
                left.append(f"{was} could not be put back to {before or 'none'}: {exc.message}")
        for (model, version, key), value in self.tags.items():
            try:
                if value is None:
                    self.registry.delete_version_tag(model, version, key)
                else:
                    self.registry.set_version_tag(model, version, key, value)
            except MlregError as exc:
                left.append(f"tag {key} of {model} v{version} could not be put back: {exc.message}")
        self.tags.clear()
        self.aliases.clear()
        return back, left


def failed_record(writes: RecordWrites, exc: MlregError) -> PromotionError:
    """The record stage's error, saying what it had moved (the undo log puts it back)."""
    moved = (
        "no MLflow alias was moved"
        if not writes.aliases
        else "the aliases it moved go back: "
        + ", ".join(f"{m} (was v{b or 'none'})" for m, b in writes.aliases.items())
    )
    return PromotionError(
        f"recording in MLflow failed: {exc.message}; {moved}",
        fix=(exc.fix or "bring MLflow back")
        + "; then promote the version that serves again: a rerun repairs its alias",
    )


def repair_record(registry: RegistryEditor, env: Environment, serving: dict[str, str]) -> list[str]:
    """The no-op path: each ``model: version`` that serves has the environment's alias on it
    (moved back when a failed record stage left it elsewhere), and no other version carries a
    ``promoted_<env>`` tag newer than the serving one's (left by a failed attempt); what was
    repaired, one line each.  MLflow unreachable: a warning, the no-op still holds."""
    repaired: list[str] = []
    tag = f"promoted_{env.name}"
    try:
        for model, version in serving.items():
            current = registry.aliases(model).get(env.alias)
            if current != version:
                registry.set_alias(model, env.alias, version)
                repaired.append(
                    f"alias '{env.alias}' of {model} moved back to v{version} (was {current or 'none'})"
                )
            stamp = registry.version_tags(model, version).get(tag, "")
            for other in registry.find_by_tag(model, tag, "%", like=True):
                other_version = str(other.version)
                value = dict(getattr(other, "tags", None) or {}).get(tag, "")
                if other_version != version and value > stamp:
                    registry.delete_version_tag(model, other_version, tag)
                    repaired.append(f"tag {tag} of {model} v{other_version} (a failed attempt's) removed")
    except MlregError as exc:
        log.warning("could not check the '%s' aliases in MLflow: %s", env.alias, exc)
    return repaired
