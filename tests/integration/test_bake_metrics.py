"""A bake whose metrics are not counts fails, naming the replica and the metric (issue 20, item 4).

Two real tritonservers on one S3 repository (moto_server), the ``fleet`` environment of
test_fleet.py with a canary, one more wave and a bake; the second replica's metrics URL points at a
tiny HTTP server answering ``NaN`` for every request counter, with no traffic at all.  Before the
fix the bake said "bake ok: failure ratio nan over nan requests" and the promotion succeeded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pipelines.core.reports import PromotionFailed
from registry.mlflow import MlflowRegistry
from tests.integration.fleetstack import ENSEMBLE_CONFIG, FleetStack, scorer
from tests.integration.stacks import SCORER_CONFIG, s3_repository, stack_settings, tritons, unloaded_on

pytestmark = pytest.mark.integration

NAN_COUNTERS = "".join(
    f'nv_inference_request_{counter}{{model="{model}",version="{version}"}} NaN\n'
    for model, version in (("scorer", "1"), ("scorer", "2"), ("scoring", "1"))
    for counter in ("success", "failure", "duration_us")
)


class NanMetrics(BaseHTTPRequestHandler):
    """A metrics endpoint whose every request counter is NaN."""

    def do_GET(self) -> None:
        body = NAN_COUNTERS.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def nan_metrics() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NanMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, s3_server: Any, nan_metrics: str) -> Iterator[FleetStack]:
    """Two replicas; the canary's metrics are Triton's own, the other's are ``nan_metrics``."""

    root = tmp_path_factory.mktemp("bake-metrics")
    settings, _ = stack_settings(root)
    store = s3_repository(s3_server, "bake-metrics")
    with tritons(settings, root, [store] * 2, name="replica") as servers:
        (root / "work").mkdir()
        stack = FleetStack(settings, MlflowRegistry(settings), store, [], root / "work", root, servers)
        stack.urls[:] = [info.grpc_url for info, _ in servers]
        canary, other = servers[0][0], servers[1][0]
        metrics = f'"{canary.grpc_url}" = "{canary.metrics_url}", "{other.grpc_url}" = "{nan_metrics}"'
        (root / "mlreg.toml").write_text(
            f'[environments.fleet]\nstore = "{store}"\n'
            f'targets = ["{canary.grpc_url}", "{other.grpc_url}"]\ngpu = false\n'
            "canary = 1\nwaves = [100]\nbake_seconds = 1\nmin_requests = 10\n"
            f"metrics = {{ {metrics} }}\n"
        )
        yield stack


def test_nan_metrics_fail_the_bake_naming_the_replica_and_the_metric(pair: FleetStack) -> None:
    assert pair.register("scorer", SCORER_CONFIG, scorer("v1")) == "1"
    assert pair.register("scoring", ENSEMBLE_CONFIG, None, members={"scorer": "1"}) == "1"
    assert pair.promote("scoring", "1").ok  # a first deployment: nothing to bake against
    assert pair.register("scorer", SCORER_CONFIG, scorer("v2")) == "2"
    before = pair.state()
    canary, other = pair.urls
    metric = 'nv_inference_request_success{model="scorer",version="1"} is nan, not a count'
    expected = f"the bake after wave 1 of 2 failed: replica {other}: {metric}"

    with pytest.raises(PromotionFailed, match=re.escape(expected)) as info:
        pair.promote("scorer", "2")  # no traffic, min_requests = 10: NaN passed every comparison

    assert "bake ok" not in info.value.message
    assert "rolled back" in info.value.message
    for url in pair.urls:  # the canary put back, the other never touched
        assert pair.ready(url, "scorer") == ["1"], url
        assert pair.ready(url, "scoring") == ["1"], url
        assert pair.pinned(url) == 1, url
    # the store's objects, every alias, each replica's whole index and pins as they were, but for the
    # canary's index listing v2, loaded and given back (the positive control of "never loaded there")
    assert pair.state() == unloaded_on(before, canary, "scorer", "2")
    assert "2" not in pair.serving(other, "scorer")
    assert before["aliases"]["scorer"]["fleet"] == "1"
    assert "promoted_fleet" not in pair.registry.models.version("scorer", "2").tags
