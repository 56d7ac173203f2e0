"""The GitOps parts that need no server: the desired-versions file (``mlreg fleet``), the bake's
verdict asked from outside a promotion (``pipelines.checks.bake``) and its HTTP face
(``mlreg.ops.analysis``), on fakes.  The real runs are tests/integration/test_gitops.py."""

from __future__ import annotations

import inspect
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlreg.ops import fleet_pins as pins
from mlreg.ops.analysis import AnalysisServer
from pipelines.checks import bake
from pipelines.core.policy import Check, Policy, judge
from pipelines.promote.environments import Environment
from pipelines.triton.metrics import Counters, Snapshot
from registry.errors import PromotionError, RegistryError, UsageError
from tests.fakes import FakeRegistry

PYTHON_MODEL = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{member}" model_version: {version}
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }} ] }}
"""


# --- the desired-versions file ---------------------------------------------------------------------


def test_a_fleet_file_round_trips_with_its_header_and_sorted_models(tmp_path: Path) -> None:
    path = tmp_path / "production.toml"
    path.write_text('# pinned by the plan job\n\nenvironment = "production"\n[models]\nz = 3\n"a.b" = "2"\n')
    read = pins.read_fleet(path)
    assert (read.environment, read.models, read.header) == (
        "production",
        {"z": "3", "a.b": "2"},
        ["# pinned by the plan job"],
    )
    assert pins.render(read) == (
        '# pinned by the plan job\n\nenvironment = "production"\n\n[models]\n"a.b" = 2\nz = 3\n'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[model]\nx = 1\n", "unknown key(s) 'model' (did you mean 'models'?)"),
        ("[models]\nx = 0\n", "x = 0 is not a positive version number"),
        ("[models]\nx = true\n", "x = True is not a positive version number"),
        ('[models]\nx = "v2"\n', "x = 'v2' is not a positive version number"),
        ('[models]\n"../x" = 1\n', "invalid model name '../x'"),
        ("environment = 3\n", "environment must be a name, not 3"),
        ("[models\n", "cannot read the desired versions"),
    ],
)
def test_a_fleet_file_that_does_not_mean_what_it_seems_is_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)):
        pins.read_fleet(path)


def registry_with(tmp_path: Path) -> FakeRegistry:
    registry = FakeRegistry(tmp_path / "registry")
    for version in ("1", "2", "3"):
        registry.add("image_model", version, PYTHON_MODEL.format(name="image_model"))
    registry.add("ens", "1", ENSEMBLE.format(name="ens", member="image_model", version=2))
    registry.tags[("ens", "1")]["member_image_model"] = "3"  # a tag that lies: the config decides
    registry.alias_map = {"image_model": {"staging": "2"}, "ens": {"staging": "1"}}
    return registry


def test_pin_writes_the_versions_named_or_an_alias_holds_and_only_registered_ones(tmp_path: Path) -> None:
    registry = registry_with(tmp_path)
    path = tmp_path / "fleet" / "production.toml"
    result = pins.pin(None, path, {}, "production", from_alias="staging", registry=registry)  # type: ignore[arg-type]
    assert pins.read_fleet(path).models == {"image_model": "2", "ens": "1"}
    assert pins.read_fleet(path).environment == "production"
    assert result.to_dict()["changes"] == [
        {"model": "ens", "from": None, "to": "1"},
        {"model": "image_model", "from": None, "to": "2"},
    ]
    again = pins.pin(None, path, {"image_model": "2"}, registry=registry)  # type: ignore[arg-type]
    assert (again.changes, again.written) == ([], False)
    with pytest.raises(RegistryError, match="pins version\\(s\\) MLflow does not hold: image_model v9"):
        pins.pin(None, path, pins.parse_pins(["image_model=9"]), registry=registry)  # type: ignore[arg-type]
    assert pins.read_fleet(path).models["image_model"] == "2"  # nothing written
    with pytest.raises(UsageError, match="ens v1 pins image_model v2, the file pins image_model = 3"):
        pins.pin(None, path, {"image_model": "3"}, registry=registry)  # type: ignore[arg-type]
    assert pins.read_fleet(path).models["image_model"] == "2"  # a file sync would refuse: not written
    with pytest.raises(UsageError, match="is for environment 'production', not 'staging'"):
        pins.pin(None, path, {"image_model": "3"}, "staging", registry=registry)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="'image_model' is not MODEL=VERSION"):
        pins.parse_pins(["image_model"])


def test_sync_refuses_a_missing_version_and_an_ensemble_pinning_other_members_before_any_change(
    tmp_path: Path,
) -> None:
    registry = registry_with(tmp_path)
    with pytest.raises(
        RegistryError, match=r"f\.toml pins version\(s\) MLflow does not hold: ens v4 .*; nope v1"
    ):
        pins._require_registered(registry, {"ens": "4", "nope": "1", "image_model": "1"}, "f.toml")
    tags = pins._require_registered(registry, {"ens": "1", "image_model": "3"}, "f.toml")
    pinned = pins.FleetFile(Path("f.toml"), "production", {"ens": "1", "image_model": "3"})
    with pytest.raises(UsageError, match="ens v1 pins image_model v2, the file pins image_model = 3"):
        pins.refuse_unreachable_pins(pinned, pins.registered_pins(registry, pinned.models, tags))
    pinned.models["image_model"] = "2"
    pins.refuse_unreachable_pins(pinned, pins.registered_pins(registry, pinned.models, tags))


def test_sync_exit_code_is_the_failed_promotions_else_drift_else_zero() -> None:
    file = pins.FleetFile(Path("f.toml"), "production", {"m": "2"})
    healthy = [{"model": "m", "pinned": "2", "alias": "2", "ok": True, "drift": []}]
    assert pins.SyncResult(file, "production", "production", False, [], health=healthy).exit_code == 0
    drifting = [{**healthy[0], "ok": False, "drift": ["x serves v1"]}]
    assert pins.SyncResult(file, "production", "production", False, [], health=drifting).exit_code == 1
    failed = {"promotions": [{"model": "m", "version": "2", "ok": False, "exit_code": 8}]}
    result = pins.SyncResult(file, "production", "production", False, [("m", "2")], failed, drifting)
    assert (result.exit_code, result.ok, result.to_dict()["moved"]) == (
        8,
        False,
        [{"model": "m", "version": "2"}],
    )


# --- the bake's verdict, asked from outside ------------------------------------------------------

A, B = "a:8001", "b:8001"


@pytest.fixture(autouse=True)
def _every_version_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every version these tests judge is READY on every replica (the fake replicas have no
    readiness to ask; tests/component/test_causes.py judges what does not serve)."""
    monkeypatch.setattr(bake, "version_ready", lambda target, model, version: True)


