"""Every MLREG_* environment variable, read in one place.

Code deeper down receives a ``Settings`` object; it never reads the environment
itself.  Boolean variables are read by ``env_flag`` only: ``1``, ``true``, ``yes``
and ``on`` (any case) mean on, anything else off.

| variable              | meaning                                              | default                  |
| --------------------- | ---------------------------------------------------- | ------------------------ |
| MLREG_HOME            | state folder (stack state, logs, local repository)   | ``<project>/.mlreg``     |
| MLREG_TEMPLATE_DIR    | the model repository template                        | the packaged template    |
| MLREG_DEBUG           | on: tracebacks on errors, INFO logging               | off                      |
| MLREG_NO_PROGRESS     | on: no progress bars                                 | off                      |
| MLREG_TRITON_TIMEOUT  | seconds for one Triton control call (load: x10)      | ``30``                   |
| MLREG_MLFLOW_TIMEOUT  | seconds for one MLflow request (2 retries)           | ``15``                   |
| MLREG_LOCK_LEASE      | seconds of a store lock's lease (renewed while held) | ``900``                  |
| MLREG_SIGNING_KEY     | sign registered versions: a PEM key, or ``sigstore`` | unsigned                 |
| MLREG_SIGNING_CERT    | with the key: its certificate (PEM)                  | none                     |
| MLREG_SIGNING_CHAIN   | with the certificate: the chain up to the root (PEM) | none                     |
| MLFLOW_TRACKING_URI   | the MLflow tracking + registry server  | ``sqlite:///<home>/mlflow.db`` |

The three MLREG_SIGNING_* variables are the ``--sign-key``/``--sign-cert``/``--sign-chain`` options'
defaults (typer reads them for ``mlreg register``, ``export`` and ``sign``; registry/signing.py).

``redact_uri`` masks the credentials of every URI in a text (``redact_data``: of every string in a
document): what the CLI prints (mlreg/cli/output.py) and a promotion records in MLflow pass through it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import SettingsError
from registry.resources import backends_dir, template_dir

SOURCE_ROOT = Path(__file__).resolve().parents[1]
PROJECT_MARKERS = ("mlreg.toml", ".mlreg", ".git")
DEFAULT_TRITON_TIMEOUT = 30.0
DEFAULT_MLFLOW_TIMEOUT = 15.0
DEFAULT_LOCK_LEASE = 900.0
EXPORTS_EXPERIMENT = "mlreg-exports"  # MLflow: one run per registered version
PROMOTIONS_EXPERIMENT = "mlreg-promotions"  # MLflow: one run per promotion
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
# MLflow 3's tracking/registry stores (its UnsupportedModelRegistryStoreURIException lists them)
TRACKING_SCHEMES = frozenset(
    {"file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"}
)
# what child processes that may import TensorFlow get, so its start-up lines never reach a user
QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """The one reading of a boolean MLREG_* variable."""
    value = (os.environ if env is None else env).get(name, "")
    return value.strip().lower() in TRUE_WORDS


def find_project_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding a project marker, else ``start``."""
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:  # nan and inf too: no timeout can be made of them
        raise SettingsError(
            f"{name}={raw!r} is not a number of seconds", fix=f"set {name} to e.g. {default:g}"
        )
    return value


# a URI inside any text: a scheme, then everything up to a blank or a quote
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# query parameters that carry a secret (a presigned URL's X-Amz-Signature, Azure's sig, a token)
_SECRET_PARAM = re.compile(
    r"(?i)([?&;][^=&#\s]*(?:secret|password|passwd|token|signature|credential|key|sig)=)[^&#;\s'\"]*"
)
MASK = "***"


def redact_uri(text: str) -> str:
    """``text`` with the credentials of every URI in it masked, as every message, document, record
    and report shows it: the password of a user info (``postgresql://user:***@host``), a user info
    without password whole (``https://***@host``: often a token; pip masks it so too), the whole
    user info of an ``s3://`` URI (an access key ID and its secret: its path parts never hold an
    '@', so a secret holding '/' is caught too), and secret query parameters
    (``?X-Amz-Signature=***``).  Idempotent; ``alice@host`` (a lock's owner) is no URI."""
    return _URI_IN_TEXT.sub(lambda m: _redact_one(m.group(0)), text)


def _redact_one(uri: str, s3: bool = False) -> str:
    scheme = _SCHEME.match(uri)
    end_of_scheme = scheme.end() if scheme else 0
    head, rest = uri[:end_of_scheme], uri[end_of_scheme:]
    s3 = s3 or head.lower() == "s3://"
    if _SCHEME.match(rest):  # Triton's s3://http://host:port/bucket/prefix
        return head + _redact_one(rest, s3)
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    userinfo = rest[:at] if at >= 0 else ""
    first = userinfo.split("/", 1)[0]
    if at >= 0 and ("/" not in userinfo or ":" in first or s3):  # else an '@' in a path
        user, colon, _ = first.partition(":")
        keep = bool(colon and user and user != MASK) and not s3  # an S3 user is an access key ID
        rest = (f"{user}:{MASK}" if keep else MASK) + rest[at:]
    return head + _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)


