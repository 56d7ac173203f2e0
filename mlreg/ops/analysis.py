"""``mlreg analysis``: the bake's checks of an environment, for the GitOps engines that gate on them.

- ``check`` judges one model once (``mlreg analysis check``: a Kargo verification Job, an Argo
  Rollouts ``job`` metric; the exit code is the verdict);
- ``AnalysisServer`` answers ``GET /v1/analysis/<env>/<model>[?version=N&window=S]`` with the same
  document (``mlreg analysis serve``: an Argo Rollouts ``web`` metric, a Kargo verification with a
  ``web`` provider).  A verdict, passed or failed, is HTTP 200 (the metric's ``successCondition``
  decides); 404 says there is nothing to judge (an environment this server does not answer for, a
  model no replica reports, a version READY on no replica), 400 a bad query, 503 replicas whose
  metrics cannot be read (more than the policy's ``max_unavailable``; fewer are left out and named
  in the verdict's ``left_out``).

The judging is ``pipelines.checks.bake`` (the bake's own checks); this module resolves the
environment as every command does (``mlreg.ops.context.environment``: the local stack's replicas filled
in) and serves.  It reads Triton's metrics and readiness only: no MLflow, no store, no control key.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import environment
from registry.errors import MlregError, UsageError
from registry.register import check_model_name
from registry.settings import Settings, redact_data, redact_uri

if TYPE_CHECKING:
    from pipelines.checks.bake import Analysis

log = logging.getLogger(__name__)
ROUTE = re.compile(r"^/v1/analysis/(?P<env>[^/]+)/(?P<model>[^/]+)/?$")
PORT = 8090
Judge = Callable[[Settings, str, str, "str | None", float], "Analysis"]


def check(
    settings: Settings, env_name: str, model: str, version: str | None = None, window: float = 0.0
) -> Analysis:
    """The bake's checks of ``model`` on ``env_name``'s replicas, now (``window`` seconds: what
    happens meanwhile)."""
    from pipelines.checks.bake import analyse, check_window  # lazy: numpy (~0.7 s), when judged
    from pipelines.promote.environments import resolve_targets  # lazy: as above

    check_model_name(model)
    check_window(window)
    env = environment(settings, env_name)
    return analyse(env, resolve_targets(settings, env), model, version, window)


class AnalysisServer(ThreadingHTTPServer):
    """The HTTP face of ``check`` for the environments it was started for."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], settings: Settings, environments: Sequence[str], judge: Judge = check
    ) -> None:
        super().__init__(address, AnalysisHandler)
        self.settings = settings
        self.environments = tuple(environments)
        self.judge = judge

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def start(settings: Settings, environments: Sequence[str], host: str, port: int) -> AnalysisServer:
    """A server bound to ``host:port`` (0: a free port), every environment checked to exist first."""
    if not environments:
        raise UsageError("no environment to answer for", fix="pass --env E (repeatable)")
    for name in environments:
        environment(settings, name)  # an unknown one is refused now, not at the first request
    try:
        return AnalysisServer((host, port), settings, environments)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            fix="pass another --port (0: any free one)",
        ) from exc


class AnalysisHandler(BaseHTTPRequestHandler):
    server: AnalysisServer
    server_version = "mlreg-analysis"

    def do_GET(self) -> None:  # the name http.server calls
        url = urllib.parse.urlsplit(self.path)
        if url.path in ("/", "/healthz"):
            self._send(200, {"ok": True, "environments": list(self.server.environments)})
            return
        match = ROUTE.match(url.path)
        if match is None:
            self._send(404, _error("no such path", "ask GET /v1/analysis/<environment>/<model>"))
            return
        env, model = (urllib.parse.unquote(match.group(k)) for k in ("env", "model"))
        if env not in self.server.environments:
            served = ", ".join(self.server.environments)
            self._send(404, _error(f"this server answers for {served}, not '{env}'", f"ask one of: {served}"))
            return
        self._answer(env, model, urllib.parse.parse_qs(url.query))

    def _answer(self, env: str, model: str, query: dict[str, list[str]]) -> None:
        from pipelines.checks.bake import NotServed  # lazy: numpy (~0.7 s), when judged

        try:
            version, window = _query(query)
            analysis = self.server.judge(self.server.settings, env, model, version, window)
        except NotServed as exc:
            self._send(404, _error(exc.message, exc.fix))
        except UsageError as exc:
            self._send(400, _error(exc.message, exc.fix))
        except MlregError as exc:
            self._send(503, _error(exc.message, exc.fix))
        else:
            self._send(200, analysis.to_dict())

    def _send(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(redact_data(document)).encode()  # a replica's URL may carry credentials
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
        log.info("%s %s", self.address_string(), redact_uri(format % args))


def _query(query: dict[str, list[str]]) -> tuple[str | None, float]:
    from pipelines.checks.bake import check_window  # lazy: numpy (~0.7 s), when judged

    unknown = sorted(set(query) - {"version", "window"})
    if unknown:
        raise UsageError(f"unknown query parameter(s) {', '.join(unknown)}", fix="pass version=N, window=S")
    version = query.get("version", [""])[-1].strip() or None
    if version is not None and not (version.isascii() and version.isdigit() and int(version) > 0):
        raise UsageError(f"version={version!r} is not a positive version number", fix="pass version=2")
    try:
        window = float(query.get("window", ["0"])[-1])
    except ValueError:
        raise UsageError("window must be a number of seconds", fix="pass window=0 or window=30") from None
    return (str(int(version)) if version else None), check_window(window)


def _error(message: str, fix: str | None) -> dict[str, Any]:
    return {"kind": "analysis", "ok": False, "error": message, "fix": fix or ""}
