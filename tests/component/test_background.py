"""Warm-ups settle before a command exits (registry/background.py): a daemon thread still importing
MLflow or great_expectations when Python runs its exit handlers made ``weakref.finalize``'s handler
fail ("dictionary changed size during iteration") on a refused promotion's terminal."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from mlreg.cli import main as cli_main
from registry import background


def test_settle_waits_for_a_running_warm_up() -> None:
    done = threading.Event()
    thread = background.start(lambda: (time.sleep(0.3), done.set()), "test-warm-up")
    assert thread.daemon  # never holds the process up by itself: settle is the bound
    assert background.settle(5.0) == []
    assert done.is_set()
    assert not thread.is_alive()


def test_settle_is_bounded_and_names_what_still_runs() -> None:
    release = threading.Event()
    thread = background.start(lambda: release.wait(30), "test-stuck-warm-up")
    began = time.monotonic()
    try:
        assert background.settle(0.2) == ["test-stuck-warm-up"]
        assert time.monotonic() - began < 5.0
        assert thread.is_alive()
    finally:
        release.set()
        thread.join(5)


def test_the_cli_settles_its_warm_ups_before_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mlreg.cli.main.main``, as ``python -m mlreg`` and the ``mlreg`` script run it: a warm-up
    started during the command has ended when the command returns to Python's exit."""
    done = threading.Event()

    def command() -> None:
        background.start(lambda: (time.sleep(0.4), done.set()), "test-cli-warm-up")
        raise SystemExit(0)

    monkeypatch.setattr(cli_main, "only_the_named", lambda argv: command)
    monkeypatch.setattr(sys, "argv", ["mlreg", "versions"])
    with pytest.raises(SystemExit):
        cli_main.main()
    assert done.is_set()


def test_an_interrupted_command_waits_half_a_second_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (exit 130): the prompt comes back at once, not after MLflow's import."""
    release = threading.Event()

    def command() -> None:
        background.start(lambda: release.wait(30), "test-interrupted-warm-up")
        raise SystemExit(130)

    monkeypatch.setattr(cli_main, "only_the_named", lambda argv: command)
    monkeypatch.setattr(sys, "argv", ["mlreg", "promote"])
    began = time.monotonic()
    try:
        with pytest.raises(SystemExit) as info:
            cli_main.main()
        assert info.value.code == 130
        assert time.monotonic() - began < 5.0
    finally:
        release.set()
