"""Swaps that cannot break a replica (issue 34), on two real tritonservers reading one local store.

Python-backend models of this module's own: ``scorer`` (Y = X times its version) swapped back and
forth, ``batcher`` (fails when one execute holds more than its version's limit of rows: the
batch-dependent failure a batch-1 gate never sees) and ``sleeper`` (version 2's ``initialize``
never returns). In file order: ten swaps that never re-create the serving version, and the
negative control that does; a candidate failing only at its peak batch refused before traffic
while the serving version answers batch 8, and the same candidate without the check failing
batch 8; a footprint measured on the real server's gauges and recorded in MLflow, then a replica
whose (stand-in) gauges say it is short refusing the load before anything is sent; the first
replica SIGKILLed during a load and restarted on its ports, given back the serving version by the
undo (issue 45); a load past its deadline taken back: the serving version's load queued behind it,
so the late version never takes traffic when it lands (issue 45); a load that never finishes named
at its deadline, shown LOADING by status, the next promotion refused there and the other replica
untouched (last: that replica stays stuck until the module stops it).

Triton's own ``model_warmup`` refusing such a candidate is not run here: on 2.51's python backend a
failing warmup sample crashes the whole server about one load in four (every time when the model
answers error responses), so mlreg sends the peak batch itself for python models
(``warmups.PYTHON_WARMUP``); the derived warmup of other backends is unit-tested (test_warmup.py).
"""

from __future__ import annotations

import http.server
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.ops.status import model_status
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed, PromotionResult
from pipelines.core.undo import UndoLog
from pipelines.devstack import local_triton
from pipelines.fleet.fleet import Change, Fleet
from pipelines.fleet.replicas import triton_connector
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.errors import MlregError, PromotionError
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.integration.stacks import (
    SCORER_CONFIG,
    SCORER_MODEL,
    refusal_state,
    register_model,
    stack_settings,
    triton_index,
    tritons,
    unloaded_on,
)

pytestmark = pytest.mark.integration

SWAPS = 10  # the suite's budget; benchmarks/swaps.py runs 20 (20 instance starts measured)
BATCHER_CONFIG = """name: "batcher"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
BATCHER = """
import numpy as np
import triton_python_backend_utils as pb_utils

LIMIT = {limit}  # rows one execute may hold: above it, this version fails every request


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        rows = sum(x.shape[0] for x in xs)
        if rows > LIMIT:  # raised: 2.51 segfaults when a warmup sample gets error *responses*
            raise pb_utils.TritonModelException(f"batcher: {{rows}} rows in one execute")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]) for x in xs]
"""
SLEEPER_CONFIG = SCORER_CONFIG.replace('"scorer"', '"sleeper"')
SLEEPER = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        while HANGS:
            time.sleep(1)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy())]) for r in requests]
"""

LATE_CONFIG = SCORER_CONFIG.replace('"scorer"', '"late"')
LATE = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(SLEEPS)  # past the 'late' environment's load_timeout (3 s), then it finishes
        self.factor = float(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy() * self.factor)]) for r in requests]
