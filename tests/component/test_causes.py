"""Every fix names the real cause (issue 45 items 5 and 7), one table per question, each cause
provoked for real where it can be:

- the registry: MLflow that does not answer vs a version it does not hold (``mlreg fleet``);
- a metrics endpoint: off (nothing listens) vs one that answered HTTP 500, closed the connection,
  hung, or answered 200 with something that is not Triton's metrics -- a real HTTP server on
  127.0.0.1 answering each way (``pipelines.triton.metrics.scrape``);
- the quality gate: a candidate that never loaded (its ``initialize`` failed) vs one whose outputs
  are wrong (``pipelines.checks.golden.gate_fix``);
- a lock's lease: an end in the past vs in the future, and a holder gone before its end
  (``pipelines.storage.lease``);
- the verdict of ``mlreg analysis``: a version READY nowhere is not judged, a replica whose metrics
  are garbage is named (left out under ``max_unavailable``, else the verdict refused).
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlreg.ops import fleet_pins as fleet
from pipelines.checks import bake
from pipelines.checks import golden as quality
from pipelines.checks.golden import GATE_FIX, GateFailed, QualityReport, gate_fix
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.policy import Policy
from pipelines.core.reports import PromotionFailed
from pipelines.promote import canary_gate as quality_canary
from pipelines.promote.environments import Environment
from pipelines.promote.runner import Promotion
from pipelines.rollout.staged import StagedRollout
from pipelines.storage.lease import Lease, LockInfo, when
from pipelines.triton import metrics
from registry.errors import MlregError, PromotionError, RegistryError, StorageError, TritonError, UsageError
from tests.component.conftest import SCRATCH, Background, Finished
from tests.conftest import ROOT
from tests.fakes import FakeRegistry
from tests.unit.worlds import MEMBER, World

TRITON_TEXT = (
    "# HELP nv_inference_request_success Number of successful inference requests\n"
    "# TYPE nv_inference_request_success counter\n"
    'nv_inference_request_success{model="m",version="2"} 40\n'
    'nv_inference_request_failure{model="m",version="2",reason="BACKEND"} 0\n'
    'nv_inference_request_duration_us{model="m",version="2"} 40000\n'
)
OFF_FIX = "start tritonserver with metrics on (--allow-metrics=true)"
# MLflow down for a real `mlreg fleet sync`: nothing listens on 127.0.0.1:9 (the discard port)
SYNC_DOWN = (
    "printf 'environment = \"local\"\\n[models]\\nscorer = 2\\n' > local.toml && "
    f"{Path(sys.executable).parent / 'mlreg'} fleet sync local.toml"
)
BACKGROUND = {
    "sync with MLflow down": Background(
        ["sh", "-c", SYNC_DOWN],
        cwd=SCRATCH,
        env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "MLREG_HOME": "home", "PYTHONPATH": str(ROOT)},
    ),
}


# -- the registry: unreachable vs a version it does not hold -----------------------------------------


def registry(tmp_path: Path) -> FakeRegistry:
    found = FakeRegistry(tmp_path / "registry")
    found.add("scorer", "1", 'name: "scorer"\nbackend: "python"\nmax_batch_size: 0\n')
    return found


@pytest.mark.parametrize(
    ("down", "pins", "error", "says", "fix"),
    [
        (
            False,
            {"scorer": "7"},
            RegistryError,
            "pins version(s) MLflow does not hold: scorer v7",
            "pin registered",
        ),
        (
            True,
            {"scorer": "1"},
            RegistryError,
            "MLflow (memory://registry) is unreachable",
            "start the tracking",
        ),
    ],
)
def test_the_registry_cause_is_named(
    tmp_path: Path, down: bool, pins: dict[str, str], error: type[Exception], says: str, fix: str
) -> None:
    found = registry(tmp_path)
    found.down = down
    path = tmp_path / "production.toml"
    with pytest.raises(error, match=re.escape(says)) as raised:
        fleet.pin(None, path, pins, "production", registry=found)  # type: ignore[arg-type]
    assert str(raised.value.fix).startswith(fix)  # type: ignore[attr-defined]
    assert not path.exists()  # nothing written either way
    if down:
        assert "does not hold" not in raised.value.message  # type: ignore[attr-defined]


def test_a_lookup_that_fails_while_mlflow_stops_answering_is_unreachable_not_missing(tmp_path: Path) -> None:
    found = registry(tmp_path)
    found.fail_on = {"version_tags"}  # the lookup fails; then MLflow no longer answers at all
    original = found.ping
    found.ping = lambda: (setattr(found, "down", True), original())[1]  # type: ignore[method-assign]
    with pytest.raises(RegistryError, match="is unreachable, so the versions f.toml pins cannot be checked"):
        fleet._require_registered(found, {"scorer": "1"}, "f.toml")


def test_fleet_sync_with_mlflow_down_says_mlflow_is_unreachable(background: Finished) -> None:
    done = background("sync with MLflow down")
    assert done.returncode == RegistryError.exit_code, done.stdout + done.stderr
    assert "error: MLflow (http://127.0.0.1:9) is unreachable" in done.stderr, done.stderr
    assert "does not hold" not in done.stderr
    assert "fix: start the tracking server or check MLFLOW_TRACKING_URI" in done.stderr


# -- a metrics endpoint: off vs failing, closed, hung, garbage --------------------------------------


class Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the name http.server calls
        path = self.path.strip("/")
        if path == "close":  # took the connection, answers nothing
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if path == "slow":
            time.sleep(1.5)
        status, body = {
            "ok": (200, TRITON_TEXT),
            "error": (500, "internal error\n"),
            "garbage": (200, "<html>hello</html>\n"),
            "empty": (200, ""),
            "other": (200, "# TYPE node_load1 gauge\nnode_load1 0.5\n"),
            "nan": (200, TRITON_TEXT + 'nv_inference_request_success{model="x",version="1"} lots\n'),
            "slow": (200, TRITON_TEXT),
        }[path]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
        pass


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the connection this test closed on purpose ("close")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = Quiet(("127.0.0.1", 0), Answers)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends: nothing listens


@pytest.mark.parametrize(
    ("path", "status", "says", "fix"),
    [
        ("off", "off", "refused the connection (nothing listens there)", OFF_FIX),
        (
            "error",
            "http-error",
            "answered HTTP 500 (Internal Server Error)",
            "the metrics endpoint is on but failing",
        ),
        (
            "close",
            "closed",
            "closed the connection without a complete answer",
            "took the connection and dropped it",
        ),
        ("slow", "timeout", "did not answer within 0.5 s", "the replica is hung or overloaded"),
        (
            "garbage",
            "not-triton",
            "answered 200 with 19 bytes, none of them an nv_ metric",
            "Triton's own metrics",
        ),
        ("empty", "not-triton", "answered 200 with an empty body", "Triton's own metrics"),
        ("other", "not-triton", "none of them an nv_ metric", "Triton's own metrics"),
        ("nan", "not-triton", "are not counts", "answers something else"),
    ],
)
def test_a_metrics_endpoint_that_fails_is_named_by_its_real_cause(
    endpoint: str, path: str, status: str, says: str, fix: str
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics" if path == "off" else f"{endpoint}/{path}"
    with pytest.raises(PromotionError, match=re.escape(says)) as raised:
        metrics.scrape(url, timeout=0.5)
    assert raised.value.context["status"] == status
    assert url in raised.value.message
    assert fix in str(raised.value.fix)
    assert (OFF_FIX in str(raised.value.fix)) == (status == "off")  # "turn metrics on" only when off


def test_triton_s_own_metrics_are_read(endpoint: str) -> None:
    found = metrics.scrape(f"{endpoint}/ok")
    assert (found[("m", "2")].success, found[("m", "2")].duration_us) == (40.0, 40000.0)


# -- the quality gate: never loaded vs wrong outputs ------------------------------------------------


@pytest.mark.parametrize(
    ("report", "fix"),
    [
        (
            QualityReport(
                failures=["failed to load 'scorer' version 9: initialize raised"], not_loaded=["scorer v9"]
            ),
            "scorer v9 never loaded (its initialize, its files or its config failed: Triton's reason is "
            "above), so no output was judged",
        ),
        (QualityReport(failures=["scorer/OUT: shape (2,), config says (3,)"], checked=["scorer"]), GATE_FIX),
    ],
)
def test_the_gate_says_a_candidate_never_loaded_apart_from_wrong_outputs(
    report: QualityReport, fix: str
) -> None:
    assert gate_fix(report).startswith(fix)
    assert str(GateFailed(report).fix).startswith(fix)
    if report.not_loaded:
        assert "outputs on the golden inputs are not sane" not in str(GateFailed(report).fix)


# -- a lock's lease: the past vs the future ---------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("expires", "owner", "says", "not_says"),
    [
        (NOW - 60, "h@elsewhere:1", f"lease ran out at {when(NOW - 60)}", "lease until"),
        (NOW + 600, "h@elsewhere:1", f"lease until {when(NOW + 600)}", "ran out"),
        (
            NOW + 600,
            f"h@{socket.gethostname()}:999999999",
            "its holder, process 999999999 of this machine, no longer runs",
            "ran out",
        ),
    ],
)
def test_a_lock_says_whether_its_lease_ended_or_ends(
    expires: float, owner: str, says: str, not_says: str
) -> None:
    held = LockInfo(owner, expires, "scorer", "t", NOW - 100, NOW, "store")
    assert says in held.describe()
    assert not_says not in held.describe()
    assert held.stale == (expires < NOW or "no longer runs" in says)


@pytest.mark.parametrize(
    ("end", "why", "line"),
    [
        (NOW - 5, f"its lease ran out at {when(NOW - 5)}", f"lease ran out at {when(NOW - 5)}"),
        (
            NOW + 30,
            "it was not renewed within this process's own deadline for it "
            f"(its lease ends at {when(NOW + 30)} (in 30 s))",
            f"not renewed in time (its lease ends at {when(NOW + 30)} (in 30 s))",
        ),
    ],
)
def test_a_holder_that_stops_says_whether_its_lease_ran_out(end: float, why: str, line: str) -> None:
    lease = Lease(None, "k", "scorer", "me@here:1", 60)  # type: ignore[arg-type]  # not started: no store call
    assert lease._ended(end, NOW) == (why, line)


# -- mlreg analysis: only what serves is judged, no replica left out silently ----------------------

A, B = "a:8001", "b:8001"


def _env(endpoint: str, a: str, b: str, max_unavailable: int = 0) -> Environment:
    metrics_urls = ((A, f"{endpoint}/{a}"), (B, f"{endpoint}/{b}"))
    policy = Policy(max_unavailable=max_unavailable, metrics=metrics_urls)
    return Environment("production", "/store", (A, B), "production", False, policy=policy)


def test_a_version_ready_nowhere_is_not_judged(endpoint: str) -> None:
    """After a failed canary load the candidate's counters remain, but it serves nowhere."""
    asked: list[tuple[str, str, str]] = []

    def unavailable(target: str, model: str, version: str) -> bool:
        asked.append((target, model, version))
        return False

    with pytest.raises(bake.NotServed, match=r"m v2 is not READY on any replica .*a:8001: not READY"):
        bake.analyse(_env(endpoint, "ok", "ok"), (A, B), "m", ready=unavailable)
    assert sorted(asked) == [(A, "m", "2"), (B, "m", "2")]
    found = bake.analyse(_env(endpoint, "ok", "ok"), (A, B), "m", ready=lambda t, m, v: t == A)
    assert (found.ok, found.ready_on, found.to_dict()["ready_on"]) == (True, [A], [A])


