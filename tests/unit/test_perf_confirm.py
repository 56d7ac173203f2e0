"""A failed performance verdict is measured once more before it refuses anything
(pipelines/checks/perf.py ``check``): the runs are given, no server."""

from __future__ import annotations

from collections.abc import Callable

from pipelines.checks.perf import PerfResult, PerfSettings, Side, check, judge

STEADY = [20.0 + 0.1 * (i % 5) for i in range(40)]


def judged(factor: float) -> PerfResult:
    """One run: the candidate ``factor`` times the serving version's latencies, judged."""
    return judge(
        PerfResult("m", Side("2", [factor * x for x in STEADY]), Side("1", list(STEADY))), PerfSettings()
    )


def runs(*factors: float) -> tuple[Callable[[], PerfResult], list[float]]:
    done: list[float] = []

    def run() -> PerfResult:
        done.append(factors[len(done)])
        return judged(done[-1])

    return run, done


def test_a_passing_run_is_measured_once() -> None:
    run, done = runs(1.0)
    result = check(run)
    assert (result.ok, result.verdict, result.first_run, done) == (True, "ok", "", [1.0])


def test_a_slow_burst_in_one_run_is_cleared_by_the_second_with_the_first_kept() -> None:
    run, done = runs(3.0, 1.0)
    result = check(run)
    assert done == [3.0, 1.0]
    assert result.ok
    assert result.verdict == "ok on a second run (first: slower by 40.8 ms at p95)"
    assert result.first_run == judged(3.0).line()
    assert result.to_dict()["first_run"] == judged(3.0).line()


def test_a_slower_candidate_fails_both_runs_and_is_refused() -> None:
    run, done = runs(3.0, 3.0)
    result = check(run)
    assert done == [3.0, 3.0]
    assert not result.ok
    assert result.verdict == "slower by 40.8 ms at p95 (measured twice)"
    assert result.line().endswith(": slower by 40.8 ms at p95 (measured twice)")
