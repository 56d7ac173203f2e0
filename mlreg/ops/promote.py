"""``mlreg promote MODEL --version N``: one registered version to an environment."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from mlreg.ops.context import environment, open_registry
from pipelines.core.options import Options
from registry.errors import UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.core.ports import Registry
    from pipelines.core.reports import PromotionResult

SERVE_AS = ("auto", "native", "onnx")


def promote(
    settings: Settings,
    env_name: str,
    model: str,
    version: str,
    options: Options | None = None,
    *,
    registry: Registry | None = None,
) -> PromotionResult:
    """Promote ``model`` ``version`` to the environment (a PromotionFailed when it cannot), as
    ``options`` say (pipelines/core/options.py; the CLI builds them from its flags; none: the
    defaults).  ``registry``: the one to read (and record in) instead of the settings' MLflow, e.g.
    the ``PlanRegistry`` of a plan over versions an ``export --dry-run`` did not register.  An
    unknown ``--serve-as`` or check name in ``options.skip`` is refused before anything is read."""
    options = options or Options()
    if options.serve_as not in SERVE_AS:
        raise UsageError(f"unknown --serve-as '{options.serve_as}'", fix=f"use {', '.join(SERVE_AS)}")
    from pipelines.promote.registered import check_names  # lazy: the registered checks (numpy)

    options = replace(options, skip=check_names(options.skip))
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
    from pipelines.devstack.scratch import scratch_servers  # lazy: the promotion's servers
    from pipelines.promote.runner import Promotion  # lazy: tritonclient, numpy

    scratch = scratch_servers(settings, env.key(settings))
    return Promotion(settings, env, reader, options, scratch=scratch).run(model, version)


__all__ = ["SERVE_AS", "promote"]