def environment(policy: Policy | None = None) -> Environment:
    return Environment("production", "/store", (A, B), "production", False, policy=policy)


def counters(success: float, failure: float = 0, duration_ms: float = 1.0) -> Counters:
    return Counters(success, failure, (success + failure) * duration_ms * 1000)


def scraper(*rounds: dict[str, Snapshot]) -> Any:
    """Each replica's metrics URL answers its snapshot of the current round (``sleep`` moves on)."""
    state = {"round": 0}

    def scrape(url: str) -> Snapshot:
        host = url.removeprefix("http://").split(":")[0]
        return rounds[state["round"]][host]

    def sleep(seconds: float) -> None:
        state["round"] += 1

    return scrape, sleep


def test_one_version_serving_is_judged_on_the_checks_that_need_no_old_version() -> None:
    scrape, sleep = scraper({"a": {("m", "2"): counters(30)}, "b": {("m", "2"): counters(20)}})
    found = bake.analyse(environment(), (A, B), "m", scrape=scrape, sleep=sleep)
    doc = found.to_dict()
    assert (doc["ok"], doc["version"], doc["compared_with"], doc["requests"]) == (True, "2", [], 50)
    judged = {c["name"]: c["judged"] for c in doc["checks"]}
    assert (judged["requests"], judged["failure_ratio"], judged["latency_ratio"]) == (True, True, False)
    assert [c["name"] for c in doc["checks"]] == [c.metric for c in Policy().checks]