"""
LATE_SLEEP = 8


class Swaps:
    def __init__(
        self, settings: Settings, root: Path, urls: list[str], logs: list[Path], metrics: list[str]
    ) -> None:
        self.settings, self.root, self.urls, self.logs, self.metrics = settings, root, urls, logs, metrics
        self.servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
        self.registry = MlflowRegistry(settings)
        self.store = root / "store"
        self.work = root / "work"
        self.work.mkdir()

    def register(self, model: str, config: str, source: str) -> str:
        folder = self.work / f"{model}-{len(list(self.work.iterdir()))}"
        return register_model(self.registry, folder, model, config, {"model.py": source})

    def promote(self, env: str, model: str, version: str) -> PromotionResult:
        options = Options(skip_quality=True)
        return Promotion(self.settings, environment(self.settings, env), self.registry, options).run(
            model, version
        )

    def starts(self, url_index: int, model: str) -> int:
        """Instances of ``model`` the replica initialised so far (any version), from its log."""
        return self.logs[url_index].read_text(errors="replace").count(f"ModelInstanceInitialize: {model}_")


@pytest.fixture(scope="module")
def swaps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swaps]:
    root = tmp_path_factory.mktemp("swaps")
    settings, _ = stack_settings(root)
    (root / "store").mkdir()
    # locked as mlreg's replicas are: 2.51 crashes (SIGSEGV) when a warmup fails on a load that
    # carries a header an open server does not expect (seen here; a locked one refuses the load
    # cleanly -- as long as the model raises: error responses to a warmup sample crash it too)
    key = os.environ["MLREG_CONTROL_KEY"]
    with tritons(settings, root, [root / "store"] * 2, name="replica", control_key=key) as servers:
        urls = [info.grpc_url for info, _ in servers]
        one, pair = f'targets = ["{urls[0]}"]', f'targets = ["{urls[0]}", "{urls[1]}"]'
        store = f'store = "{root / "store"}"\ngpu = false'
        (root / "mlreg.toml").write_text(
            f"[environments.one]\n{store}\n{one}\n"
            f"[environments.cold]\n{store}\n{one}\nwarmup = false\n"
            f"[environments.pair]\n{store}\n{pair}\nload_timeout = 6\n"
            f"[environments.late]\n{store}\n{one}\nload_timeout = 3\n"
            f"[environments.stagedlate]\n{store}\n{pair}\nload_timeout = 3\ncanary = 1\nwaves = [100]\n"
            "bake_seconds = 0\n"
        )
        logs = [Path(info.log_path) for info, _ in servers]
        swaps = Swaps(settings, root, urls, logs, [info.metrics_url for info, _ in servers])
        swaps.servers = servers
        yield swaps


def test_consecutive_swaps_never_re_create_the_serving_version_and_a_changed_override_does(
    swaps: Swaps,
) -> None:
    first = swaps.register("scorer", SCORER_CONFIG, f"# 1\n{SCORER_MODEL}")
    second = swaps.register("scorer", SCORER_CONFIG, f"# 2\n{SCORER_MODEL}")
    swaps.promote("one", "scorer", first)
    guard = swaps.store / "scorer" / first / "__pycache__"
    assert guard.read_bytes() == b""  # the stub could write no cache into the served folder
    before = swaps.starts(0, "scorer")
    notes: list[str] = []
    for index in range(SWAPS):
        version = second if index % 2 == 0 else first
        notes.extend(swaps.promote("one", "scorer", version).notes)
        assert triton_index(swaps.urls[0], "scorer").get(version) == "READY"
    assert swaps.starts(0, "scorer") == before + SWAPS  # each swap started the new version only
    assert not [n for n in notes if "re-created" in n]
    assert sorted(p.name for p in (swaps.store / "scorer" / first).iterdir()) == [
        ".mlreg-manifest.json",
        "__pycache__",
        "model.py",
    ]

    # the negative control: a load whose config adds a field re-creates the serving version, and
    # the fleet's check (its statistics restarted) says so
    serving = "1" if SWAPS % 2 == 0 else "2"
    with TritonControl(swaps.urls[0]) as triton:
        triton.infer("scorer", {"X": np.ones(4, np.float32)}, ["Y"], version=serving)
    text = open_store(swaps.store).read_config("scorer") or ""
    changed = text + 'parameters { key: "note" value { string_value: "other" } }\n'
    store = open_store(swaps.store)
    # a bare Fleet loads only what this run checked against MLflow's digest (issue 44)
    store.versions.verify_version(
        "scorer", serving, swaps.registry.models.version_tags("scorer", serving)["artifact_digest"]
    )
    fleet = Fleet(
        store, swaps.urls[:1], triton_connector(swaps.settings), 60, undo=UndoLog(False, store.session)
    )
    with fleet:
        starts = swaps.starts(0, "scorer")
        fleet.move(swaps.urls[0], Change("scorer", changed, (serving,)))
        assert swaps.starts(0, "scorer") == starts + 1  # made anew
        assert list(fleet.recreated) == [(swaps.urls[0], "scorer", serving)]
        assert "re-created scorer v" + serving in fleet.recreation_notes()[0]
        fleet.move(swaps.urls[0], Change("scorer", text, (serving,)))  # the store's config again


def _batch8(url: str, version: str, stop: threading.Event, outcome: dict[str, Any]) -> None:
    """Batch-8 requests to ``version`` of ``batcher`` until ``stop``: answers and failures counted."""
    with TritonControl(url) as triton:
        while not stop.is_set():
            try:
                triton.infer("batcher", {"X": np.ones((8, 4), np.float32)}, ["Y"], version=version)
                outcome["ok"] += 1
            except MlregError as exc:
                outcome["failed"].append(exc.message)


def test_a_candidate_failing_only_at_its_peak_batch_is_refused_before_traffic_with_no_failed_request(
    swaps: Swaps,
) -> None:
    """A python model gets mlreg's own peak-batch request, by version, before any traffic (Triton
    2.51's warmup of a python model can crash the server when its sample fails: warmups.PYTHON_WARMUP);
    the serving version answers batch 8 throughout. The control: without it (``warmup = false``)
    the candidate serves and fails batch-8 requests."""
    good = swaps.register("batcher", BATCHER_CONFIG, BATCHER.format(limit=64))
    bad = swaps.register("batcher", BATCHER_CONFIG, BATCHER.format(limit=4))  # fails above 4 rows
    swaps.promote("one", "batcher", good)
    before = refusal_state(swaps.store, swaps.urls, swaps.registry)
    stop, outcome = threading.Event(), {"ok": 0, "failed": []}
    client = threading.Thread(target=_batch8, args=(swaps.urls[0], good, stop, outcome))
    client.start()
    try:
        with pytest.raises(PromotionFailed, match=f"batcher v{bad} fails at its peak batch of 8") as refused:
            swaps.promote("one", "batcher", bad)
    finally:
        stop.set()
        client.join(timeout=60)  # its request in flight answers within the client's own timeout
    assert not client.is_alive(), "the batch-8 client did not stop within 60 s"
    assert "rows in one execute" in refused.value.message  # the model's own reason
    assert outcome["failed"] == []  # the serving version answered batch 8 throughout
    assert outcome["ok"] > 0
    after = refusal_state(swaps.store, swaps.urls, swaps.registry)
    assert after == unloaded_on(before, swaps.urls[0], "batcher", bad)  # its load taken back, nothing else

    swaps.promote("cold", "batcher", bad)  # the control: no peak check
    assert triton_index(swaps.urls[0], "batcher").get(bad) == "READY"
    with TritonControl(swaps.urls[0]) as triton, pytest.raises(MlregError, match="rows in one execute"):
        triton.infer("batcher", {"X": np.ones((8, 4), np.float32)}, ["Y"])
    swaps.promote("one", "batcher", good)  # back to the version that serves batch 8


class _Gauges(http.server.BaseHTTPRequestHandler):
    """A stand-in for Triton's metrics endpoint -- only its memory gauges, which this CPU machine's
    real server reports for the whole host (gigabytes free): here, the host nearly full."""

    text = ""

    def do_GET(self) -> None:  # http.server calls it by this name
        body = self.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_footprint_measured_on_the_real_server_is_recorded_and_a_replica_short_of_it_refuses_the_load(
    swaps: Swaps,
) -> None:
    """The first load of a version is measured on Triton's own nv_cpu_memory_used_bytes and the
    figure recorded in MLflow; a replica whose gauges say less is free than that footprint x the
    margin refuses the next load before anything is sent; with enough free, it passes."""
    pair = "targets = [" + ", ".join(f'"{url}"' for url in swaps.urls) + "]"
    real = ", ".join(f'"{url}" = "{m}"' for url, m in zip(swaps.urls, swaps.metrics, strict=True))
    # 1 GiB the stub holds once the version is loaded: a footprint well above the host's noise (the
    # gauge is the whole host's: 128 MiB read as 0 once in a 3-worker run, another worker's stack
    # freeing its TensorFlow stubs, ~0.5 GiB each, while this load was measured)
    ballast = "_BALLAST = bytes([1]) * (1 << 30)  # touched pages: in the host's used memory\n"
    scorer = swaps.register("scorer", SCORER_CONFIG, f"# measured\n{ballast}{SCORER_MODEL}")
    (swaps.root / "mlreg.toml").write_text(
        (swaps.root / "mlreg.toml").read_text()
        + f'[environments.measured]\nstore = "{swaps.store}"\ngpu = false\n{pair}\n'
        f"metrics = {{ {real} }}\n"
    )
    result = swaps.promote("measured", "scorer", scorer)
    tags = swaps.registry.models.version_tags("scorer", scorer)
    assert tags["memory_footprint_kind"] == "host"
    measured = int(tags["memory_footprint_bytes"])
    assert measured > 0, tags  # a footprint was measured (0 is what a gauge that did not move records)
    checks = [c for c in result.to_dict()["headroom"]["checks"] if c.get("model") == "scorer"]
    assert {c["replica"] for c in checks} == set(swaps.urls)  # every replica checked before its load
    assert all(c["ok"] for c in checks), checks

    # the same version's footprint known (recorded above): a host with less free than it needs
    swaps.registry.models.set_version_tag("scorer", scorer, "memory_footprint_bytes", str(512 * 2**20))
    again = swaps.register("scorer", SCORER_CONFIG, f"# measured again\n{SCORER_MODEL}")
    swaps.registry.models.set_version_tag("scorer", again, "memory_footprint_bytes", str(512 * 2**20))
    swaps.registry.models.set_version_tag("scorer", again, "memory_footprint_kind", "host")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gauges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    gb = 2**30
    try:
        stand_in = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        (swaps.root / "mlreg.toml").write_text(
            (swaps.root / "mlreg.toml").read_text()
            + f'[environments.short]\nstore = "{swaps.store}"\ngpu = false\n{pair}\n'
            + "metrics = { "
            + ", ".join(f'"{url}" = "{stand_in}"' for url in swaps.urls)
            + " }\n"
        )
        _Gauges.text = (
            f"nv_cpu_memory_total_bytes {8 * gb}\nnv_cpu_memory_used_bytes {8 * gb - 100 * 2**20}\n"
        )
        before = refusal_state(swaps.store, swaps.urls, swaps.registry)
        with pytest.raises(PromotionFailed, match="MiB") as refused:
            swaps.promote("short", "scorer", again)
        assert swaps.urls[0] in refused.value.message
        assert "host" in refused.value.message
        assert refusal_state(swaps.store, swaps.urls, swaps.registry) == before  # nothing was sent

        _Gauges.text = f"nv_cpu_memory_total_bytes {8 * gb}\nnv_cpu_memory_used_bytes {2 * gb}\n"
        swaps.promote("short", "scorer", again)
        assert triton_index(swaps.urls[0], "scorer").get(again) == "READY"
    finally:
        server.shutdown()
        server.server_close()


def test_a_replica_killed_during_its_load_and_restarted_is_given_back_the_serving_version(
    swaps: Swaps,
) -> None:
    """Issue 45 item 3, on a real tritonserver: the first replica is SIGKILLed while it loads the
    candidate (its initialize takes 4 s) and started again on the same ports, serving nothing
    (explicit mode); the promotion fails, its undo waits for the replica and loads the serving
    version there again (before: the rollback "failed" and the replica came back serving nothing)."""
    serving = swaps.register("crashy", LATE_CONFIG.replace('"late"', '"crashy"'), "SLEEPS = 0\n" + LATE)
    candidate = swaps.register("crashy", LATE_CONFIG.replace('"late"', '"crashy"'), "SLEEPS = 4\n" + LATE)
    swaps.promote("one", "crashy", serving)
    info, process = swaps.servers[0]
    restarted: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []

    def crash_and_restart() -> None:  # SIGKILL mid-load, then its supervisor starts it again
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline and triton_index(info.grpc_url, "crashy").get(candidate) != "LOADING"
        ):
            time.sleep(0.1)
        os.killpg(info.pid, signal.SIGKILL)
        process.wait(timeout=30)
        local_triton.remove_shm(info.shm_prefix)
        time.sleep(3)  # its supervisor's restart delay (a pod's back-off): the undo meets it down
        ports = (info.grpc_port, info.http_port, info.metrics_port)
        restarted.append(
            local_triton.start_server(
                swaps.store,
                swaps.root / "replica-0-again",
                swaps.settings.backends_source,
                ports=ports,
                control_key=os.environ["MLREG_CONTROL_KEY"],
            )
        )

    killer = threading.Thread(target=crash_and_restart)
    killer.start()
    try:
        with pytest.raises(PromotionFailed) as failed:
            swaps.promote("one", "crashy", candidate)
    finally:
        killer.join(timeout=120)
        swaps.servers[0] = restarted[0] if restarted else swaps.servers[0]  # the module stops it
    message = failed.value.message
    assert restarted, "the replica was not restarted"
    assert "the rollback failed" not in message, message
    assert f"restored crashy -> v{serving}" in message, message
    assert f"{info.grpc_url} dropped during the promotion and came back (a restart)" in message, message
    assert triton_index(info.grpc_url, "crashy") == {serving: "READY"}  # the restarted replica
    with TritonControl(info.grpc_url) as triton:
        answer = triton.infer("crashy", {"X": np.ones(4, np.float32)}, ["Y"])
    assert answer["Y"].tolist() == [float(serving)] * 4
    assert serving_versions(open_store(swaps.store).read_config("crashy") or "") == [serving]


def test_a_load_past_its_deadline_is_taken_back_and_never_takes_traffic_when_it_lands(swaps: Swaps) -> None:
    """Issue 45 item 1: the candidate's initialize outlives load_timeout; the promotion fails, the
    serving version's load is queued behind the late one, and once the late load ends the replica
    still answers unversioned requests with the serving version (before: the late version, READY,
    took them and the serving one was unloaded)."""
    serving = swaps.register("late", LATE_CONFIG, "SLEEPS = 0\n" + LATE)
    late = swaps.register("late", LATE_CONFIG, f"SLEEPS = {LATE_SLEEP}\n" + LATE)
    swaps.promote("one", "late", serving)
    url = swaps.urls[0]
    with pytest.raises(PromotionFailed) as failed:
        swaps.promote("late", "late", late)
    message = failed.value.message
    assert f"did not finish within 3s; v{late} is still LOADING" in message, message
    assert (
        f"the load of late v{late} is still running on {url}; queued the load of v{serving} behind it "
        "(Triton runs a model's loads in turn); "
    ) in message, message
    assert f"; confirmed: {url} serves late v{serving}" in message or "; not confirmed (" in message, message
    assert "the rollback failed" not in message, message
    deadline = time.monotonic() + LATE_SLEEP + 20  # bounded: the sleep, the load and a margin
    while triton_index(url, "late").get(late) in ("LOADING", "READY") and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # the late version READY then unloaded by the queued load: the index settles
    assert triton_index(url, "late") == {serving: "READY", late: "UNAVAILABLE"}
    with TritonControl(url) as triton:
        assert not triton.is_ready("late", late)
        answer = triton.infer("late", {"X": np.ones(4, np.float32)}, ["Y"])  # unversioned
    assert answer["Y"].tolist() == [float(serving)] * 4
    assert serving_versions(open_store(swaps.store).read_config("late") or "") == [serving]


def test_a_late_load_under_an_ensemble_on_a_canary_leaves_the_ensemble_serving_the_serving_version(
    swaps: Swaps,
) -> None:
    """Issue 45 item 1 with an ensemble, in a staged roll-out: the canary's ensemble follows the
    member's latest version, the member's load outlives load_timeout; the undo queues the member's
    and the ensemble's earlier configs behind it (Triton makes an ensemble's load wait for its
    member's: measured), and once the late load ends the ensemble serves the serving version, up."""
    member_config = LATE_CONFIG.replace('"late"', '"lmember"')
    serving = swaps.register("lmember", member_config, "SLEEPS = 0\n" + LATE)
    ensemble_config = (
        'name: "lens"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "lmember" model_version: {serving}\n'
        '  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }\n'
    )
    folder = swaps.work / f"lens-{len(list(swaps.work.iterdir()))}"
    ensemble = register_model(
        swaps.registry, folder, "lens", ensemble_config, {}, members={"lmember": serving}
    )
    swaps.promote("pair", "lens", ensemble)
    late = swaps.register("lmember", member_config, f"SLEEPS = {LATE_SLEEP}\n" + LATE)
    canary, other = swaps.urls
    untouched = triton_index(other, "lmember")
    with pytest.raises(PromotionFailed) as failed:
        swaps.promote("stagedlate", "lmember", late)
    message = failed.value.message
    assert "the rollback failed" not in message, message
    assert f"the load of lmember v{late} is still running on {canary}" in message, message
    assert "queued lens's earlier config (v" in message, message
    assert f"on {canary} behind the load of lmember v{late}, still running there" in message, message
    deadline = time.monotonic() + LATE_SLEEP + 20  # bounded: the sleep, the loads and a margin
    while triton_index(canary, "lmember").get(late) in ("LOADING", "READY") and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # the queued loads land after the late one: the index settles
    assert triton_index(canary, "lmember") == {serving: "READY", late: "UNAVAILABLE"}
    assert "READY" in triton_index(canary, "lens").values()  # the ensemble stayed up
    with TritonControl(canary) as triton:
        assert triton.model_config("lens")["ensemble_scheduling"]["step"][0]["model_version"] == str(serving)
        answer = triton.infer("lens", {"X": np.ones(4, np.float32)}, ["Y"])
    assert answer["Y"].tolist() == [float(serving)] * 4  # the ensemble up, on the serving version
    assert triton_index(other, "lmember") == untouched  # the other replica never loaded it


