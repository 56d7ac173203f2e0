"""What the relay follows and how it acts, from the project's ``mlreg.toml``:

    [environments.production]
    store = "s3://models/production"
    targets = ["triton-0.production:8001"]
    follows = "champion"                 # this environment serves what MLflow's alias 'champion' names

    [relay]
    secret = "env:MLREG_RELAY_SECRET"    # the webhook's HMAC secret: "env:VAR" or a file (never the secret)
    interval = 30                        # seconds between reconciles (default 30)
    window = 300                         # a delivery's timestamp may be this old (default 300)
    models = ["image_model"]             # only these models (default: every model holding the alias)

    [relay.environments.production]      # how this environment is deployed (default: action = "promote")
    action = "dispatch"                  # "promote" | "dispatch" (promote.yml) | "pin" (gitops-pr.yml)
    repository = "acme/models"           # GitHub owner/name
    workflow = "promote.yml"             # default: promote.yml (dispatch), gitops-pr.yml (pin)
    ref = "main"
    token = "env:GITHUB_TOKEN"           # or a file (a mounted Secret); never echoed
    api = "https://api.github.com"       # https only; http only to a loopback stand-in

``follows`` is read here from the environment's own section (the environments' loader lets the key
through and leaves it to this module); an environment without it is not the relay's.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlreg.relay.wire import ALIAS, NAME, WINDOW_S
from registry.errors import UsageError
from registry.settings import Settings

ACTIONS = ("promote", "dispatch", "pin")
WORKFLOWS = {"dispatch": "promote.yml", "pin": "gitops-pr.yml"}
RELAY_KEYS = frozenset({"secret", "interval", "window", "models", "environments", "dispatch_grace"})
TARGET_KEYS = frozenset({"action", "repository", "workflow", "ref", "token", "api"})
REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
WORKFLOW = re.compile(r"^[A-Za-z0-9_.-]{1,100}\.ya?ml$")
REF = re.compile(r"^[A-Za-z0-9_./-]{1,200}$")
INTERVAL_S = 30.0
DISPATCH_GRACE_S = 1800.0  # a dispatched run has this long to serve before reconcile dispatches again
MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class Target:
    """How one environment is deployed."""

    action: str = "promote"
    repository: str = ""
    workflow: str = ""
    ref: str = "main"
    token: str = ""  # "env:VAR" or a file path: where the token is, never the token
    api: str = "https://api.github.com"


@dataclass(frozen=True)
class RelayConfig:
    path: Path
    follows: dict[str, str]  # environment -> the alias it follows
    targets: dict[str, Target]
    secret_spec: str = ""
    interval: float = INTERVAL_S
    window: float = WINDOW_S
    models: tuple[str, ...] = ()  # () : every model holding a followed alias
    dispatch_grace: float = DISPATCH_GRACE_S
    extra: dict[str, Any] = field(default_factory=dict)

    def target(self, env: str) -> Target:
        return self.targets.get(env, Target())

    def environments_following(self, alias: str) -> list[str]:
        return sorted(env for env, followed in self.follows.items() if followed == alias)

    def secret(self) -> bytes:
        """The webhook secret's bytes (UsageError naming where it was looked for, never the value)."""
        return read_secret(self.secret_spec, self.path.parent, "[relay] secret")


def settings_file(settings: Settings) -> Path:
    return settings.home.parent / "mlreg.toml"


def load(settings: Settings, path: Path | None = None) -> RelayConfig:
    """The relay's settings from ``mlreg.toml`` (UsageError naming the key and the fix)."""
    path = path or settings_file(settings)
    try:
        data = tomllib.loads(path.read_text()) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it: {exc}", fix="fix the TOML syntax") from exc
    follows = _follows(path, data.get("environments"))
    relay = data.get("relay", {})
    if not isinstance(relay, dict):
        raise UsageError(f"{path}: [relay] must be a table", fix='write [relay] with secret = "env:VAR"')
    _known(f"{path} [relay]", relay, RELAY_KEYS)
    raw_targets = relay.get("environments", {})
    if not isinstance(raw_targets, dict):
        raise UsageError(f"{path}: [relay.environments] must be tables", fix="[relay.environments.NAME]")
    targets = {name: _target(path, name, raw, follows) for name, raw in raw_targets.items()}
    return RelayConfig(
        path,
        follows,
        targets,
        _spec(path, relay.get("secret", "")),
        _seconds(path, relay, "interval", INTERVAL_S, 0.05),
        _seconds(path, relay, "window", WINDOW_S, 1.0),
        _models(path, relay.get("models", [])),
        _seconds(path, relay, "dispatch_grace", DISPATCH_GRACE_S, 1.0),
    )


def _known(where: str, raw: dict[str, Any], keys: frozenset[str]) -> None:
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(unknown)}", fix=f"use only {', '.join(sorted(keys))}"
        )