def test_the_newest_version_is_judged_against_the_others_with_the_environments_own_checks() -> None:
    policy = Policy(checks=(Check("requests", min=5), Check("latency_ratio", max=1.5)))
    old, new = counters(100, duration_ms=1.0), counters(10, duration_ms=4.0)
    scrape, sleep = scraper({"a": {("m", "1"): old, ("m", "2"): new}, "b": {("m", "1"): old}})
    found = bake.analyse(environment(policy), (A, B), "m", scrape=scrape, sleep=sleep)
    assert (found.ok, found.failed_check, found.version, found.compared_with) == (
        False,
        "latency_ratio",
        "2",
        ["1"],
    )
    assert found.ok == judge(counters(200), new, policy).ok  # the bake's own verdict
    [requests, latency] = found.to_dict()["checks"]
    assert (requests["ok"], latency["ok"], latency["value"], latency["threshold"]) == (
        True,
        False,
        4.0,
        "latency_ratio <= 1.5",
    )
    asked = bake.analyse(environment(policy), (A, B), "m", version="1", scrape=scrape, sleep=sleep)
    assert (asked.version, asked.compared_with) == ("1", ["2"])


def test_a_window_judges_what_happened_in_it_and_a_counter_reset_fails_the_verdict() -> None:
    before = {"a": {("m", "2"): counters(100)}, "b": {("m", "2"): counters(100)}}
    scrape, sleep = scraper(before, before)
    quiet = bake.analyse(environment(), (A, B), "m", window=5, scrape=scrape, sleep=sleep)
    assert (quiet.ok, quiet.failed_check, quiet.new.requests) == (False, "requests", 0)
    reset = {"a": {("m", "2"): counters(3)}, "b": {("m", "2"): counters(150)}}
    scrape, sleep = scraper(before, reset)
    restarted = bake.analyse(environment(), (A, B), "m", window=5, scrape=scrape, sleep=sleep)
    assert (restarted.ok, restarted.failed_check) == (False, "counters")
    assert "went down from 100 to 3" in restarted.detail


def test_nothing_to_judge_a_replica_unreadable_or_a_window_too_long_are_errors_not_verdicts() -> None:
    scrape, sleep = scraper({"a": {("m", "2"): counters(3)}, "b": {}})
    with pytest.raises(bake.NotServed, match="no replica of environment 'production' reports model 'x'"):
        bake.analyse(environment(), (A, B), "x", scrape=scrape, sleep=sleep)
    with pytest.raises(bake.NotServed, match="reports m version 7; they report 2"):
        bake.analyse(environment(), (A, B), "m", version="7", scrape=scrape, sleep=sleep)
    with pytest.raises(UsageError, match="window 301 s is outside 0..300 s"):
        bake.analyse(environment(), (A, B), "m", window=301, scrape=scrape, sleep=sleep)

    def down(url: str) -> Snapshot:
        raise PromotionError(f"cannot read Triton's metrics at {url}: refused", fix="start it")

    with pytest.raises(PromotionError, match="replica a:8001: cannot read Triton's metrics at http://a:8002"):
        bake.analyse(environment(), (A,), "m", scrape=down)


# --- its HTTP face ---------------------------------------------------------------------------------


class Verdict(dict[str, Any]):
    def to_dict(self) -> dict[str, Any]:
        return dict(self)


