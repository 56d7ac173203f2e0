"""``mlreg shadow``: capture of the requests production sends (Triton's trace), which every
promotion's quality gate replays to the candidate -- switch it on, show it, purge it.

Each verb drives every replica of the environment (``targets``); a replica that cannot be reached
is reported (``failed``, or an ``error`` row), never skipped silently.  Tensors may hold personal
data: ``purge`` switches capture off and deletes every trace file mlreg armed, at every captures
location of the environment (the local stack: every replica's trace folder) -- only those
(``capture.is_trace_name``), and it names each location it could not reach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from mlreg.ops.context import environment, open_registry
from pipelines.checks.capture import Captures, Purged, Shadow, arm, disarm, purge
from pipelines.checks.shadow import scrub_run
from pipelines.fleet.replicas import triton_connector
from pipelines.promote.environments import resolve_targets
from registry.errors import MlregError, UsageError
from registry.settings import Settings

Connect = Callable[[str], Any]


@dataclass
class CaptureReport:
    environment: str
    models: list[str]  # switched on (or, with dry_run, would be)
    excluded: list[str]  # never captured, by the environment's settings
    targets: list[str]
    settings: dict[str, Any]  # the trace settings written
    dry_run: bool
    failed: list[str] = field(default_factory=list)  # the replicas (and why) not switched on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CaptureStatus:
    environment: str
    captures: str
    replicas: list[dict[str, Any]]  # replica, model, level, rate, left; or replica, model, error
    files: int
    bytes: int
    max_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PurgeReport:
    environment: str
    models: list[str]
    deleted: list[str]
    dry_run: bool
    failed: list[str] = field(default_factory=list)  # replicas where capture could not be switched off
    unreached: list[str] = field(default_factory=list)  # captures locations not listed or emptied
    runs: list[str] = field(default_factory=list)  # "<run id>: report.json, shadow.json" scrubbed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _replicas(settings: Settings, name: str) -> tuple[Shadow, tuple[str, ...], Connect]:
    """The environment's capture settings, its replicas and how to reach them."""
    env = environment(settings, name)
    connect = triton_connector(settings, env.key(settings), env.load_deadline(settings))
    targets = resolve_targets(settings, env)
    if env.shadow is None:
        raise UsageError(
            f"environment '{env.name}' captures no requests",
            fix=f"add an [environments.{env.name}.shadow] table to mlreg.toml (rate, count, captures)",
        )
    return env.shadow, targets, connect


def capture(settings: Settings, env_name: str, models: list[str], dry_run: bool = False) -> CaptureReport:
    """Switch capture on for ``models`` on every replica (a promotion does it for what it moved)."""
    shadow, targets, connect = _replicas(settings, env_name)
    wanted = [m for m in models if shadow.captures_model(m)]
    excluded = [m for m in models if m not in wanted]
    notes = [] if dry_run else arm(targets, connect, wanted, shadow)
    return CaptureReport(env_name, wanted, excluded, list(targets), shadow.trace_settings(), dry_run, notes)


def capture_status(settings: Settings, env_name: str, models: list[str]) -> CaptureStatus:
    """Capture per replica and model (Triton's trace settings), and the captured files."""
    shadow, targets, connect = _replicas(settings, env_name)
    rows = [_trace_row(connect, url, model) for url in targets for model in models]
    files = [f for location in shadow.locations() for f in Captures(location).files()]
    size = sum(f.size for f in files)
    return CaptureStatus(env_name, shadow.where(), rows, len(files), size, shadow.max_bytes)


def _trace_row(connect: Connect, url: str, model: str) -> dict[str, Any]:
    try:
        with connect(url) as triton:
            found = triton.trace_settings(model)
    except MlregError as exc:
        return {"replica": url, "model": model, "error": exc.message}
    return {
        "replica": url,
        "model": model,
        "level": ",".join(found.get("trace_level", [])),
        "rate": found.get("trace_rate", [""])[0],
        "left": found.get("trace_count", [""])[0],
    }


def capture_purge(
    settings: Settings,
    env_name: str,
    models: list[str] | None = None,
    dry_run: bool = False,
    runs: list[str] | None = None,
) -> PurgeReport:
    """Switch capture off for ``models`` (default: every model the replicas hold), delete every
    trace file mlreg armed for the environment, and take the captured tensors out of the MLflow
    promotion ``runs`` named (their report.json and shadow.json)."""
    shadow, targets, connect = _replicas(settings, env_name)
    names = list(models or []) or _served(targets, connect)
    failed = [] if dry_run else disarm(targets, connect, names)
    if dry_run:
        found = _listed(shadow)
        listed = [f"{run}: would be scrubbed" for run in runs or []]
        return PurgeReport(env_name, names, found.deleted, dry_run, failed, found.unreached, listed)
    purged = purge(shadow.locations())
    report = PurgeReport(env_name, names, purged.deleted, dry_run, failed, purged.unreached)
    if runs:
        _scrub_runs(settings, runs, report)
    return report


def _scrub_runs(settings: Settings, runs: list[str], report: PurgeReport) -> None:
    registry = open_registry(settings)
    for run in runs:
        try:
            scrubbed = scrub_run(registry.runs, run)
        except MlregError as exc:
            report.unreached.append(f"run {run}: {exc.message}")
            continue
        report.runs.append(f"{run}: {', '.join(scrubbed) or 'no captured tensor'}")


def _listed(shadow: Shadow) -> Purged:
    """What a purge would delete, and the locations it could not list."""
    found = Purged([], [])
    for location in shadow.locations():
        try:
            found.deleted.extend(f"{location.rstrip('/')}/{f.name}" for f in Captures(location).files())
        except (OSError, MlregError) as exc:
            found.unreached.append(f"{location}: {getattr(exc, 'message', exc)}")
    return found


def _served(targets: tuple[str, ...], connect: Connect) -> list[str]:
    """Every model any reachable replica holds, in the order first seen."""
    names: list[str] = []
    for url in targets:
        try:
            with connect(url) as triton:
                names.extend(m for m in triton.model_states() if m not in names)
        except MlregError:
            continue
    return names


__all__ = ["CaptureReport", "CaptureStatus", "PurgeReport", "capture", "capture_purge", "capture_status"]
