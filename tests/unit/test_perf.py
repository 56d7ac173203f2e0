"""The canary's performance check (pipelines/checks/perf.py): the verdict's rule, the interleaving,
the settings (issue 25).  No server: the latencies are given, the client is a recorder."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from pipelines.checks.perf import PerfResult, PerfSettings, Side, judge, measure, spread_of
from pipelines.promote.environments import environment
from registry.errors import UsageError
from registry.settings import Settings


def result(serving: list[float] | None, candidate: list[float]) -> PerfResult:
    return PerfResult("m", Side("2", candidate), Side("1", serving) if serving is not None else None)


STEADY = [20.0 + 0.1 * (i % 5) for i in range(40)]


def test_a_candidate_slower_beyond_the_runs_own_noise_fails_and_an_equal_one_passes() -> None:
    slow = judge(result(STEADY, [3 * x for x in STEADY]), PerfSettings())
    assert not slow.ok
    assert slow.threshold == 1.25  # a quiet run: the floor
    assert slow.verdict == "slower by 40.8 ms at p95"
    assert "m v2 p95 61.2 ms vs v1 20.4 ms (x3.00, limit x1.25): slower by 40.8 ms at p95" == slow.line()
    assert judge(result(STEADY, list(STEADY)), PerfSettings()).ok


def test_a_noisy_run_widens_its_own_threshold() -> None:
    noisy = [20.0] * 9 + [60.0]  # one slow request in each block of ten
    noisy = noisy * 2 + [20.0] * 10 + [20.0] * 9 + [90.0]
    spread = spread_of(noisy)
    assert spread > 0.2
    verdict = judge(result(noisy, [x * 1.6 for x in noisy]), PerfSettings())
    assert verdict.threshold == pytest.approx(1 + 3 * spread)
    assert verdict.ok  # 1.6x, within the widened threshold


def test_a_few_milliseconds_never_fail_however_large_the_ratio() -> None:
    fast = [0.5] * 40
    assert judge(result(fast, [1.5] * 40), PerfSettings()).ok  # x3, but 1 ms: below min_ms = 2


def test_a_first_deployment_is_recorded_not_judged() -> None:
    first = judge(result(None, [3 * x for x in STEADY]), PerfSettings())
    assert first.ok
    assert first.verdict == "first deployment: recorded, not judged"
    assert first.to_dict()["serving"] is None


class Recorder:
    """Clients that answer at once and record what they were asked, per connection: ``connect``
    is what ``measure`` opens a client with; one recorder per test (the ``recorder`` fixture)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, str]] = []
        self.lock = threading.Lock()
        self.opened = 0

    def connect(self) -> Client:
        with self.lock:
            self.opened += 1
            return Client(self, self.opened)


class Client:
    def __init__(self, recorder: Recorder, number: int) -> None:
        self.recorder, self.id = recorder, number

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        with self.recorder.lock:
            self.recorder.calls.append((self.id, model, version))
        return {"Y": inputs["X"]}

    def close(self) -> None:
        return None


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def test_requests_are_interleaved_per_worker_after_a_warm_up_on_both(recorder: Recorder) -> None:
    settings = PerfSettings(concurrency=2, requests=8, seconds=60)
    outcome = measure(recorder.connect, "m", ("m__private", "2"), "1", {"X": np.zeros(4)}, ["Y"], settings)
    warm = [c for c in recorder.calls if c[0] == 1]
    assert [(m, v) for _, m, v in warm] == [("m__private", "2"), ("m", "1")] * 3  # 3 warm-up pairs
    for worker in (2, 3):
        asked = [(m, v) for w, m, v in recorder.calls if w == worker]
        assert len(asked) == 8  # 4 pairs each
        for i in range(0, 8, 2):
            assert {asked[i], asked[i + 1]} == {("m__private", "2"), ("m", "1")}  # A B or B A, never A A
        assert asked[0] != asked[2]  # the order of a pair alternates
    assert len(outcome.candidate.latencies) == len(outcome.serving.latencies) == 8  # type: ignore[union-attr]


def test_a_first_deployment_asks_only_the_candidate(recorder: Recorder) -> None:
    outcome = measure(
        recorder.connect, "m", ("m", "1"), "", {"X": np.zeros(4)}, ["Y"], PerfSettings(requests=4)
    )
    assert {(m, v) for _, m, v in recorder.calls} == {("m", "1")}
    assert outcome.serving is None
    assert outcome.ok


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("perf_concurrency = 0", "perf_concurrency must be an integer >= 1, not 0"),
        ('perf_requests = "many"', "perf_requests must be an integer >= 1, not 'many'"),
        ("perf_seconds = 0", "perf_seconds must be a number of seconds within (0, 600]"),
    ],
)
def test_bad_perf_settings_are_refused_naming_the_key(tmp_path: Path, line: str, message: str) -> None:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    (tmp_path / "mlreg.toml").write_text(
        f'[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001"]\n{line}\n'
    )
    with pytest.raises(UsageError) as info:
        environment(settings, "p")
    assert message in info.value.message


def test_perf_settings_are_read_from_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    (tmp_path / "mlreg.toml").write_text(
        '[environments.p]\nstore = "/tmp/x"\ntargets = ["a:8001"]\nperf_concurrency = 4\nperf_seconds = 1.5\n'
    )
    env = environment(settings, "p")
    assert (env.perf.concurrency, env.perf.requests, env.perf.seconds) == (4, 40, 1.5)
    assert env.policy is None  # the check's keys are not a roll-out policy