def _follows(path: Path, environments: object) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, raw in (environments or {}).items() if isinstance(environments, dict) else ():
        alias = raw.get("follows") if isinstance(raw, dict) else None
        if alias is None:
            continue
        if not isinstance(alias, str) or not ALIAS.match(alias) or not NAME.match(name):
            raise UsageError(
                f"{path} [environments.{name}]: follows must be an MLflow alias name, not {alias!r}",
                fix='write follows = "champion" (letters, digits, "_" and "-")',
            )
        found[name] = alias
    return found


def _target(path: Path, name: str, raw: object, follows: dict[str, str]) -> Target:
    where = f"{path} [relay.environments.{name}]"
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a table", fix='action = "promote"')
    _known(where, raw, TARGET_KEYS)
    if name not in follows:
        raise UsageError(
            f"{where}: environment '{name}' follows no alias",
            fix=f'add follows = "champion" to [environments.{name}]',
        )
    action = raw.get("action", "promote")
    if action not in ACTIONS:
        raise UsageError(
            f"{where}: action must be one of {', '.join(ACTIONS)}, not {action!r}", fix='action = "promote"'
        )
    if action == "promote":
        return Target()
    checks = (("repository", REPOSITORY, ""), ("workflow", WORKFLOW, WORKFLOWS[action]), ("ref", REF, "main"))
    values = {key: raw.get(key, default) for key, _, default in checks}
    for key, pattern, _ in checks:
        if not isinstance(values[key], str) or not pattern.match(values[key]):
            raise UsageError(
                f"{where}: {key} {values[key]!r} is not valid", fix=f"set {key} (see 'mlreg relay --help')"
            )
    api = raw.get("api", "https://api.github.com")
    check_api(where, api)
    return Target(
        action,
        values["repository"],
        values["workflow"],
        values["ref"],
        _spec(path, raw.get("token", "")),
        api,
    )


def check_api(where: str, api: object) -> str:
    """https, or http to a loopback address only (a local stand-in of GitHub's API)."""
    parsed = urlparse(api) if isinstance(api, str) else None
    ok = parsed is not None and bool(parsed.hostname) and not parsed.username and not parsed.password
    if ok and parsed is not None and parsed.scheme == "http":
        ok = _loopback(parsed.hostname or "")
    elif parsed is not None:
        ok = ok and parsed.scheme == "https"
    if not ok:
        raise UsageError(
            f"{where}: api {api!r} must be an https URL (http only to 127.0.0.1)",
            fix='api = "https://api.github.com"',
        )
    return str(api)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _spec(path: Path, spec: object) -> str:
    """``"env:VAR"`` or a file path (made absolute against mlreg.toml's folder)."""
    if spec == "":
        return ""
    if isinstance(spec, str) and spec.startswith("env:") and spec[4:].isidentifier():
        return spec
    if isinstance(spec, str) and spec and "\n" not in spec:
        return str(path.parent / Path(spec).expanduser())
    raise UsageError(
        f'{path}: a secret must be named as "env:VAR" or a file path', fix='secret = "env:MLREG_RELAY_SECRET"'
    )


def read_secret(spec: str, base: Path, what: str) -> bytes:
    """The bytes ``spec`` names (an environment variable or a file), stripped; never in a message."""
    if not spec:
        raise UsageError(
            f"{what} is not set", fix=f'set {what} = "env:MLREG_RELAY_SECRET" in mlreg.toml and export it'
        )
    if spec.startswith("env:"):
        value = os.environ.get(spec[4:], "").encode()
        where = f"the environment variable {spec[4:]}"
    else:
        file = Path(spec) if Path(spec).is_absolute() else base / spec
        try:
            value = file.read_bytes()[: MAX_SECRET_BYTES + 1] if file.is_file() else b""
        except OSError:
            value = b""
        where = f"the file {file}"
    value = value.strip()
    if not value or len(value) > MAX_SECRET_BYTES:
        raise UsageError(
            f"{what}: {where} is empty, missing or over {MAX_SECRET_BYTES} bytes",
            fix=f"put the secret in {where}",
        )
    return value


def _seconds(path: Path, raw: dict[str, Any], key: str, default: float, minimum: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not minimum <= value < 86400 * 7:
        raise UsageError(
            f"{path} [relay]: {key} must be a number of seconds (>= {minimum:g})", fix=f"{key} = {default:g}"
        )
    return float(value)


def _models(path: Path, raw: object) -> tuple[str, ...]:
    if (
        not isinstance(raw, list)
        or not all(isinstance(m, str) and NAME.match(m) for m in raw)
        or len(raw) > 1000
    ):
        raise UsageError(
            f"{path} [relay]: models must be a list of model names", fix='models = ["image_model"]'
        )
    return tuple(raw)


__all__ = ["ACTIONS", "RelayConfig", "Target", "check_api", "load", "read_secret", "settings_file"]