def redact_data(data: Any) -> Any:
    """``data`` (a JSON-able document: dicts, lists, strings...) with ``redact_uri`` applied to
    every string in it, keys included: what is printed with ``--json`` or recorded in MLflow."""
    if isinstance(data, str):
        return redact_uri(data)
    if isinstance(data, Mapping):
        return {redact_data(k) if isinstance(k, str) else k: redact_data(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_data(item) for item in data]
    return data


def check_tracking_uri(uri: str) -> str:
    """``uri`` if MLflow can keep a registry there, else a SettingsError naming the schemes it can."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else "file"
    if scheme not in TRACKING_SCHEMES:
        raise SettingsError(
            f"MLFLOW_TRACKING_URI={redact_uri(uri)!r}: MLflow keeps no model registry at a '{scheme}' URI",
            fix="use sqlite:///PATH, http(s)://HOST:PORT of an 'mlflow server', or postgresql://...; "
            "unset it for the embedded registry under MLREG_HOME",
        )
    return uri


def _packaged_template() -> Path:
    return template_dir()


def _user_cache(env: Mapping[str, str]) -> Path | None:
    """$XDG_CACHE_HOME/mlreg, else ~/.cache/mlreg (the user's even where ``env`` names no HOME:
    what it holds is keyed by release and never changes, so any MLREG_HOME may share it)."""
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "mlreg"
    try:
        home = Path(env["HOME"]).expanduser() if env.get("HOME") else Path.home()
    except RuntimeError:  # no home directory known: each MLREG_HOME keeps its own
        return None
    return home / ".cache" / "mlreg"


@dataclass(frozen=True)
class Settings:
    home: Path
    template_dir: Path
    debug: bool = False
    no_progress: bool = False
    triton_timeout: float = DEFAULT_TRITON_TIMEOUT
    mlflow_uri: str = ""
    mlflow_timeout: float = DEFAULT_MLFLOW_TIMEOUT
    lock_lease: float = DEFAULT_LOCK_LEASE
    user_cache: Path | None = None  # $XDG_CACHE_HOME/mlreg: what every project of the user may share

    @property
    def template_cache(self) -> Path:
        """Where the empty registry a new embedded one is copied from is kept (registry/mlflow/sqlite.py)."""
        return self.user_cache or self.home / "cache"

    @property
    def tracking_uri(self) -> str:
        """MLFLOW_TRACKING_URI (checked: a SettingsError if MLflow cannot use it), else the
        embedded sqlite registry under .mlreg/."""
        if self.mlflow_uri:
            return check_tracking_uri(self.mlflow_uri)
        return f"sqlite:///{self.home / 'mlflow.db'}"

    @property
    def artifact_root(self) -> Path:
        """Where the embedded registry keeps artifacts."""
        return self.home / "artifacts"

    @property
    def stack_dir(self) -> Path:
        return self.home / "stack"

    @property
    def digest_cache(self) -> Path:
        """sha256 of local files by (size, mtime, inode): unchanged files are not re-read."""
        return self.home / "cache" / "digests.json"

    @property
    def local_repository(self) -> Path:
        """The local environment's Triton repository (the default for `mlreg stack up`)."""
        return self.home / "model_repository"

    @property
    def backends_source(self) -> Path:
        """The stand-in backends (``infra/backends``; packaged in a wheel: registry/resources.py)."""
        return backends_dir()

    def check_home(self) -> Path:
        """The state folder, if it is (or can become) a writable folder; else a SettingsError.

        Creates nothing: a missing folder is fine when its nearest existing parent is writable.
        """
        existing = next((p for p in (self.home, *self.home.parents) if p.exists()), Path("/"))
        problem = ""
        if not existing.is_dir():
            problem = f"'{existing}' is a file, not a folder"
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem = f"'{existing}' is not writable"
        if problem:
            raise SettingsError(
                f"the state folder MLREG_HOME={self.home} cannot be used: {problem}",
                fix="set MLREG_HOME to a writable folder (or unset it for <project>/.mlreg)",
            )
        return self.home

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
        env = os.environ if env is None else env
        root = find_project_root((cwd or Path.cwd()).resolve())
        home = Path(env["MLREG_HOME"]).expanduser() if env.get("MLREG_HOME") else root / ".mlreg"
        template = env.get("MLREG_TEMPLATE_DIR") or _packaged_template()
        return cls(
            home=home.resolve(),
            template_dir=Path(template).resolve(),
            debug=env_flag("MLREG_DEBUG", env),
            no_progress=env_flag("MLREG_NO_PROGRESS", env),
            triton_timeout=_seconds(env, "MLREG_TRITON_TIMEOUT", DEFAULT_TRITON_TIMEOUT),
            mlflow_uri=env.get("MLFLOW_TRACKING_URI", ""),
            mlflow_timeout=_seconds(env, "MLREG_MLFLOW_TIMEOUT", DEFAULT_MLFLOW_TIMEOUT),
            lock_lease=_seconds(env, "MLREG_LOCK_LEASE", DEFAULT_LOCK_LEASE),
            user_cache=_user_cache(env),
        )
