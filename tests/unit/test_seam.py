"""Issue 47's Check seam and issue 49's verdicts and observe mode (pipelines/core/check.py,
pipelines/promote/registered.py): the gates run the registered checks in order, a refusing verdict
of an enforced check refuses, an observed check is recorded with the same figures and refuses
nothing, ``--skip NAME`` skips that check only, and names are checked against the registry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.checks import perf, shadow
from pipelines.checks.capture import Shadow
from pipelines.checks.golden import QualityReport
from pipelines.core.check import Judging, Place, Trial, Verdict, run_checks, skip_reason
from pipelines.core.context import Options
from pipelines.core.environment import Environment
from pipelines.core.plan import Role, Step
from pipelines.promote import registered
from pipelines.promote.environments import load_environments
from registry.errors import UsageError
from registry.settings import Settings
from tests.unit.trace_files import CONFIG, write_honest


def _step() -> Step:
    return Step("m", "2", Role.MODEL, None, CONFIG, CONFIG, ["1"])


def _model(scale: float) -> Any:
    def infer(
        model: str, inputs: dict[str, np.ndarray], names: list[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        return {"Y": (inputs["X"].sum(axis=1, keepdims=True) * scale).astype(np.float32)}

    return infer


class Server:
    """A server whose candidate answers ``scale`` x what the serving version answers (sum(x))."""

    def __init__(self, scale: float) -> None:
        self.infer = _model(scale)


def _trial(report: QualityReport, candidate: float = 1.0) -> Trial:
    return Trial(
        replace(_step(), folder=Path("/nonexistent/m")),  # a registered version's (never read here)
        Settings.from_env(env={"PATH": os.environ["PATH"]}),
        report,
        loaded_as="m",
        reference="1",
        candidate=Server(candidate),
        serving=Server(1.0),
        where="canary",
        replica="t0:8001",
    )


def _replay(traces: Path, observe: frozenset[str]) -> QualityReport:
    """The shadow check on a 5x-wrong candidate, the registered way, on the captures in ``traces``."""
    report = QualityReport(where="the canary t0:8001")
    settings = Shadow(captures=str(traces), count=500)
    judging = Judging((shadow.CHECK,), observe=observe, setting=lambda name: settings)
    run_checks(judging, [_trial(report, candidate=5.0)], report)
    return report


FIGURES = ("name", "result", "subject", "measured", "sample", "value", "threshold", "noise_floor", "fix")


def test_an_observed_shadow_replay_records_the_refusal_with_the_enforced_figures_and_refuses_nothing(
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    write_honest(traces, 60)
    enforced, observed = _replay(traces, frozenset()), _replay(traces, frozenset({"shadow"}))
    [refused], [noted] = enforced.verdicts, observed.verdicts
    assert (refused.result, refused.refuses, refused.observed) == ("fail", True, False)
    assert enforced.failures == list(refused.findings)
    assert enforced.failures[0].startswith("m: shadow replay m v2 diverged from serving v1 on 60 of 60")
    assert (noted.result, noted.refuses, noted.observed) == ("fail", False, True)
    assert observed.failures == []  # the gate passes: the candidate would be promoted
    assert observed.observed == [noted.line()]
    assert "observed: would have refused" in noted.line()
    assert noted.to_dict()["note"] == "observed: would have refused"
    assert {k: getattr(noted, k) for k in FIGURES} == {k: getattr(refused, k) for k in FIGURES}
    assert (noted.sample, noted.value, noted.noise_floor) == (60, 60.0, 0.0)
    assert noted.threshold is not None
    assert noted.value is not None
    assert noted.value > noted.threshold
    timing = {"seconds", "latency_ms", "pairs_ms"}
    kept = [{k: v for k, v in s.items() if k not in timing} for s in (enforced.shadow + observed.shadow)]
    assert kept[0] == kept[1]  # the replay's own record: the same either way


@dataclass
class Recording:
    """A registered check that says what it was told (``result``: what it finds)."""

    name: str
    result: str = "pass"
    phase: str = "gate"
    where: frozenset[str] = frozenset({"canary", "scratch"})
    owns: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()
    told: list[str] = field(default_factory=list)

    def parse(self, place: Place, raw: Any) -> None:
        return None

    def judge(self, trial: Trial) -> list[Verdict]:
        self.told.append(trial.skip)
        if trial.skip:
            return [Verdict(self.name, "skipped", trial.subject, why=trial.skip)]
        found = (f"{self.name} found it wrong",) if self.result == "fail" else ()
        return [Verdict(self.name, self.result, trial.subject, findings=found)]  # type: ignore[arg-type]


def _run(checks: list[Recording], skip: frozenset[str] = frozenset(), observe: frozenset[str] = frozenset()):
    report = QualityReport()
    run_checks(Judging(tuple(checks), skip, observe), [_trial(report)], report)  # type: ignore[arg-type]
    return report


def test_a_registered_check_that_fails_refuses_and_the_later_ones_are_recorded_as_not_run() -> None:
    first, failing, later = Recording("a"), Recording("b", "fail"), Recording("c")
    report = _run([first, failing, later])
    assert report.failures == ["b found it wrong"]
    assert [v.result for v in report.verdicts] == ["pass", "fail", "skipped"]
    assert report.verdicts[2].why == "not run: an earlier check refused"
    assert later.told == []  # never judged


def test_an_inconclusive_verdict_refuses_and_an_observed_one_does_not() -> None:
    assert _run([Recording("a", "inconclusive")]).failures == ["a m v2: inconclusive"]
    observed = _run([Recording("a", "inconclusive"), Recording("b")], observe=frozenset({"a"}))
    assert observed.failures == []
    assert [v.result for v in observed.verdicts] == ["inconclusive", "pass"]  # b ran: nothing refused


def test_skip_names_one_check_and_only_that_one() -> None:
    a, b = Recording("a"), Recording("b", aliases=("--skip-b",))
    report = _run([a, b], skip=frozenset({"b"}))
    assert (a.told, b.told) == ([""], ["--skip-b"])
    assert [v.result for v in report.verdicts] == ["pass", "skipped"]
    assert skip_reason(a, frozenset({"a"})) == "--skip a"  # type: ignore[arg-type]
    assert skip_reason(a, frozenset({"b"})) == ""  # type: ignore[arg-type]


def test_the_older_flags_are_names_of_skip_and_stay_equal_to_it() -> None:
    assert Options(skip_perf=True).skip == {"perf"}
    assert Options(skip_quality=True, skip_shadow=True).skip == {"quality", "shadow"}
    given = Options(skip=frozenset({"shadow", "perf"}))
    assert (given.skip_quality, given.skip_perf, given.skip_shadow) == (False, True, True)


def test_an_unknown_check_name_is_refused_naming_the_registered_ones() -> None:
    assert registered.check_names(["perf", " shadow"]) == {"perf", "shadow"}
    with pytest.raises(UsageError, match=r"unknown check 'shadw' \(did you mean 'shadow'\?\)") as caught:
        registered.check_names(["shadw"])
    assert all(name in (caught.value.fix or "") for name in ("golden", "shadow", "perf", "quality"))
    assert registered.names()[0] == registered.GATE


def test_the_registry_is_what_the_gates_and_the_loader_read() -> None:
    canary = [c.name for c in registered.gate_checks("canary")]
    assert [n for n in canary if n in {"golden", "shadow", "perf"}] == ["golden", "shadow", "perf"]
    scratch = [c.name for c in registered.gate_checks("scratch")]
    assert [n for n in scratch if n in {"golden", "shadow", "perf"}] == ["golden", "shadow"]
    assert registered.owned_keys() >= perf.PERF_KEYS | {"shadow"}


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg"), "PATH": os.environ["PATH"]})


def test_observe_and_each_checks_settings_are_read_from_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "mlreg.toml"
    section = f'[environments.prod]\nstore = "{tmp_path / "store"}"\ntargets = ["t0:8001"]\n'
    toml.write_text(section + 'observe = ["shadow", "perf"]\nperf_requests = 12\n')
    env = load_environments(_settings(tmp_path))["prod"]
    assert env.observe == ("perf", "shadow")
    assert env.setting("perf") == perf.PerfSettings(requests=12)
    assert env.setting("shadow") is None
    assert env.setting("golden") is None
    toml.write_text(section + 'observe = ["shadw"]\n')
    with pytest.raises(UsageError, match="did you mean 'shadow'"):
        load_environments(_settings(tmp_path))
    toml.write_text(section + 'observe = ["quality"]\n')
    with pytest.raises(UsageError, match="observe names checks, not the whole gate"):
        load_environments(_settings(tmp_path))


def test_a_perf_verdict_carries_the_ratio_its_limit_and_the_sample() -> None:
    slow = perf.PerfResult("m", perf.Side("2", [30.0] * 20), perf.Side("1", [10.0] * 20))
    perf.judge(slow, perf.PerfSettings())
    found = perf.verdict("perf", slow, _trial(QualityReport()))
    assert (found.result, found.sample, found.threshold) == ("fail", 40, 1.25)
    assert found.value == pytest.approx(3.0)
    assert found.findings == (f"m: performance check failed: {slow.line()}",)
    first = perf.PerfResult("m", perf.Side("2", [30.0] * 16), None)
    perf.judge(first, perf.PerfSettings())
    assert perf.verdict("perf", first, _trial(QualityReport())).result == "skipped"  # recorded, not judged


def test_a_verdict_is_one_of_four_results_and_says_so_in_json() -> None:
    with pytest.raises(ValueError, match="pass, fail, inconclusive, skipped"):
        Verdict("x", "maybe")  # type: ignore[arg-type]
    data = Verdict("x", "pass", value=float("nan"), replicas=("a",)).to_dict()
    assert (data["value"], data["replicas"], data["refuses"]) == (None, ["a"], False)


def test_an_environment_holds_a_checks_settings_by_its_name() -> None:
    env = Environment("e", "/s", (), "e", False, checks=(("runtime", {"policy": "refuse"}),))
    assert env.setting("runtime") == {"policy": "refuse"}
    assert env.setting("shadow") is None


def test_each_bake_check_is_a_verdict_with_its_value_limit_window_and_sample() -> None:
    from pipelines.checks.bake import Analysis, CheckResult
    from pipelines.triton.metrics import Counters

    checks = [
        CheckResult("failure_ratio", 0.2, None, 0.01, "<= 0.01", False, "failure_ratio 0.2 > 0.01"),
        CheckResult("latency_ratio", None, None, 2.0, "<= 2", True, "no old requests to compare"),
        CheckResult("requests", 40.0, 10.0, None, ">= 10", True, "40 requests"),
    ]
    found = Analysis("prod", "m", "2", ["1"], ["a:8001", "b:8001"], 30.0, False, "failure_ratio", "", checks)
    found.new = Counters(success=32, failure=8)
    found.left_out = {"b:8001": "HTTP 500"}
    failed, passed_over, met = found.verdicts()
    assert (failed.name, failed.result, failed.value, failed.threshold) == (
        "bake.failure_ratio",
        "fail",
        0.2,
        0.01,
    )
    assert (failed.sample, failed.window, failed.replicas) == (40, "30 s", ("a:8001",))
    assert failed.refuses
    assert failed.fix
    assert (passed_over.result, passed_over.value) == ("skipped", None)
    assert (met.result, met.threshold) == ("pass", 10.0)
    assert found.to_dict()["verdicts"][0]["name"] == "bake.failure_ratio"


def test_each_load_guard_parses_its_own_setting_into_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "mlreg.toml"
    section = f'[environments.prod]\nstore = "{tmp_path / "store"}"\ntargets = ["t0:8001"]\n'
    toml.write_text(section + "memory_margin = 1.5\nwarmup = false\n")
    env = load_environments(_settings(tmp_path))["prod"]
    assert (env.memory_margin, env.warmup) == (1.5, False)
    assert [g.name for g in registered.GUARDS] == ["headroom", "warmup"]
    for bad, said in (
        ("memory_margin = 0.5", "memory_margin must be a number of at least 1"),
        ('warmup = "no"', "warmup must be true or false"),
    ):
        toml.write_text(section + bad + "\n")
        with pytest.raises(UsageError, match=said):
            load_environments(_settings(tmp_path))
    with pytest.raises(
        UsageError, match="unknown check 'headroom'"
    ):  # a guard keeps a replica up: never skipped
        registered.check_names(["headroom"])


def test_a_first_deployment_records_its_replay_as_skipped_never_silently(tmp_path: Path) -> None:
    report = QualityReport(where="the canary t0:8001")
    trial = replace(_trial(report), reference="")  # nothing serves m yet: the canary still answers
    settings = Shadow(captures=str(tmp_path / "traces"))
    run_checks(Judging((shadow.CHECK,), setting=lambda name: settings), [trial], report)
    [said] = report.verdicts
    assert (said.result, said.why) == ("skipped", "nothing serves this model yet")
    assert [s["verdict"] for s in report.shadow] == ["skipped: nothing serves this model yet"]


def test_the_verdicts_go_into_the_run_as_verdict_json_and_one_metric_per_figure(tmp_path: Path) -> None:
    import json

    from pipelines.promote.record import record_promotion, verdict_metrics
    from tests.unit.worlds import World

    world = World(tmp_path)
    result = world.promote("pre", "1")
    refused = Verdict(
        "shadow", "fail", "pre v1", sample=60, value=60.0, threshold=3.5, noise_floor=0.0, fix="x"
    )
    result.verdicts = [refused.to_dict(), Verdict("perf", "skipped", "pre v1", why="--skip-perf").to_dict()]
    record_promotion(world.registry, result, world.env, "promotions")
    kept = json.loads(world.registry.recorded[-1]["artifacts"]["verdict.json"])
    ours = [v for v in kept if v["name"] in {"shadow", "perf"}]  # the guards' own are added beside them
    assert [(v["name"], v["result"], v["value"], v["threshold"]) for v in ours] == [
        ("shadow", "fail", 60.0, 3.5),
        ("perf", "skipped", None, None),
    ]
    assert verdict_metrics(result.verdicts) == {
        "verdict_shadow_pre_value": 60.0,
        "verdict_shadow_pre_threshold": 3.5,
        "verdict_shadow_pre_sample": 60.0,
        "verdict_shadow_pre_noise_floor": 0.0,
    }
