"""infra/compose as ``docker compose config`` reads it: its ``.env.example``, compose's variable
syntax and the interpolated file (test_infra.py checks it; test_postgres.py runs its MLflow)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

INFRA = ROOT / "infra"
COMPOSE_DIR = INFRA / "compose"
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable syntax (${VAR}, ${VAR:-default}, ${VAR:?error}, $$) over parsed YAML."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.groups()
        current = env.get(name)
        if op in (":-", "-"):
            return current if current else (arg or "")
        if op in (":?", "?") and not current:
            raise KeyError(f"{name}: {arg}")
        return current or ""

    return VARIABLE.sub(substitute, value)


def compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as ``docker compose config`` would see it with .env.example (+ ``env``)."""
    raw = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    return dict(interpolate(raw, {**env_example(), **(env or {})}))


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: bash .ci/system-deps.sh installs Debian's kubectl")
    return found


def image_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")
