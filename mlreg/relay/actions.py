"""What deploying a version to an environment means for the relay, per environment
(``[relay.environments.E] action``):

- ``promote``: in-process, the verb ``mlreg promote`` runs (``mlreg.ops.promote.promote``): the
  same checks, the same refusals, the same verdict; what serves is read as ``mlreg status`` reads it.
- ``dispatch``: a GitHub ``workflow_dispatch`` of promote.yml (``action=promote``, model, version,
  environment): the CI path, its approvals and all.  What serves is the environment's own MLflow
  alias (a promotion moves it last, once a target serves the version).
- ``pin``: a ``workflow_dispatch`` of gitops-pr.yml (environment, ``pins="model=version"``): the
  workflow runs ``mlreg fleet pin`` and opens the pull request; merging it is the promotion.

A dispatch is answered 204 by GitHub and serves minutes later: the queue remembers it
(``dispatched``) and reconcile does not dispatch the same version again within ``dispatch_grace``.
The token is read when a dispatch is sent, sent only as the ``Authorization`` header, and never
written into a message, a log line or the queue.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mlreg.relay.config import RelayConfig, Target, read_secret
from registry.errors import MlregError, StackError, StorageError, TritonError

if TYPE_CHECKING:
    from registry.settings import Settings

DISPATCH_TIMEOUT_S = 10.0
RETRIED = (StorageError, TritonError, StackError)  # a part not answering, a lock held: try again later
# the characters a token may hold (GitHub's tokens are [A-Za-z0-9_]; a JWT adds "." and "-"): an
# allow-list checked before the header is built -- http.client's own refusal quotes the value
TOKEN = re.compile(r"^[A-Za-z0-9_.~+/=-]{1,4096}$")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A dispatch is answered 204 where it is sent: a redirect is answered as it came, never
    followed (urllib would send the Authorization header on to whatever host it names)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True)
class Outcome:
    state: str  # "done" | "noop" | "refused" | "failed" (retried) | "dispatched"
    note: str = ""
    run_id: str = ""


class Deployer(Protocol):
    def serving(self, env: str, model: str) -> str:
        """The version ``env`` serves of ``model`` ("" when none or it cannot say)."""

    def deploy(self, env: str, model: str, version: str) -> Outcome: ...


class Promoter:
    """``mlreg promote`` in-process; ``mlreg status`` for what serves."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def serving(self, env: str, model: str) -> str:
        from mlreg.ops.status import status  # lazy: tritonclient, MLflow

        report = status(self.settings, env, model)
        return serving_of([row.serving for row in report.models if row.model == model])

    def deploy(self, env: str, model: str, version: str) -> Outcome:
        from mlreg.ops.promote import promote  # lazy: the promotion (tritonclient, numpy)

        try:
            result = promote(self.settings, env, model, version)
        except RETRIED as exc:
            return Outcome("failed", exc.message)
        except MlregError as exc:  # the CLI's refusal, word for word
            return Outcome("refused", exc.message)
        if result.noop:
            return Outcome("noop", "already served", result.run_id)
        note = f"promoted, MLflow run {result.run_id}" if result.ok else result.error
        return Outcome("done" if result.ok else "refused", note, result.run_id)


def serving_of(rows: Sequence[Mapping[str, object]]) -> str:
    """The one version every reachable target of a status row serves; the highest while a swap
    shows two; "" when no target serves one (or none answers)."""
    common: set[str] | None = None
    for serving in rows:
        for found in serving.values():
            if isinstance(found, list):
                common = set(found) if common is None else common & set(found)
    return max(common, key=int) if common else ""


class GitHub:
    """``workflow_dispatch`` through GitHub's REST API; what serves from the environment's alias."""

    def __init__(self, settings: Settings, config: RelayConfig) -> None:
        self.settings, self.config = settings, config

    def serving(self, env: str, model: str) -> str:
        from mlreg.ops.context import environment  # lazy: the environments' settings
        from registry.mlflow.reads import open_reads  # lazy: the registry's reads

        alias = environment(self.settings, env).alias
        return open_reads(self.settings).require_model(model).get(alias, "")

    def deploy(self, env: str, model: str, version: str) -> Outcome:
        target = self.config.target(env)
        inputs = dispatch_inputs(target, env, model, version)
        status, why = dispatch(
            target,
            inputs,
            read_secret(target.token, self.config.path.parent, f"[relay.environments.{env}] token"),
        )
        if status == 204:
            return Outcome("dispatched", f"{target.workflow} on {target.repository}@{target.ref}")
        return Outcome(
            "failed", f"GitHub answered {status or 'nothing'} to the dispatch of {target.workflow}: {why}"
        )


def dispatch_inputs(target: Target, env: str, model: str, version: str) -> dict[str, str]:
    if target.action == "pin":
        return {"environment": env, "pins": f"{model}={version}"}
    return {"action": "promote", "model": model, "version": version, "environment": env}


def dispatch(target: Target, inputs: dict[str, str], token: bytes) -> tuple[int, str]:
    """POST the dispatch; (HTTP status, a bounded reason without the token) -- 0 when unreachable."""
    url = f"{target.api.rstrip('/')}/repos/{target.repository}/actions/workflows/{target.workflow}/dispatches"
    if not TOKEN.match(token.decode(errors="replace")):
        return 0, "the token holds characters no GitHub token has (nothing sent; the token is not shown)"
    body = json.dumps({"ref": target.ref, "inputs": inputs}).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Accept", "application/vnd.github+json")
    request.add_header("X-GitHub-Api-Version", "2022-11-28")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token.decode(errors='replace')}")
    try:
        with _OPENER.open(request, timeout=DISPATCH_TIMEOUT_S) as answer:
            return int(answer.status), ""
    except urllib.error.HTTPError as exc:
        text = exc.read(512).decode(errors="replace")
        return exc.code, _without(text, token)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, _without(str(exc), token)[:300]


def _without(text: str, token: bytes) -> str:
    secret = token.decode(errors="replace")
    return text.replace(secret, "[token]") if secret else text


def deployer_for(settings: Settings, config: RelayConfig, env: str) -> Deployer:
    return GitHub(settings, config) if config.target(env).action != "promote" else Promoter(settings)


__all__ = [
    "Deployer",
    "GitHub",
    "Outcome",
    "Promoter",
    "deployer_for",
    "dispatch",
    "dispatch_inputs",
    "serving_of",
]
