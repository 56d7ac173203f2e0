"""Progress on long work (issue 48): one transient line on a terminal -- what runs now and for how
long -- and nothing off a TTY, with --json or MLREG_NO_PROGRESS=1 (``mlreg.cli.progress.activity``);
a promotion tells each stage as it starts (``Options.on_start``), ``stack up`` each thing it starts.

The terminal is a real pseudo-terminal (``pty``): rich decides from the file it writes to."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.unit.worlds import World

ROOT = Path(__file__).resolve().parents[2]
DRAW = """
import sys, time
from mlreg.cli.progress import activity
with activity(quiet=sys.argv[1] == "quiet") as tell:
    print("callback" if tell else "none", flush=True)
    if tell:
        tell("starting tritonserver")
        time.sleep(0.4)
        tell("loading scorer")
        time.sleep(0.4)
"""


def _run(mode: str, tty: bool, env: dict[str, str] | None = None) -> tuple[str, str]:
    """``DRAW`` in a fresh interpreter, stderr on a pseudo-terminal (``tty``) or a pipe: (stdout, stderr)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "MLREG_NO_PROGRESS": "", **(env or {})}
    if not tty:
        proc = subprocess.run(
            [sys.executable, "-c", DRAW, mode], capture_output=True, text=True, env=environ, timeout=60
        )
        return proc.stdout, proc.stderr
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-c", DRAW, mode], stdout=subprocess.PIPE, stderr=follower, env=environ
    ) as proc:
        os.close(follower)
        drawn = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the pty's other end closed: the process is gone
                    break
                if not chunk:
                    break
                drawn += chunk
            elif proc.poll() is not None:
                break
        os.close(leader)
        out = proc.stdout.read().decode() if proc.stdout else ""
        proc.wait(timeout=10)
    return out, drawn.decode(errors="replace")


def test_a_terminal_gets_a_line_with_what_runs_now() -> None:
    out, drawn = _run("loud", tty=True)
    assert out == "callback\n"
    assert "starting tritonserver" in drawn
    assert "loading scorer" in drawn
    assert "0:00:00" in drawn  # the seconds it has taken so far
    assert "\x1b[?25h" in drawn  # the cursor shown again: the line is gone when the work ends


def test_no_line_off_a_terminal_with_json_or_with_mlreg_no_progress() -> None:
    assert _run("loud", tty=False) == ("none\n", "")  # a pipe: CI logs get the command's own lines
    quiet_out, quiet_drawn = _run("quiet", tty=True)  # --json
    assert quiet_out == "none\n"
    assert "starting" not in quiet_drawn
    off_out, off_drawn = _run("loud", tty=True, env={"MLREG_NO_PROGRESS": "1"})
    assert off_out == "none\n"
    assert "starting" not in off_drawn


def test_a_promotion_tells_each_stage_as_it_starts(tmp_path: Path) -> None:
    world = World(tmp_path)
    started: list[str] = []
    ended: list[str] = []
    world.promote(
        "ens",
        "1",
        on_start=started.append,
        on_stage=lambda stage, status, seconds, detail: ended.append(stage),
    )
    # the listener is told each stage's name as it starts, and within a stage what it does now
    # ("assemble: uploading ens v1", "deploy: wave 2 of 3"): every such line names the stage it is in
    stages = [line for line in started if ":" not in line]
    within = [line for line in started if ":" in line]
    assert stages[0] == "resolve"
    assert stages == ended  # each stage told before it ran, and ran
    assert all(line.split(":", 1)[0] in stages for line in within), within
    assert any(line.startswith("assemble: uploading ") for line in within), within
    assert "deploy" in started
    assert "record" in started
