"""The unit tier runs in the pytest process: every way Python starts a process is refused inside a
unit test, and a test that tried fails, naming the start, even where the code under it swallowed
the error (tests/unit/conftest.py ``no_process``).  What starts processes lives in tests/component."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from multiprocessing.util import spawnv_passfds
from pathlib import Path

import pytest

from tests.unit.conftest import PROCESS_STARTS, SERVERS, ProcessRefused, no_process


def _forked(marker: Path) -> None:
    pid = os.fork()
    if pid == 0:  # reached only if the fork was not refused: the child marks and leaves at once
        marker.touch()
        os._exit(0)
    os.waitpid(pid, 0)


def _starts(marker: Path) -> dict[str, Callable[[], object]]:
    """Each way to start a process, each one that would create ``marker`` if it ran."""
    touch = ["touch", str(marker)]
    return {
        "subprocess.Popen._execute_child": lambda: subprocess.run(touch, check=True),
        # multiprocessing's spawn and forkserver contexts start their interpreter this way
        "_posixsubprocess.fork_exec": lambda: spawnv_passfds(shutil.which("touch") or "touch", touch, ()),
        "os.system": lambda: os.system(f"touch {marker}"),
        "os.posix_spawnp": lambda: os.posix_spawnp("touch", touch, dict(os.environ)),
        "os.fork": lambda: _forked(marker),
    }


def _under_no_process(start: Callable[[], object], swallow: bool) -> None:
    """``start`` under ``no_process``; its refusal caught and passed over where ``swallow``, as code
    that reports a failed start and goes on would."""
    with no_process():
        if not swallow:
            start()
            return
        try:
            start()
        except ProcessRefused:
            pass


def test_every_way_to_start_a_process_is_refused_in_a_unit_test() -> None:
    """The autouse fixture holds: each start of PROCESS_STARTS is the refusal while a unit test runs
    (nothing is called here: calling one would fail this test, as it should)."""
    for owner, attribute, name in PROCESS_STARTS:
        if hasattr(owner, attribute):
            start = getattr(owner, attribute)
            assert start.__qualname__ == "refusing_processes.<locals>.refusal.<locals>.refuse", (
                f"{name} is not refused in a unit test"
            )


@pytest.mark.parametrize(
    "name", ["subprocess.Popen._execute_child", "os.system", "os.posix_spawnp", "os.fork"]
)
def test_a_start_is_refused_before_anything_runs_with_an_error_naming_it(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "started"
    with pytest.raises(ProcessRefused, match=rf"^{re.escape(name)}: a unit test runs in the pytest process"):
        _under_no_process(_starts(marker)[name], swallow=False)
    assert not marker.exists(), f"{name} ran a process under no_process"


def test_a_refusal_the_code_under_test_swallowed_still_fails_the_test(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with pytest.raises(pytest.fail.Exception, match=r"subprocess\.Popen\._execute_child.*tests/component"):
        _under_no_process(_starts(marker)["subprocess.Popen._execute_child"], swallow=True)
    assert not marker.exists()


def test_a_test_that_starts_nothing_passes_through_and_the_starts_come_back(tmp_path: Path) -> None:
    """The control: no start, no failure; on leaving, each start is what it was before (here, the
    autouse fixture's refusal)."""
    before = {
        name: getattr(owner, attribute)
        for owner, attribute, name in PROCESS_STARTS
        if hasattr(owner, attribute)
    }
    with no_process() as refused:
        (tmp_path / "file").write_text("in this process")
    assert refused == []
    after = {
        name: getattr(owner, attribute)
        for owner, attribute, name in PROCESS_STARTS
        if hasattr(owner, attribute)
    }
    assert after == before


REFUSED_FIXTURES = {
    "s3_server": SERVERS.format("moto_server (s3_server)"),
    "mlflow_server": SERVERS.format("`mlflow server` (mlflow_server)"),
    "template_build": "a unit test exports nothing (template_build)",
    "built_repository": "fast tests use standin_repository, not built_repository",
}


@pytest.mark.parametrize("fixture", sorted(REFUSED_FIXTURES))
def test_the_session_s_servers_and_export_are_refused_to_a_unit_test(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    """Session fixtures are set up before a test's own, so the refusals cannot see their processes
    start: the unit tier refuses them by name instead."""
    with pytest.raises(pytest.fail.Exception) as refused:
        request.getfixturevalue(fixture)
    assert str(refused.value).startswith(REFUSED_FIXTURES[fixture])
