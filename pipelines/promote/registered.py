"""The one place checks and load guards are registered (issue 47's seam, ``pipelines/core/check.py``).

Adding a check is its own module under ``pipelines/checks/`` defining ``CHECK`` (a ``Check``) and one
line in ``CHECKS`` below; a load guard likewise under ``pipelines/guards/`` and ``GUARDS``.  The order
of ``CHECKS`` is the order the preflight and the gates run them in (each only while no enforced check
refused).  The engine reads these lists, never a feature's name: the settings loader parses each one's
keys with its ``parse``, the preflight (once, before any load) and the gates run each ``Check`` of
their phase, ``--skip NAME`` and ``observe = [NAME]`` name them; the runner asks each guard for its
part in the promotion (``load_guards``: what the fleet asks around each load, in this order) and
runs each check's step after ``record`` where it offers one (``after_steps``) and tells each check
that must the promotion's request-id prefix (``own_requests``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pipelines.checks import golden, perf, runtime, shadow
from pipelines.core.check import AfterRecord, AfterStep, Check, Guard, LoadGuard, OwnRequests, Place
from pipelines.core.environment import FIELDS, Environment
from pipelines.guards import headroom, warmup
from registry.errors import UsageError

CHECKS: tuple[Check, ...] = (
    runtime.CHECK,
    golden.CHECK,
    shadow.CHECK,
    perf.CHECK,
)
GUARDS: tuple[Guard, ...] = (
    headroom.GUARD,
    warmup.GUARD,
)
GATE = "quality"  # --skip quality (--skip-quality): the whole gate before traffic, every check in it
GATE_ALIAS = "--skip-quality"


def registered() -> tuple[Check | Guard, ...]:
    return (*CHECKS, *GUARDS)


def names() -> tuple[str, ...]:
    """Every name ``--skip`` and ``observe`` take: the gate and its checks (a load guard is not
    skipped: it keeps a replica up)."""
    return (GATE, *(c.name for c in CHECKS))


def gate_checks(where: str) -> list[Check]:
    """The checks a gate runs (``where``: "canary" or "scratch"), in their registered order."""
    return [c for c in CHECKS if c.phase == "gate" and where in c.where]


def preflight_checks() -> list[Check]:
    """The checks the preflight runs once per promotion, before any load, in their registered order."""
    return [c for c in CHECKS if c.phase == "preflight"]


def load_guards(ctx: Any) -> list[LoadGuard]:
    """Each registered guard's part in the promotion of ``ctx`` (its fleet built), in order: what the
    fleet asks before and tells after each load."""
    return [part for part in (g.load_guard(ctx) for g in GUARDS) if part is not None]


def after_steps(ctx: Any) -> list[AfterStep]:
    """The steps the registered checks offer after ``record`` in the promotion of ``ctx``, in order."""
    offered = (c.after_record(ctx) for c in CHECKS if isinstance(c, AfterRecord))
    return [step for step in offered if step is not None]


def own_requests(env: Environment, prefix: str) -> Environment:
    """``env`` with the settings of each registered check that tells its own requests apart
    (``OwnRequests``) told ``prefix`` (a check without settings there is left as it is)."""
    for check in CHECKS:
        setting = env.setting(check.name)
        if not isinstance(check, OwnRequests) or setting is None:
            continue
        told = check.own_requests(setting, prefix)
        if check.name in FIELDS:
            env = replace(env, **{check.name: told})
        else:
            env = replace(env, checks=tuple((n, told if n == check.name else s) for n, s in env.checks))
    return env


def owned_keys() -> frozenset[str]:
    """The keys of an environment section the registered checks and guards read."""
    return frozenset().union(*(c.owns for c in registered()))


def parse_settings(place: Place, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Each registered check's and guard's settings, parsed by itself, by name (a guard's by the
    ``Environment`` field it fills)."""
    return {c.name: c.parse(place, raw) for c in CHECKS} | {
        g.field or g.name: g.parse(place, raw) for g in GUARDS
    }


def _unknown(kind: str, name: str, where: str) -> UsageError:
    close = difflib.get_close_matches(name, names(), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return UsageError(
        f"{where}: unknown {kind} '{name}'{hint}",
        fix=f"name one of the registered checks: {', '.join(names())}",
    )


def check_names(given: Iterable[str], kind: str = "check", where: str = "--skip") -> frozenset[str]:
    """``given`` (the names of ``--skip NAME[,NAME]`` or of ``observe``), each a registered name:
    an unknown one is refused, naming the registered ones."""
    found = set()
    for name in given:
        name = name.strip()
        if name not in names():
            raise _unknown(kind, name, where)
        found.add(name)
    return frozenset(found)


def observe_list(where: str, raw: object) -> tuple[str, ...]:
    """An environment's ``observe = ["shadow", "perf"]``: registered check names, each once."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise UsageError(
            f"{where}: observe must be a list of check names, not {raw!r}",
            fix=f'e.g. observe = ["shadow"] (registered: {", ".join(names())})',
        )
    found = check_names(raw, "check in observe", where)
    if GATE in found:
        raise UsageError(
            f"{where}: observe names checks, not the whole gate ('{GATE}')",
            fix=f"list the checks to observe: {', '.join(n for n in names() if n != GATE)}",
        )
    return tuple(sorted(found))
