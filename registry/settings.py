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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from registry.errors import SettingsError

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


def quiet_child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a child that may import TensorFlow: no start-up lines."""
    return {**(os.environ if env is None else env), **QUIET_TENSORFLOW}


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
    if not value > 0:
        raise SettingsError(
            f"{name}={raw!r} is not a number of seconds", fix=f"set {name} to e.g. {default:g}"
        )
    return value


def redact_uri(uri: str) -> str:
    """``uri`` as error messages show it: a password in it (``postgresql://user:secret@host``) is
    replaced by ``***``."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", uri)


def check_tracking_uri(uri: str) -> str:
    """``uri`` if MLflow can keep a registry there, else a SettingsError naming the schemes it can."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else "file"
    if scheme not in TRACKING_SCHEMES:
        raise SettingsError(
            f"MLFLOW_TRACKING_URI={uri!r}: MLflow keeps no model registry at a '{scheme}' URI",
            fix="use sqlite:///PATH, http(s)://HOST:PORT of an 'mlflow server', or postgresql://...; "
            "unset it for the embedded registry under MLREG_HOME",
        )
    return uri


def _packaged_template() -> Path:
    from registry.resources import template_dir

    return template_dir()


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
        from registry.resources import backends_dir

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
        )
