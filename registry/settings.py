"""Every MLREG_* environment variable, read in one place.

Code deeper down receives a ``Settings`` object; it never reads the environment
itself.

| variable              | meaning                                              | default                  |
| --------------------- | ---------------------------------------------------- | ------------------------ |
| MLREG_HOME            | state folder (stack state, logs, local repository)   | ``<project>/.mlreg``     |
| MLREG_TEMPLATE_DIR    | the model repository template                        | the checkout's template  |
| MLREG_DEBUG           | ``1``: tracebacks on errors                          | off                      |
| MLREG_NO_PROGRESS     | ``1``: no progress bars                              | off                      |
| MLREG_TRITON_TIMEOUT  | seconds for one Triton control call (load: x10)      | ``30``                   |
| MLREG_MLFLOW_TIMEOUT  | seconds for one MLflow request (2 retries)           | ``15``                   |
| MLFLOW_TRACKING_URI   | the MLflow tracking + registry server  | ``sqlite:///<home>/mlflow.db`` |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1]
PROJECT_MARKERS = ("mlreg.toml", ".mlreg", ".git")
DEFAULT_TRITON_TIMEOUT = 30.0
DEFAULT_MLFLOW_TIMEOUT = 15.0


def find_project_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding a project marker, else ``start``."""
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Settings:
    home: Path
    template_dir: Path
    debug: bool = False
    no_progress: bool = False
    triton_timeout: float = DEFAULT_TRITON_TIMEOUT
    mlflow_uri: str = ""
    mlflow_timeout: float = DEFAULT_MLFLOW_TIMEOUT

    @property
    def tracking_uri(self) -> str:
        """MLFLOW_TRACKING_URI, else the embedded sqlite registry under .mlreg/."""
        return self.mlflow_uri or f"sqlite:///{self.home / 'mlflow.db'}"

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
        """The stand-in backends shipped in ``infra/backends``."""
        return SOURCE_ROOT / "infra" / "backends"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
        env = os.environ if env is None else env
        root = find_project_root((cwd or Path.cwd()).resolve())
        home = Path(env["MLREG_HOME"]) if env.get("MLREG_HOME") else root / ".mlreg"
        template = env.get("MLREG_TEMPLATE_DIR") or SOURCE_ROOT / "model_repository_template"
        return cls(
            home=home.resolve(),
            template_dir=Path(template).resolve(),
            debug=_flag(env.get("MLREG_DEBUG")),
            no_progress=_flag(env.get("MLREG_NO_PROGRESS")),
            triton_timeout=float(env.get("MLREG_TRITON_TIMEOUT") or DEFAULT_TRITON_TIMEOUT),
            mlflow_uri=env.get("MLFLOW_TRACKING_URI", ""),
            mlflow_timeout=float(env.get("MLREG_MLFLOW_TIMEOUT") or DEFAULT_MLFLOW_TIMEOUT),
        )
