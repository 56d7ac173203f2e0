"""Environments from the project's ``mlreg.toml``; the embedded default ``local`` needs none.

[environments.staging]
store = "s3://models-bucket/staging"        # Triton's repository syntax
targets = ["triton-0.staging:8001", "triton-1.staging:8001"]   # gRPC; the first is the canary
alias = "staging"                            # the MLflow alias this environment owns
gpu = true                                   # keep KIND_GPU instance groups (default true)
keep = 2                                     # versions per model Triton reads (default 2; 0: off)
signatures = "required"                      # or "warn"; absent: no signature check
trusted_keys = ["keys/release.pub"]          # PEM public keys / CA certificates, relative to mlreg.toml
trusted_identities = [{ issuer = "https://token.actions.githubusercontent.com", subject = "<regex>" }]
control_key = "env:MLREG_STAGING_CONTROL_KEY"  # or a file ("/run/secrets/mlreg/control-key"), never the key
open_control = "refuse"                      # a replica anyone can drive refuses a promotion ("allow": noted)
warmup = true                                # a peak-batch model_warmup in every stored config (default true)
memory_margin = 1.2                          # a load needs footprint x margin free (default 1.2)
load_timeout = 120                           # seconds a load may take (default 10 x MLREG_TRITON_TIMEOUT)

[environments.staging.shadow]                # capture requests, replay them to each candidate
rate = 1000                                  # (pipelines/checks/capture.py; shadow = false: never)

A ``[environments.local]`` section (or ``[environments.local.shadow]``...) without ``store`` extends
the built-in ``local``: its store, the stack's replicas and key are kept.  A ``metrics`` table or
``metrics_port`` only says where Triton's metrics are read; a staged roll-out (a canary) needs a
roll-out key (canary, waves, bake_seconds, ...: pipelines/core/policy.py).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from pipelines.core.check import Place
from pipelines.core.environment import FIELDS, KEEP, OPEN_CONTROL, Environment
from pipelines.core.policy import KEYS as ROLLOUT_KEYS
from pipelines.core.policy import Policy, check_keys, parse_policy
from pipelines.fleet import discovery
from pipelines.ledger.receipts import RECEIPT_KEYS, parse_receipt_key
from pipelines.promote.registered import observe_list, owned_keys, parse_settings
from pipelines.storage import check_store_uri
from registry.errors import PromotionError, UsageError
from registry.settings import Settings
from registry.signing import TRUST_KEYS, parse_trust
from registry.template import gpu_available

LOCAL = "local"
# every key of an environment section this module reads; the roll-out policy's are policy.KEYS
# (a key in neither is refused: a typo must not silently change what a promotion does)
ENVIRONMENT_KEYS = (
    frozenset(
        {"store", "targets", "alias", "gpu", "discover", "keep", "control_key", "open_control"}
        | {"load_timeout", "observe"}
        | {"follows"}  # the MLflow alias `mlreg relay` makes this environment serve (mlreg/relay/config.py)
    )
    | TRUST_KEYS
    | RECEIPT_KEYS
    | owned_keys()  # the registered checks' and guards' own keys (pipelines/promote/registered.py)
)


def settings_file(settings: Settings) -> Path:
    return settings.home.parent / "mlreg.toml"


def local_environment(settings: Settings) -> Environment:
    return Environment(LOCAL, str(settings.local_repository), (), "local", gpu_available(), local_stack=True)


def load_environments(settings: Settings) -> dict[str, Environment]:
    envs = {LOCAL: local_environment(settings)}
    path = settings_file(settings)
    if not path.is_file():
        return envs
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the environments: {exc}", fix="fix the TOML syntax") from exc
    for name, raw in (data.get("environments") or {}).items():
        check_keys(f"{path} [environments.{name}]", raw, ENVIRONMENT_KEYS)
        if name == LOCAL and isinstance(raw, dict) and "store" not in raw:
            envs[name] = _local_extended(path, raw, settings, envs[LOCAL])
            continue
        try:
            store, targets = _store(path, name, raw["store"]), _targets(path, name, raw.get("targets", []))
            envs[name] = Environment(
                name,
                store,
                targets,
                str(raw.get("alias", name)),
                _gpu(path, name, raw.get("gpu", True)),
                discover=_discover(path, name, raw),
                control_key=_control_key(path, name, raw),
                **_extras(path, name, raw, settings, store, targets),
            )
        except (KeyError, TypeError) as exc:
            raise UsageError(
                f"{path}: environment '{name}' needs at least 'store' ({exc})",
                fix='add store = "s3://bucket/prefix" and targets = ["host:8001"]',
            ) from exc
    return envs


LOCAL_FIXED = ("targets", "discover", "control_key")  # the local stack's own: its replicas, its key


def _local_extended(
    path: Path, raw: dict[str, object], settings: Settings, local: Environment
) -> Environment:
    """The built-in ``local`` environment with what ``[environments.local]`` adds (shadow, warmup,
    metrics, a roll-out policy, ...) -- its store, the stack's replicas and key kept.  A section
    that sets ``store`` defines an environment of that name from scratch instead."""
    fixed = [key for key in LOCAL_FIXED if key in raw]
    if fixed:
        raise UsageError(
            f"{path} [environments.{LOCAL}]: {', '.join(fixed)} cannot be set for the built-in local "
            "environment: its targets are the running local stack's replicas, its key the stack's own",
            fix=f"remove {', '.join(fixed)} from [environments.{LOCAL}], or name another environment "
            "(e.g. [environments.fleet]) with its own store and targets",
        )
    return dataclasses.replace(
        local,
        alias=str(raw.get("alias", LOCAL)),
        gpu=_gpu(path, LOCAL, raw.get("gpu", local.gpu)),
        **_extras(path, LOCAL, raw, settings, local.store, local.targets),
    )


def _extras(
    path: Path, name: str, raw: dict[str, object], settings: Settings, store: str, targets: tuple[str, ...]
) -> dict[str, Any]:
    """An environment's settings beyond where it is (store, targets): the same for every environment."""
    where = f"{path} [environments.{name}]"
    return {
        "policy": _policy(where, raw),
        "keep": _keep(path, name, raw),
        "signatures": parse_trust(where, raw, path.parent),
        "receipt_key": parse_receipt_key(where, raw, path.parent),
        "load_timeout": _number(path, name, raw, "load_timeout", 0.0, minimum=1.0),
        **_checks(Place(where, path.parent, settings, store), raw),
        "observe": observe_list(where, raw.get("observe")),
        "open_control": _open_control(path, name, raw),
        "metrics_urls": _metrics_only(where, raw, targets),
    }