def test_a_replica_answering_garbage_fails_the_check_naming_it(endpoint: str) -> None:
    with pytest.raises(
        PromotionError, match=r"replica b:8001: .*/garbage does not answer Triton's metrics"
    ) as raised:
        bake.analyse(_env(endpoint, "ok", "garbage"), (A, B), "m", ready=lambda t, m, v: True)
    assert "Triton's own metrics" in str(raised.value.fix)


def test_a_replica_answering_garbage_is_left_out_under_max_unavailable_and_named(endpoint: str) -> None:
    found = bake.analyse(_env(endpoint, "ok", "error", 1), (A, B), "m", ready=lambda t, m, v: True)
    doc = found.to_dict()
    assert list(doc["left_out"]) == [B]
    assert "answered HTTP 500" in doc["left_out"][B]
    assert f"left out under max_unavailable = 1: {B}" in doc["detail"]
    assert doc["requests"] == 40  # judged on the replica that could be read
    with pytest.raises(PromotionError, match="more than max_unavailable = 1"):  # two: one too many
        bake.analyse(_env(endpoint, "garbage", "error", 1), (A, B), "m", ready=lambda t, m, v: True)


def test_the_analysis_document_is_json(endpoint: str) -> None:
    found = bake.analyse(_env(endpoint, "ok", "ok"), (A, B), "m", ready=lambda t, m, v: True)
    assert json.loads(json.dumps(found.to_dict()))["left_out"] == {}


