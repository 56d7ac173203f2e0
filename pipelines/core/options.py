"""How a promotion runs: one ``Options``, built where the request comes in (the CLI from its flags,
the MLflow deployments target from its ``-C`` keys, ``fleet sync``, the relay) and passed down
unchanged -- the verbs (``mlreg.ops``) and the engine take it whole, none re-declares its fields.

Skipping a check needs no field of its own: ``skip`` holds registered check names
(pipelines/promote/registered.py; the verb refuses an unknown one).  The three older flags are its
aliases (``ALIASES``).  Kept apart from the context (pipelines/core/context.py) so that building
one imports nothing: a refused ``mlreg promote`` must not pay for the promotion package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OnStage = Callable[[str, str, float, str], None]  # stage, status, seconds, detail
ALIASES = {"skip_quality": "quality", "skip_perf": "perf", "skip_shadow": "shadow"}  # field -> skip name


@dataclass
class Options:
    """How a promotion runs.  ``skip``: the names of the registered checks not to run (``--skip
    NAME``; ``"quality"``: the whole gate before traffic); ``skip_quality``, ``skip_perf`` and
    ``skip_shadow`` are the older flags' names for ``skip`` of "quality", "perf" and "shadow",
    kept equal to it."""

    dry_run: bool = False
    allow_breaking: bool = False
    skip_quality: bool = False  # alias: "quality" in skip
    serve_as: str = "auto"
    on_stage: OnStage | None = None
    skip_perf: bool = False  # alias: "perf" in skip
    no_way_back: bool = False  # promote although the serving version could not be loaded again
    skip_shadow: bool = False  # alias: "shadow" in skip
    on_start: Callable[[str], None] | None = None  # told each stage's name as it starts (progress)
    rollback: bool = False  # a return to a version that served: its bake may judge mlreg's own probes
    skip: frozenset[str] = frozenset()  # registered check names not to run (--skip NAME[,NAME])

    def __post_init__(self) -> None:
        self.skip = frozenset(self.skip) | {name for field, name in ALIASES.items() if getattr(self, field)}
        for field, name in ALIASES.items():
            setattr(self, field, name in self.skip)


__all__ = ["ALIASES", "OnStage", "Options"]