def test_a_load_that_never_finishes_is_named_at_its_deadline_and_blocks_the_next_promotion_there(
    swaps: Swaps,
) -> None:
    """Last in the module: the first replica keeps loading sleeper v2 until the module stops it."""
    ok = swaps.register("sleeper", SLEEPER_CONFIG, "HANGS = False\n" + SLEEPER)
    hangs = swaps.register("sleeper", SLEEPER_CONFIG, "HANGS = True\n" + SLEEPER)
    swaps.promote("pair", "sleeper", ok)
    other = triton_index(swaps.urls[1], "sleeper")
    with pytest.raises(
        PromotionFailed, match=f"did not finish within 6s; v{hangs} is still LOADING"
    ) as failed:
        swaps.promote("pair", "sleeper", hangs)
    assert swaps.urls[0] in failed.value.message
    assert triton_index(swaps.urls[0], "sleeper") == {ok: "READY", hangs: "LOADING"}
    assert triton_index(swaps.urls[1], "sleeper") == other  # never touched
    [row] = model_status(swaps.settings, environment(swaps.settings, "pair"), swaps.registry, ["sleeper"])
    assert row["loading"] == {swaps.urls[0]: [hangs]}
    [line] = [line for line in row["drift"] if "LOADING" in line]
    assert re.search(rf"v{hangs} LOADING for \d+ min \(since \d\d:\d\d:\d\d UTC\)", line), line

    before = refusal_state(swaps.store, swaps.urls[1:], swaps.registry)
    with pytest.raises(PromotionError, match="is still LOADING there") as refused:
        swaps.promote("pair", "sleeper", hangs)
    assert "restart the replica" in (refused.value.fix or "")
    assert refusal_state(swaps.store, swaps.urls[1:], swaps.registry) == before
    assert open_store(swaps.store).read_config("sleeper") is not None
    info, process = swaps.servers[0]  # stuck in a load that never ends: no graceful stop to wait for
    local_triton.stop_pid(info.pid, info.shm_prefix, grace=0.5, process=process)
