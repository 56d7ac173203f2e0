"""An environment: where a promotion goes (its store, its replicas, its alias) and the settings its
``mlreg.toml`` section gives the checks and guards.  Read by ``pipelines/promote/environments.py``; a
check's own settings are parsed by the check (``pipelines/core/check.py``, registered in
``pipelines/promote/registered.py``) and held here by the check's name, never by its type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipelines.core.policy import Policy
from pipelines.triton.control_key import ControlKey, control_key, local_key
from registry.settings import Settings
from registry.signing import Trust

OPEN_CONTROL = ("refuse", "allow")  # open_control's values; the first is the default
KEEP = 2  # retention's default: what serves and the one before it (an instant rollback)
MEMORY_MARGIN = 1.2  # a load needs its recorded footprint x this free on the replica


@dataclass(frozen=True)
class Environment:
    name: str
    store: str
    targets: tuple[str, ...]
    alias: str
    gpu: bool
    local_stack: bool = False  # targets: the running local stack's, filled in by the application
    policy: Policy | None = None  # fleet roll-out policy (pipelines/core/policy.py)
    discover: str = ""  # "dns:NAME:PORT": targets are NAME's addresses (pipelines/fleet/discovery.py)
    signatures: Trust | None = None  # signatures = "required" | "warn" + trusted keys (registry/signing.py)
    keep: int = KEEP  # versions per model where Triton reads (pipelines/promote/retention.py); 0: off
    perf: Any = None  # the perf check's settings, parsed by it (pipelines/checks/perf.py); None: defaults
    metrics_urls: tuple[tuple[str, str], ...] = ()  # target -> Triton's metrics (the local stack's)
    control_key: str = (
        ""  # "env:VAR" or a key file: what unlocks its replicas (pipelines/triton/control_key.py)
    )
    warmup: bool = True  # a peak-batch model_warmup in every config written to the store
    memory_margin: float = MEMORY_MARGIN  # free memory a load needs: footprint x margin
    load_timeout: float = 0.0  # seconds a load may take (0: 10 x the settings' Triton timeout)
    shadow: Any = None  # capture and the shadow replay: the shadow check's [shadow] table (checks/capture.py)
    open_control: str = OPEN_CONTROL[0]  # "allow": a replica anyone can drive is noted, not refused
    receipt_key: str = ""  # the EC private key (PEM path) load receipts are signed with (pipelines/ledger)
    served_from: tuple[tuple[str, str], ...] = ()  # target -> the repository it was started on (its record)
    observe: tuple[str, ...] = ()  # checks that run and are recorded but never refuse (observe = [...])
    checks: tuple[tuple[str, Any], ...] = ()  # each other registered check's parsed settings, by name

    def setting(self, name: str) -> Any:
        """The parsed settings of the registered check ``name`` (None: it has none, its defaults):
        a field of this name where the environment has one (``shadow``, ``perf``), else ``checks``."""
        if name in FIELDS:
            return getattr(self, name)
        return dict(self.checks).get(name)

    def load_deadline(self, settings: Settings) -> float:
        """Seconds one load may take before the promotion names it and stops waiting."""
        return self.load_timeout or settings.triton_timeout * 10

    def key(self, settings: Settings) -> ControlKey | None:
        """What this environment's replicas' control API takes (None: they are expected open)."""
        if self.local_stack:
            return local_key(settings.home)
        return control_key(settings.home, self.control_key)

    def metrics_url(self, target: str) -> str:
        """Where ``target``'s Triton metrics are read ("" when the environment does not say)."""
        if self.policy is not None:
            return self.policy.metrics_url(target)
        return dict(self.metrics_urls).get(target, "")


FIELDS = frozenset(f.name for f in dataclasses.fields(Environment))
