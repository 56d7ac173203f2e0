"""README "no secret is ever printed or recorded": the start-up line ``mlreg -v stack up`` logs for
tritonserver (``ManagedProcess.start``, at INFO) names the control-API restriction but never its
key -- checked here in the pytest process: the line is logged before the server is started, and
``subprocess.Popen`` is replaced by a refusal that records the command it was handed, so nothing
starts.  tests/component/test_mutant_stack_log.py checks the same line with a stand-in server
really started."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from pipelines.devstack.local_triton import TritonInstall, server_command, triton_process
from pipelines.triton.control_key import HEADER


class NotStarted(Exception):
    """What the stand-in for ``subprocess.Popen`` raises, with the command it was handed."""


def not_started(argv: list[str], *args: object, **kwargs: object) -> None:
    raise NotStarted(list(argv))


def test_the_start_up_line_names_the_restriction_but_never_the_control_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tmp_path / "bin" / "tritonserver"
    install = TritonInstall(server, (), tmp_path / "python", tmp_path / "stub")
    key = "k3y-" + os.urandom(12).hex()
    ports = (18000, 18001, 18002)  # never bound: nothing starts
    command = server_command(install, str(tmp_path / "repo"), tmp_path / "backends", ports, "h5", key)
    assert any(key in arg for arg in command)  # the key is on the command line Triton gets
    process = triton_process(command, dict(os.environ), ports[1], tmp_path / "triton.log", timeout=30)
    monkeypatch.setattr(subprocess, "Popen", not_started)
    caplog.set_level(logging.INFO, logger="pipelines.devstack.processes")
    with pytest.raises(NotStarted) as handed:
        process.start()
    assert handed.value.args[0] == command  # what would have run is the command, key and all
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting ")]
    assert len(lines) == 1, lines
    [line] = lines
    assert line.startswith(f"starting {server} ")
    assert "--http-restricted-api=" in line
    assert f"{HEADER}=<redacted>" in line
    assert key not in caplog.text  # nowhere in what was logged
