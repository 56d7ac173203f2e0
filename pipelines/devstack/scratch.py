"""Scratch tritonservers for the quality gate's dry runs (``--dry-run``, plan jobs).

The promotion never starts a server itself: the application hands it ``scratch_servers(settings)``
(a ``pipelines.core.ports.ScratchServers``), and the gate enters it with the model repository it
assembled, talks to the URL it yields, and leaves it, which stops the server.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipelines.core.ports import ScratchServers
from pipelines.devstack import local_triton
from pipelines.triton.control_key import ControlKey
from registry.settings import Settings


def scratch_servers(settings: Settings, key: ControlKey | None = None) -> ScratchServers:
    """A factory of local tritonservers (explicit model control, the settings' stand-in backends),
    their control API locked to ``key`` -- the environment's, which the gate's connector sends
    (None: the environment's replicas take no key, and neither does the scratch server)."""

    @contextlib.contextmanager
    def scratch(repository: Path) -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="mlreg-scratch-") as state:
            info, process = local_triton.start_server(
                repository, Path(state), settings.backends_source, control_key=key.value if key else None
            )
            try:
                yield info.grpc_url
            finally:
                local_triton.stop_pid(info.pid, info.shm_prefix, process=process)

    return scratch