def test_a_missing_key_is_a_usage_error_not_a_crash() -> None:
    with pytest.raises(UsageError, match="window 301 s is outside"):
        bake.check_window(301)


def test_a_canary_answering_garbage_fails_the_bake_naming_it(endpoint: str) -> None:
    """The bake reads the same way (``metrics.scrape``): a canary whose metrics answer 200 with
    garbage is no longer an empty snapshot the other replicas decide without -- the bake's read of
    the replicas fails naming it (before the canary moves, or as the bake after a wave)."""
    canary, other = "r0:8001", "r1:8001"
    urls = {canary: f"{endpoint}/garbage", other: f"{endpoint}/ok"}
    policy = Policy(metrics=tuple(urls.items()), bake_seconds=5)
    rollout = StagedRollout([canary, other], None, policy)  # type: ignore[arg-type]  # reads only
    with pytest.raises(PromotionError) as raised:
        rollout._scrape_all([canary, other])
    assert raised.value.message.startswith(
        f"replica {canary}: {endpoint}/garbage does not answer Triton's metrics"
    )
    assert "answered 200 with 19 bytes, none of them an nv_ metric" in raised.value.message
    assert rollout._scrape_all([other])[other][("m", "2")].success == 40.0  # Triton's own: read


def test_a_candidate_that_fails_to_load_on_the_canary_is_said_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary gate for real (a real Fleet and undo log over the fake replicas of worlds.py):
    net v2's load fails on the canary -- its ``initialize`` raised -- and the promotion's fix says
    it never loaded, not that its outputs are wrong; nothing stays changed."""
    # the gate's prefetch of great_expectations (2-5 s in a thread) serves checks this load never
    # reaches: not started, so no import outlives the test
    monkeypatch.setattr(quality_canary, "warm_up", threading.Thread)
    monkeypatch.setattr(quality, "warm_up", threading.Thread)  # the planning's prefetch of it too
    world = World(tmp_path)
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    assert world.promote("net", "1").ok
    world.fleet.fail_load.add(("net", "2", "t0:8001"))
    promotion = Promotion(world.settings, world.env, world.registry, Options(), connect=world.fleet.connect)
    with pytest.raises(PromotionFailed) as failed:
        promotion.run("net", "2")
    assert "net v2 never loaded" in str(failed.value.fix), failed.value.fix
    assert "outputs on the golden inputs are not sane" not in str(failed.value.fix)
    assert "t0:8001: model 'net' version 2 failed to load" in failed.value.message
    assert world.registry.alias_map["net"]["test"] == "1"  # the alias never moved
    assert serving_versions(world.config("net")) == ["1"]  # the store serves v1 still


# -- a candidate's load on the canary: never loaded only when Triton ran it and refused it (F5) -----

DEADLINE_FIX = "raise load_timeout in mlreg.toml; the rollback queues the load of what served behind it"
REACH_FIX = "check that tritonserver runs and listens there ('mlreg stack status')"
KEY_FIX = "set MLREG_CONTROL_KEY to the replica's control key"
FENCED_FIX = "restart that replica (its memory comes back), then promote again"
HEADROOM_FIX = "free memory on t0:8001 or lower the candidate's instance count"
LOCK_FIX = "wait for that promotion to finish"


@pytest.mark.parametrize(
    ("error", "never", "fix"),
    [
        (TritonError("t0: model 'net' version 2 failed to load", status="StatusCode.INTERNAL"), True, ""),
        (TritonError("load failed: bad config", status="StatusCode.INVALID_ARGUMENT"), True, ""),
        (
            TritonError("t0: the load of net v2 did not finish", fix=DEADLINE_FIX, status="load-deadline"),
            False,
            DEADLINE_FIX,
        ),
        (
            TritonError(
                "load failed on t0: connection refused", fix=REACH_FIX, status="StatusCode.UNAVAILABLE"
            ),
            False,
            REACH_FIX,
        ),
        (
            TritonError(
                "replica t0 refused the load call: not authorised", fix=KEY_FIX, status="unauthorised"
            ),
            False,
            KEY_FIX,
        ),
        (
            PromotionError("t0:8001 is fenced off for this promotion: out of memory", fix=FENCED_FIX),
            False,
            FENCED_FIX,
        ),
        (
            PromotionError("t0:8001 has 1.0 GiB free, net v2 needs 3.0 GiB", fix=HEADROOM_FIX),
            False,
            HEADROOM_FIX,
        ),
        (StorageError("model 'net' is locked by someone else", fix=LOCK_FIX), False, LOCK_FIX),
    ],
    ids=[
        "refused",
        "bad-config",
        "load-deadline",
        "unreachable",
        "missing-key",
        "fenced",
        "headroom",
        "lock-lost",
    ],
)
def test_a_canary_load_that_fails_names_its_own_cause(error: MlregError, never: bool, fix: str) -> None:
    """Before: every error from the canary's load said 'net v2 never loaded ... register a new
    version' -- a headroom refusal, an unreachable or fenced replica, a missing key, a load still
    running past its deadline.  Now only Triton's refusal of the load says so (by type and
    status); the others keep their own fix."""
    report = QualityReport(where="the canary t0:8001")
    quality_canary.load_failed(report, "net", "2", error)
    report.failures.append(error.message)
    assert report.not_loaded == (["net v2"] if never else [])
    said = gate_fix(report)
    assert str(GateFailed(report).fix) == said
    if never:
        assert said.startswith("net v2 never loaded")
    else:
        assert said == fix
        assert "never loaded" not in said
        assert "register a new version" not in said
        assert GATE_FIX not in said


def test_a_version_is_judged_only_where_it_is_ready_and_read(endpoint: str) -> None:
    """The reviewer's case (F6): under max_unavailable = 1, m v2 is READY only on B, whose metrics
    answer HTTP 500, and A still exports v2's counters from an earlier load.  Before: judged 'ok'
    from A's counters.  Now refused, naming B and why; and where both are read, only the replica
    that serves v2 counts (40 requests, not A's 40 on top)."""
    on_b = lambda t, m, v: t == B  # noqa: E731
    with pytest.raises(
        bake.NotServed,
        match=r"m v2 is READY only on replicas whose metrics could not be read \(b:8001: .*HTTP 500",
    ):
        bake.analyse(_env(endpoint, "ok", "error", 1), (A, B), "m", ready=on_b)
    found = bake.analyse(_env(endpoint, "ok", "ok", 1), (A, B), "m", ready=on_b)
    assert found.ready_on == [B]
    assert found.to_dict()["requests"] == 40  # B's own; before: 80 (A's leftovers summed in)
    both = bake.analyse(_env(endpoint, "ok", "ok", 1), (A, B), "m", ready=lambda t, m, v: True)
    assert both.to_dict()["requests"] == 80
