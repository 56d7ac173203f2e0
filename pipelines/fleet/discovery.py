"""Targets found by DNS: ``discover = "dns:NAME:PORT"`` (a Kubernetes headless Service).

Every A/AAAA record of NAME is one replica; ``socket.getaddrinfo`` asks the system resolver, so
/etc/hosts, the cluster DNS and search domains work as they do for any other client.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from registry.errors import PromotionError, UsageError

Lookup = Callable[..., list[Any]]
PREFIX = "dns:"


def parse(spec: str) -> tuple[str, int]:
    """``dns:NAME:PORT`` -> (NAME, PORT); raises UsageError naming what is wrong."""
    fix = 'write discover = "dns:triton-headless.models.svc.cluster.local:8001"'
    if not spec.startswith(PREFIX):
        raise UsageError(f"discover = {spec!r}: only 'dns:NAME:PORT' is supported", fix=fix)
    name, _, port = spec[len(PREFIX) :].rpartition(":")
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"discover = {spec!r}: expected dns:NAME:PORT with a port 1-65535", fix=fix)
    return name.strip("[]"), int(port)


def resolve(spec: str, lookup: Lookup = socket.getaddrinfo) -> tuple[str, ...]:
    """Every address NAME resolves to, as sorted gRPC targets ``host:port`` (``[v6]:port``)."""
    name, port = parse(spec)
    try:
        records = lookup(name, port, 0, socket.SOCK_STREAM)
    except OSError as exc:
        raise PromotionError(
            f"cannot resolve {name} ({spec}): {exc}",
            fix="check the Service name and that this machine uses the cluster's DNS",
        ) from exc
    found = set()
    for family, *_, address in records:
        host = address[0]
        found.add(f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}")
    if not found:
        raise PromotionError(f"{name} ({spec}) resolves to no address", fix="check that the replicas run")
    return tuple(sorted(found))