@pytest.fixture
def server() -> Iterator[AnalysisServer]:
    """The server on a free loopback port with a judge that answers from a table."""

    def judge_now(settings: Any, env: str, model: str, version: str | None, window: float) -> Any:
        if model == "down":
            raise PromotionError("replica a:8001: cannot read Triton's metrics", fix="start it")
        if model == "leaky":  # a verdict naming a replica whose URL carries credentials
            return Verdict({"ok": True, "detail": "judged on https://u:tok3n@a:8001"})
        served: dict[str, Snapshot] = {"a": {("m", "2"): counters(20)}, "b": {}}
        scrape, sleep = scraper(served, {"a": {("m", "2"): counters(20)}, "b": {}})
        return bake.analyse(environment(), (A, B), model, version, window, scrape, sleep)

    running = AnalysisServer(("127.0.0.1", 0), None, ["production"], judge_now)  # type: ignore[arg-type]
    thread = threading.Thread(target=running.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.shutdown()
        running.server_close()
        thread.join(10)


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/v1/analysis/production/m", 200, {"ok": True, "version": "2", "failure_ratio": 0.0}),
        ("/v1/analysis/production/m?window=2", 200, {"ok": False, "failed_check": "requests"}),
        ("/v1/analysis/production/x", 404, {"ok": False}),
        ("/v1/analysis/staging/m", 404, {"error": "this server answers for production, not 'staging'"}),
        (
            "/v1/analysis/production/m?version=0",
            400,
            {"error": "version='0' is not a positive version number"},
        ),
        ("/v1/analysis/production/m?window=nan", 400, {"error": "window nan s is outside 0..300 s"}),
        ("/v1/analysis/production/m?verison=2", 400, {"error": "unknown query parameter(s) verison"}),
        ("/v1/analysis/production/down", 503, {"error": "replica a:8001: cannot read Triton's metrics"}),
        ("/v1/analysis/production/leaky", 200, {"detail": "judged on https://u:***@a:8001"}),
        ("/healthz", 200, {"ok": True, "environments": ["production"]}),
        ("/metrics", 404, {"ok": False}),
    ],
)
def test_the_server_answers_a_verdict_with_200_and_nothing_to_judge_with_an_error_code(
    server: AnalysisServer, path: str, status: int, says: dict[str, Any]
) -> None:
    got, doc = get(server.url + path)
    assert got == status, doc
    assert says.items() <= doc.items(), doc


def test_the_server_listens_on_loopback_by_default() -> None:
    from mlreg.cli.analysis import serve_cmd

    assert inspect.signature(serve_cmd).parameters["host"].default == "127.0.0.1"


# --- the commands: what a user sees ----------------------------------------------------------------


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.cli import CliRunner

    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return CliRunner()


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["fleet", "pin", "f.toml", "image_model"], 2, "error: 'image_model' is not MODEL=VERSION"),
        (["fleet", "pin", "f.toml"], 2, "error: nothing to pin"),
        (["fleet", "sync", "missing.toml"], 2, "error: missing.toml: cannot read the desired versions"),
        (["analysis", "check", "m", "--window", "999"], 2, "error: window 999 s is outside 0..300 s"),
        (["analysis", "check", "../m"], 4, "error: invalid model name '../m'"),
        (["analysis", "serve", "--env", "nope", "--port", "0"], 2, "error: unknown environment 'nope'"),
    ],
)
def test_the_commands_refuse_what_does_not_mean_what_it_seems(
    runner: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, says: str
) -> None:
    from mlreg.cli.main import app

    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    assert says in result.output


def test_sync_prints_each_failed_promotion_and_its_fix_on_stderr_with_credentials_masked(
    runner: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlreg.cli.main import app

    file = pins.FleetFile(tmp_path / "f.toml", "production", {"m": "2"})
    failed = {
        "promotions": [
            {
                "model": "m",
                "version": "2",
                "ok": False,
                "exit_code": 8,
                "error": "upload to s3://AKIAKEY:SeCrEt@bucket/models failed",
                "fix": "check https://user:tok3n@minio:9000 is up",
            }
        ]
    }

    def sync(*args: Any) -> pins.SyncResult:
        args[3].on_stage("upload", "failed", 1.0, "to s3://AKIAKEY:SeCrEt@bucket/models")  # the options
        return pins.SyncResult(file, "production", "production", False, [("m", "2")], failed, [])

    monkeypatch.setattr(pins, "sync", sync)
    result = runner.invoke(app, ["fleet", "sync", str(file.path), "--json"])
    assert result.exit_code == 8, result.output
    assert "SeCrEt" not in result.output
    assert "tok3n" not in result.output
    assert "error: m v2: upload to s3://***@bucket/models failed" in result.output
    assert "fix: check https://user:***@minio:9000 is up" in result.output
    assert "✗ upload" in result.output  # the stages print even with --json
