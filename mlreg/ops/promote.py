"""``mlreg promote MODEL --version N``: one registered version to an environment."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

from mlreg.ops.context import environment, open_registry
from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.core.context import OnStage
    from pipelines.core.ports import Registry
    from pipelines.core.reports import PromotionResult

SERVE_AS = ("auto", "native", "onnx")


def promote(
    settings: Settings,
    env_name: str,
    model: str,
    version: str,
    *,
    dry_run: bool = False,
    allow_breaking: bool = False,
    skip_quality: bool = False,
    serve_as: str = "auto",
    on_stage: OnStage | None = None,
    skip_perf: bool = False,
    no_way_back: bool = False,
    skip_shadow: bool = False,
    registry: Registry | None = None,
    on_start: Callable[[str], None] | None = None,
    rollback: bool = False,
    skip: Iterable[str] = (),
) -> PromotionResult:
    """Promote ``model`` ``version`` to the environment (a PromotionFailed when it cannot).
    ``registry``: the one to read (and record in) instead of the settings' MLflow, e.g. the
    ``PlanRegistry`` of a plan over versions an ``export --dry-run`` did not register.
    ``on_start``: told each stage's name as it starts (the CLI's progress line).  ``rollback``:
    the version returned to served before (``mlreg rollback``): with clients quiet, its bake judges
    mlreg's own probe requests.  ``skip``: the registered checks not to run (``--skip NAME``; an
    unknown name is refused); ``skip_quality``, ``skip_perf``, ``skip_shadow``: the older names of
    ``skip`` "quality", "perf", "shadow"."""
    if serve_as not in SERVE_AS:
        raise UsageError(f"unknown --serve-as '{serve_as}'", fix=f"use {', '.join(SERVE_AS)}")
    from pipelines.promote.registered import check_names  # lazy: the registered checks (numpy)

    skipped = check_names(skip)
    if not version.isdigit():
        raise UsageError(f"version '{version}' is not a number", fix="pass --version N (1, 2, 3, ...)")
    from pipelines.storage.objects import check_part  # lazy: the store's name rule

    check_part(model, "model name")  # an untrusted name is refused before any registry is asked
    reader: Registry
    if registry is None:
        from registry.mlflow.reads import open_reads  # lazy: the registry's reads, no MLflow import

        # the settings first (mlreg.toml is refused before any registry is read), then an unknown
        # model or version is refused from the registry alone, before MLflow's client or any
        # server (the embedded registry's file answers in milliseconds)
        env = environment(settings, env_name)
        open_reads(settings, partial(open_registry, settings)).version(model, version)
        reader = open_registry(settings)
    else:
        env, reader = environment(settings, env_name), registry
    from pipelines.core.context import Options  # lazy: the promotion package
    from pipelines.devstack.scratch import scratch_servers  # lazy: the promotion's servers
    from pipelines.promote.runner import Promotion  # lazy: tritonclient, numpy

    options = Options(
        dry_run,
        allow_breaking,
        skip_quality,
        serve_as,
        on_stage,
        skip_perf=skip_perf,
        no_way_back=no_way_back,
        skip_shadow=skip_shadow,
        on_start=on_start,
        rollback=rollback,
        skip=skipped,
    )
    scratch = scratch_servers(settings, env.key(settings))
    return Promotion(settings, env, reader, options, scratch=scratch).run(model, version)


__all__ = ["SERVE_AS", "promote"]
