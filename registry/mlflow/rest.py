"""Read-only MLflow registry queries over its REST API (no MLflow import: fast CLI start)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from registry.errors import RegistryError
from registry.settings import redact_uri

PAGE = 1000


def _get(base: str, path: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    url = f"{base.rstrip('/')}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {}
        code = body.get("error_code", str(exc.code))
        raise RegistryError(
            f"MLflow ({redact_uri(base)}): {path} failed: {code}: {body.get('message', exc)}",
            fix="check the model name ('mlreg versions MODEL')"
            if "DOES_NOT_EXIST" in code
            else "read the message above",
            code=code,
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RegistryError(
            f"MLflow ({redact_uri(base)}): {path} failed: {exc}",
            fix=f"check the tracking server at {base} is up (MLFLOW_TRACKING_URI)",
        ) from exc


def search_versions(base: str, name: str, timeout: float) -> list[dict[str, Any]]:
    versions: list[dict[str, Any]] = []
    token = ""
    while True:
        params = {"filter": f"name='{name}'", "max_results": PAGE}
        if token:
            params["page_token"] = token
        page = _get(base, "model-versions/search", params, timeout)
        versions.extend(page.get("model_versions", []))
        token = page.get("next_page_token", "")
        if not token:
            return versions


def aliases(base: str, name: str, timeout: float) -> dict[str, str]:
    model = _get(base, "registered-models/get", {"name": name}, timeout)["registered_model"]
    return {a["alias"]: str(a["version"]) for a in model.get("aliases", [])}


def ping(base: str, timeout: float) -> None:
    """Raise RegistryError unless the tracking server answers."""
    _get(base, "experiments/search", {"max_results": 1}, timeout)