METRICS_KEYS = frozenset({"metrics", "metrics_port"})  # where metrics are read: no roll-out by itself


def _policy(where: str, raw: dict[str, object]) -> Policy | None:
    """The roll-out policy, only where a roll-out key is set: a ``metrics`` table (or
    ``metrics_port``) says where Triton's metrics are read, and never turns on a canary."""
    if not (ROLLOUT_KEYS - METRICS_KEYS) & set(raw):
        return None
    return parse_policy(where, raw)


def _metrics_only(
    where: str, raw: dict[str, object], targets: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """Where each target's metrics are read (target -> URL) in an environment without a roll-out
    policy (a policy keeps its own): ``metrics`` and ``metrics_port`` read as the policy reads them."""
    given = {key: raw[key] for key in METRICS_KEYS if key in raw}
    if not given or (ROLLOUT_KEYS - METRICS_KEYS) & set(raw):
        return ()
    policy = parse_policy(where, given)
    if policy is None:
        return ()
    urls = dict(policy.metrics) | {target: policy.metrics_url(target) for target in targets}
    return tuple(sorted(urls.items()))


def _checks(place: Place, raw: dict[str, object]) -> dict[str, Any]:
    """Each registered check's and guard's settings, parsed by itself: those named as an environment
    field (``shadow``, ``perf``, ``warmup``, ``memory_margin``) go there, the others into ``checks``."""
    parsed = parse_settings(place, raw)
    fields = {name: value for name, value in parsed.items() if name in FIELDS}
    others = tuple(sorted((n, v) for n, v in parsed.items() if n not in FIELDS and v is not None))
    return {**fields, "checks": others}


def _targets(path: Path, name: str, raw: object) -> tuple[str, ...]:
    """``targets`` must be a list of "host:port" strings (a bare string is not iterated per character)."""
    if not isinstance(raw, list) or not all(isinstance(t, str) and t.strip() for t in raw):
        raise UsageError(
            f"{path}: environment '{name}': targets must be a list of \"host:port\" strings, not {raw!r}",
            fix=f'write targets = ["host:8001"] (a list, even for one server) in [environments.{name}]',
        )
    targets = tuple(t.strip() for t in raw)
    counts = Counter(t.lower() for t in targets)  # host names know no case
    twice = sorted({t for t in targets if counts[t.lower()] > 1})
    if twice:
        raise UsageError(
            f"{path}: environment '{name}': targets lists {', '.join(twice)} more than once",
            fix=f"list each server once in [environments.{name}] targets (a replica moved twice "
            "would count twice in every wave)",
        )
    return targets


def _store(path: Path, name: str, raw: object) -> str:
    """``store``: a folder or an s3:// URI, without credentials (pipelines/storage: never echoed)."""
    if not isinstance(raw, str) or not raw.strip():
        raise UsageError(
            f"{path}: environment '{name}': store must be a folder or an s3:// URI, not {raw!r}",
            fix=f'write store = "s3://bucket/prefix" in [environments.{name}]',
        )
    return check_store_uri(raw.strip(), f"{path} [environments.{name}] store", UsageError)


def _gpu(path: Path, name: str, raw: object) -> bool:
    """``gpu`` must be true or false: a string ("false") is not read as true."""
    if not isinstance(raw, bool):
        raise UsageError(
            f"{path}: environment '{name}': gpu must be true or false (a TOML boolean), not {raw!r}",
            fix=f"write gpu = false (or gpu = true), without quotes, in [environments.{name}]",
        )
    return raw


def _open_control(path: Path, name: str, raw: dict[str, object]) -> str:
    """``open_control``: one of OPEN_CONTROL (pipelines/fleet/replicas.py refuses or notes)."""
    value = raw.get("open_control", OPEN_CONTROL[0])
    if value not in OPEN_CONTROL:
        raise UsageError(
            f'{path}: environment \'{name}\': open_control must be "refuse" or "allow", not {value!r}',
            fix=f"drop open_control from [environments.{name}] (a replica anyone can drive refuses the "
            'promotion), or write open_control = "allow" to promote to it with a note',
        )
    return str(value)


def _number(path: Path, name: str, raw: dict[str, object], key: str, default: float, minimum: float) -> float:
    """A positive finite number of at least ``minimum`` (absent: ``default``)."""
    if key not in raw:
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not minimum <= value < float("inf"):
        raise UsageError(
            f"{path}: environment '{name}': {key} must be a number of at least {minimum:g}, not {value!r}",
            fix=f"write {key} = {max(default, minimum):g} (a number, no quotes) in [environments.{name}]",
        )
    return float(value)


def _keep(path: Path, name: str, raw: dict[str, object]) -> int:
    keep = raw.get("keep", KEEP)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise UsageError(
            f"{path}: environment '{name}': keep must be a number of versions (0 or more), not {keep!r}",
            fix=f"write keep = 2 (what serves and the one before it) or keep = 0 (off) in "
            f"[environments.{name}]",
        )
    return keep


def _control_key(path: Path, name: str, raw: dict[str, object]) -> str:
    """``"env:VAR"`` or a key file (made absolute against mlreg.toml's folder); never echoed back,
    since a key written here by mistake would be."""
    spec = raw.get("control_key", "")
    if not spec:
        return ""
    if isinstance(spec, str) and spec.startswith("env:") and spec[4:].isidentifier():
        return spec
    file = path.parent / Path(spec).expanduser() if isinstance(spec, str) else None
    if file is None or not file.is_file():
        raise UsageError(
            f"{path}: environment '{name}': control_key must be \"env:VAR\" or the path of a file "
            "holding the replicas' key, and the file it names does not exist",
            fix=f'write control_key = "env:MLREG_{name.upper()}_CONTROL_KEY" in [environments.{name}] '
            "and export that variable (the key itself never goes in mlreg.toml)",
        )
    return str(file)


def _discover(path: Path, name: str, raw: dict[str, object]) -> str:
    spec = raw.get("discover", "")
    if not spec:
        return ""
    if not isinstance(spec, str) or raw.get("targets"):
        raise UsageError(
            f"{path}: environment '{name}': discover must be one \"dns:NAME:PORT\" string, without targets",
            fix='keep either targets = ["host:8001"] or discover = "dns:NAME:8001"',
        )
    discovery.parse(spec)
    return spec


def environment(settings: Settings, name: str) -> Environment:
    envs = load_environments(settings)
    if name not in envs:
        path = settings_file(settings)
        where = (
            f"defined in {path}"
            if path.is_file()
            else f"'{LOCAL}' is built in; {path} does not exist: 'mlreg init' writes one"
        )
        raise UsageError(
            f"unknown environment '{name}'",
            fix=f"use one of: {', '.join(sorted(envs))} ({where}), or add [environments.{name}] there",
        )
    return envs[name]


def resolve_targets(settings: Settings, env: Environment) -> tuple[str, ...]:
    """The gRPC URLs to drive.  ``local``'s are the running local stack's: the application fills
    them in when it loads the environment (``mlreg.ops.context.environment``); none means it is down."""
    if env.discover:
        return discovery.resolve(env.discover)
    if env.targets:
        return env.targets
    if env.local_stack:
        raise PromotionError(
            "the local stack is not running, so environment 'local' has no Triton",
            fix="start it with 'mlreg stack up'",
        )
    raise UsageError(
        f"environment '{env.name}' has no targets",
        fix='add targets = ["host:8001"] to its section in mlreg.toml',
    )
