"""README "no secret is ever printed or recorded": the start-up line ``mlreg -v stack up`` logs for
tritonserver (``ManagedProcess.start``, at INFO: what ``-v`` shows) names the control-API
restriction but never its key.

The command is the stack's own (``server_command`` with a control key, as ``mlreg stack up`` builds
it); only its executable is a stand-in -- a small Python HTTP server answering Triton's live check
on the command's ``--http-port`` -- so the line is logged by the real start-up path in a second.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from pipelines.devstack.local_triton import TritonInstall, server_command, three_free_ports, triton_process
from pipelines.devstack.processes import stop_process
from pipelines.triton.control_key import HEADER

STANDIN = """#!{python}
import http.server, sys
port = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--http-port=")))


class Live(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Live).serve_forever()
"""


def test_the_start_up_line_names_the_restriction_but_never_the_control_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = tmp_path / "bin" / "tritonserver"
    server.parent.mkdir()
    server.write_text(STANDIN.format(python=sys.executable))
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    install = TritonInstall(server, (), tmp_path / "python", tmp_path / "stub")
    key = "k3y-" + os.urandom(12).hex()
    ports = three_free_ports()
    command = server_command(install, str(tmp_path / "repo"), tmp_path / "backends", ports, "h5", key)
    assert any(key in arg for arg in command)  # the key is on the command line Triton gets
    process = triton_process(command, dict(os.environ), ports[1], tmp_path / "triton.log", timeout=30)
    caplog.set_level(logging.INFO, logger="pipelines.devstack.processes")
    started = process.start()
    try:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting ")]
        assert len(lines) == 1, lines
        [line] = lines
        assert line.startswith(f"starting {server} ")
        assert "--http-restricted-api=" in line
        assert f"{HEADER}=<redacted>" in line
        assert key not in caplog.text  # nowhere in what was logged
    finally:
        stop_process(started.pid, started, grace=2, marker="tritonserver")
