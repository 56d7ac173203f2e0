"""``mlreg triton status [--url U]``: what each Triton server reports (version, loaded models)."""

from __future__ import annotations

from typing import Any

from registry.errors import UsageError
from registry.settings import Settings


def triton_status(settings: Settings, urls: list[str]) -> list[dict[str, Any]]:
    """Each server's report (``{"url", "error"}`` for one that does not answer); no ``urls``: the
    local stack's server (a UsageError when it is not running)."""
    from pipelines.triton.control import server_report  # lazy: grpc ~60 ms, this verb only
    from pipelines.triton.control_key import control_key  # lazy: grpc ~60 ms, this verb only

    if not urls:
        from pipelines.devstack.stack import running_server  # lazy: ~90 ms, only without a URL

        info = running_server(settings)
        if info is None:
            raise UsageError(
                "no --url given and the local stack is not running",
                fix="pass --url host:port or start it with 'mlreg stack up'",
            )
        urls = [info.grpc_url]
    key = control_key(settings.home)
    return [server_report(u, timeout=settings.triton_timeout, key=key) for u in urls]


__all__ = ["triton_status"]
