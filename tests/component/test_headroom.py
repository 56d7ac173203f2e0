"""Memory headroom before every load, and a leaking replica fenced off (pipelines/guards/headroom.py).

The promotions run in the unit world of tests/unit/worlds.py (a real local store, the fake
registry and fake Tritons of tests/fakes.py).  Triton's memory gauges come from a stand-in metrics
endpoint: a real ``http.server`` on 127.0.0.1 in a thread, serving Prometheus text in Triton
2.51's own format whose figures the test controls -- it stands in only for the GPU (and host)
gauges this CPU machine cannot produce on demand; everything that reads them is the real code.
Each replica's used memory is a base, plus the footprint of every version its fake Triton holds
READY, plus whatever a failed load left behind.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.context import Options
from pipelines.core.policy import Policy
from pipelines.core.reports import PromotionFailed, PromotionResult
from pipelines.fleet.fleet import Change
from pipelines.guards import headroom
from pipelines.guards.headroom import FOOTPRINT_KIND_TAG, FOOTPRINT_TAG, Footprint, Headroom
from pipelines.promote import plots, record
from pipelines.promote.runner import Promotion
from pipelines.triton.gauges import parse_gauges
from registry.errors import PromotionError, TritonError
from tests.fakes import Call, FakeTarget
from tests.unit.worlds import MEMBER, World

MIB, GIB = 2**20, 2**30
T0, T1 = "t0:8001", "t1:8001"
INTERVAL = 0.05  # the stand-in's "--metrics-interval-ms": short, so a measurement waits ~60 ms
# Triton 2.51's lines, as a CPU-only tritonserver exports them (read off the wheel's server here)
HOST = """# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes
# TYPE nv_cpu_memory_total_bytes gauge
nv_cpu_memory_total_bytes {total}
# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes {used}
nv_inference_request_success{{model="net",version="1"}} 7
"""
GPU = """nv_gpu_memory_total_bytes{{gpu_uuid="{uuid}"}} {total}
nv_gpu_memory_used_bytes{{gpu_uuid="{uuid}"}} {used}
"""
CONFIG = """name: "m"
backend: "python"
version_policy {{ specific {{ versions: [ {versions} ] }} }}
instance_group [ {{ kind: {kind} count: 1 {gpus}}} ]
"""


# -- the stand-in metrics endpoint ----------------------------------------------------------------


class Endpoint:
    """``/<name>/metrics`` answers ``pages[name]()``: Prometheus text, over real HTTP."""

    def __init__(self) -> None:
        self.pages: dict[str, Callable[[], str]] = {}
        self.memory: dict[str, Memory] = {}  # a world's replicas (url -> what its page reports)
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = pages.get(self.path.strip("/").removesuffix("/metrics"))
                body = page().encode() if page else b""
                self.send_response(200 if page else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name.split(':')[0]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.close()


@dataclass
class Memory:
    """One fake replica's host memory as its Triton reports it."""

    target: FakeTarget
    total: int
    base: int
    sizes: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, version) -> bytes
    leaked: int = 0

    @property
    def used(self) -> int:
        held = [(m, v) for m, states in self.target.states.items() for v, s in states.items() if s == "READY"]
        return self.base + self.leaked + sum(self.sizes.get(key, 0) for key in held)

    def text(self) -> str:
        return HOST.format(total=self.total, used=self.used)


# -- the world, with metrics ------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> World:
    """ens v1 (pre, net, ens) serving on both replicas, net v2 registered; then the replicas'
    metrics URLs set: 8 GiB each, 2 GiB used besides net v1's 500 MiB."""
    monkeypatch.setattr(headroom, "METRICS_INTERVAL", INTERVAL)
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    world.fleet.loads = 0
    world.env = replace(world.env, metrics_urls=((T0, endpoint.url(T0)), (T1, endpoint.url(T1))))
    for url in (T0, T1):
        memory = Memory(world.fleet.connect(url), 8 * GIB, 2 * GIB, {("net", "1"): 500 * MIB})
        endpoint.memory[url] = memory
        endpoint.pages[url.split(":")[0]] = memory.text
    return world


def footprint(world: World, model: str, version: str, size: int, kind: str = "host") -> None:
    world.registry.tags[(model, version)] |= {FOOTPRINT_TAG: str(size), FOOTPRINT_KIND_TAG: kind}


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def state(world: World) -> dict[str, Any]:
    """What serves, the store's files, every alias and tag."""
    return {
        "serving": {url: t.model_states() for url, t in world.fleet.targets.items()},
        "pins": {url: dict(t.ensembles) for url, t in world.fleet.targets.items()},
        "store": files(world.store_root),
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens")},
        "tags": {k: dict(v) for k, v in world.registry.tags.items() if k[0] != "ens"},
    }


def promotion(world: World) -> Promotion:
    return Promotion(
        world.settings, world.env, world.registry, Options(skip_quality=True), connect=world.fleet.connect
    )


def checks(result: PromotionResult, url: str) -> list[dict[str, Any]]:
    return [c for c in result.to_dict()["headroom"]["checks"] if c["replica"] == url]


# -- the check before each load --------------------------------------------------------------------


@pytest.mark.parametrize("short", [T0, T1])
def test_a_replica_short_of_memory_is_refused_before_anything_is_sent_to_it(
    world: World, endpoint: Endpoint, short: str
) -> None:
    footprint(world, "net", "2", GIB)
    endpoint.memory[short].base = 8 * GIB - 500 * MIB - GIB  # 1,024 MiB free, 1,229 MiB needed
    before = state(world)
    with pytest.raises(
        PromotionFailed,
        match=rf"{short}: not enough memory to load net v2 on host memory: 1,024 MiB free, 1,229 MiB "
        r"needed \(1,024 MiB footprint x memory_margin 1.2\)",
    ) as info:
        world.promote("net", "2")
    assert [e for e in world.loads() if e[1] == short] == []  # nothing was sent to it
    assert state(world) == before  # servers, the store's files, aliases and tags as they were
    assert world.fleet.broken == []
    found = info.value.result.to_dict()["headroom"]
    [message] = found["refused"]
    assert message.startswith(f"{short}: not enough memory")
    [refused] = [c for c in found["checks"] if c["replica"] == short]
    assert (refused["free_bytes"], refused["needed_bytes"], refused["ok"]) == (GIB, int(1.2 * GIB), False)
    assert (refused["source"], refused["device"]) == ("nv_cpu_memory_used_bytes", "host")
    assert found["footprints"] == []


def test_under_a_fleet_policy_a_replica_short_of_memory_is_left_out_within_max_unavailable(
    world: World, endpoint: Endpoint
) -> None:
    """A staged roll-out (canary T0, then T1) with max_unavailable = 1: T1 refused before anything
    was sent to it is left as it serves and named in the report; the canary and the alias move."""
    metrics = ((T0, endpoint.url(T0)), (T1, endpoint.url(T1)))
    world.env = replace(world.env, policy=Policy(canary=1, max_unavailable=1, metrics=metrics))
    footprint(world, "net", "2", GIB)
    endpoint.memory[T1].base = 8 * GIB - 500 * MIB - GIB  # 1,024 MiB free, 1,229 MiB needed
    t1 = world.fleet.connect(T1).model_states()
    pins = dict(world.fleet.connect(T1).ensembles)
    result = world.promote("net", "2")
    assert result.ok
    assert {e[2] for e in world.loads() if e[1] == T1} == {"ens"}  # net never loaded there: the
    assert world.fleet.connect(T1).model_states() == t1  # ensemble told to follow it, put back
    assert world.fleet.connect(T1).ensembles == pins
    assert world.fleet.connect(T0).model_states()["net"] == {"2": "READY"}
    assert world.registry.models.aliases("net") == {"test": "2"}
    skipped = result.to_dict()["plan"]["skipped"]
    assert list(skipped) == [T1]
    assert "not enough memory to load net v2" in skipped[T1]

    endpoint.memory[T0].base = 8 * GIB  # the canary itself short: never left out, the promotion stops
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    footprint(world, "net", "3", GIB)
    with pytest.raises(PromotionFailed, match=f"{T0}: not enough memory to load net v3"):
        world.promote("net", "3")
    assert world.registry.models.aliases("net") == {"test": "2"}


def test_a_replica_with_room_loads_and_its_figures_are_reported(world: World, endpoint: Endpoint) -> None:
    footprint(world, "net", "2", GIB)
    endpoint.memory[T1].base = 8 * GIB - 500 * MIB - 2 * GIB  # 2 GiB free: enough
    result = world.promote("net", "2")
    assert result.ok
    assert [e[1] for e in world.loads() if e[2] == "net" and e[3] == ("1", "2")] == [T0, T1]
    for url, free in ((T0, 8 * GIB - 2 * GIB - 500 * MIB), (T1, 2 * GIB)):
        [check] = checks(result, url)
        assert check | {"seconds": 0} == {
            "replica": url,
            "model": "net",
            "versions": ["2"],
            "recreated": [],
            "source": "nv_cpu_memory_used_bytes",
            "device": "host",
            "free_bytes": free,
            "needed_bytes": int(1.2 * GIB),
            "footprint_bytes": GIB,
            "checked": True,
            "ok": True,
            "seconds": 0,
        }
    assert world.registry.tags[("net", "2")][FOOTPRINT_TAG] == str(GIB)  # known: not measured again
    assert not [n for n in result.notes if "memory headroom" in n]


def test_an_unknown_footprint_is_measured_on_the_canary_recorded_and_checked_on_the_others(
    world: World, endpoint: Endpoint
) -> None:
    for url in (T0, T1):
        endpoint.memory[url].sizes[("net", "2")] = 300 * MIB
    logged: dict[str, float] = {}
    log = world.registry.runs.log

    def keep(run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        logged.update(metrics)
        log(run_id, params, metrics)

    world.registry.runs.log = keep  # type: ignore[method-assign]
    result = world.promote("net", "2")
    assert result.ok
    tags = world.registry.tags[("net", "2")]
    assert (tags[FOOTPRINT_TAG], tags[FOOTPRINT_KIND_TAG]) == (str(300 * MIB), "host")  # the delta served
    assert logged["footprint_net_bytes"] == 300 * MIB
    assert result.to_dict()["headroom"]["footprints"] == [
        {"model": "net", "version": "2", "bytes": 300 * MIB, "kind": "host", "replica": T0, "note": ""}
    ]
    assert [c["checked"] for c in checks(result, T0)] == [False]  # measured there, not checked
    [other] = checks(result, T1)
    assert (other["footprint_bytes"], other["checked"], other["ok"]) == (300 * MIB, True, True)
    assert (
        "memory headroom was not checked at t0:8001: net v2 has no footprint recorded yet (measured there)"
        in (result.notes)
    )


def test_a_footprint_learned_from_a_delta_that_went_down_is_zero_with_a_note(endpoint: Endpoint) -> None:
    served = {"used": 3 * GIB}
    endpoint.pages["r"] = lambda: HOST.format(total=8 * GIB, used=served["used"])
    guard = Headroom(lambda url: endpoint.url(url), interval=INTERVAL)
    change = Change("m", CONFIG.format(versions="2", kind="KIND_CPU", gpus=""), ("2",))
    guard.before_load("r:8001", change)
    served["used"] -= 40 * MIB  # something else on the host freed memory meanwhile
    assert guard.after_load("r:8001", change, None) == ""
    [found] = guard.measured
    assert (found.bytes, found.kind) == (0, "host")
    assert found.note.startswith("nv_cpu_memory_used_bytes moved by -40 MiB around the load at r:8001")
    assert guard.footprints() == [("m", "2", 0, "host")]


# -- GPUs, re-created versions, loads the gauge does not show yet --------------------------------------


def gpus(*free_gib: float) -> str:
    return "".join(
        GPU.format(uuid=f"GPU-{i}", total=80 * GIB, used=int((80 - free) * GIB))
        for i, free in enumerate(free_gib)
    )


@pytest.mark.parametrize(
    ("named", "free", "refused"),
    [
        ("", (10, 0.5), "GPU-1"),
        ("", (10, 2), ""),
        ("gpus: [ 0 ] ", (10, 3), ""),
        ("gpus: [ 0 ] ", (1, 10), "GPU-0"),
    ],
)
def test_a_gpu_model_needs_its_share_free_on_each_gpu_it_lands_on(
    endpoint: Endpoint, named: str, free: tuple[float, ...], refused: str
) -> None:
    """2 GiB over the GPUs it lands on: every GPU (1 GiB each) or the one it names (2 GiB; which
    uuid is device 0 the metrics do not say: the least free GPU is checked)."""
    endpoint.pages["g"] = lambda: gpus(*free) + HOST.format(total=8 * GIB, used=GIB)
    guard = Headroom(
        lambda url: endpoint.url(url), known=lambda m, v: Footprint(m, v, 2 * GIB, "gpu"), interval=INTERVAL
    )
    change = Change("m", CONFIG.format(versions="2", kind="KIND_GPU", gpus=named), ("2",))
    if not refused:
        guard.before_load("g:8001", change)
        assert all(c["ok"] and c["source"] == "nv_gpu_memory_used_bytes" for c in guard.checks)
        return
    needed = "1,229" if not named else "2,458"
    with pytest.raises(
        PromotionError,
        match=rf"g:8001: not enough memory to load m v2 on GPU {refused}: .* {needed} MiB needed",
    ):
        guard.before_load("g:8001", change)
    [message] = guard.refused
    assert f"GPU {refused}" in message


def test_a_load_that_recreates_the_serving_version_needs_room_for_it_once_more(endpoint: Endpoint) -> None:
    endpoint.pages["r"] = lambda: HOST.format(total=8 * GIB, used=int(6.5 * GIB))  # 1.5 GiB free
    change = Change("m", CONFIG.format(versions="1, 2", kind="KIND_CPU", gpus=""), ("1", "2"))

    def guard(recreates: Any) -> Headroom:
        return Headroom(
            lambda url: endpoint.url(url),
            known=lambda m, v: Footprint(m, v, GIB if v == "1" else 512 * MIB, "host"),
            held=lambda url, model: ["1"],
            recreates=recreates,
            interval=INTERVAL,
        )

    guard(frozenset()).before_load("r:8001", change)  # v2 alone: 614 MiB needed
    with pytest.raises(
        PromotionError, match=r"m v2 \(v1 re-created beside it\) on host memory: 1,536 MiB free, 1,843"
    ):
        guard({"m"}).before_load("r:8001", change)  # v1 made anew beside the one in use, and v2
    with pytest.raises(PromotionError, match="re-created beside it"):
        guard(lambda change: change.model == "m").before_load("r:8001", change)


def test_a_load_the_gauge_does_not_show_yet_is_counted_until_it_refreshes(endpoint: Endpoint) -> None:
    """Two loads on one replica within an interval: the second check counts the first (the gauge
    may predate it); a refusal that rests on it waits for the refresh and reads again."""
    served = {"used": 6 * GIB}  # 2 GiB free; each load adds 1 GiB
    endpoint.pages["r"] = lambda: HOST.format(total=8 * GIB, used=served["used"])

    def refreshed(seconds: float) -> None:
        served["used"] += GIB  # the gauge's refresh shows the first load

    guard = Headroom(
        lambda url: endpoint.url(url),
        known=lambda m, v: Footprint(m, v, GIB, "host"),
        interval=60.0,  # no refresh happens on its own during the test
        sleep=refreshed,
    )
    first = Change("a", CONFIG.format(versions="1", kind="KIND_CPU", gpus=""), ("1",))
    second = Change("b", CONFIG.format(versions="1", kind="KIND_CPU", gpus=""), ("1",))
    guard.before_load("r:8001", first)
    assert guard.after_load("r:8001", first, None) == ""
    with pytest.raises(PromotionError, match="not enough memory to load b v1 on host memory: 1,024 MiB free"):
        guard.before_load("r:8001", second)
    assert served["used"] == 7 * GIB  # it waited for the refresh, then judged on the fresh figure


# -- a failed load that leaks -------------------------------------------------------------------------


def leaking(world: World, endpoint: Endpoint, url: str, size: int) -> None:
    """The first load fails; at ``url`` it leaves ``size`` bytes behind."""
    world.fleet.fail_at_load = 1
    handle = world.fleet.handle

    def handler(target: FakeTarget, call: Call) -> None:
        try:
            handle(target, call)
        except TritonError:
            if target.url == url:
                endpoint.memory[url].leaked += size
            raise

    for target in world.fleet.targets.values():
        target.handler = handler


def test_a_replica_whose_memory_does_not_come_back_after_a_failed_load_is_fenced_off(
    world: World, endpoint: Endpoint
) -> None:
    footprint(world, "net", "2", 300 * MIB)
    leaking(world, endpoint, T0, 512 * MIB)
    run = promotion(world)
    with pytest.raises(PromotionFailed, match="t0:8001: model 'net' failed to load") as info:
        run.run("net", "2")
    assert run.ctx is not None
    fleet = run.ctx.fleet
    why = "leaked 512 MiB after the failed load of net v2; restart it"
    assert fleet.fenced == {T0: why}
    assert info.value.result.to_dict()["headroom"]["leaks"] == [
        {
            "replica": T0,
            "model": "net",
            "versions": ["2"],
            "source": "nv_cpu_memory_used_bytes",
            "leaked_bytes": 512 * MIB,
            "bound_bytes": 256 * MIB,
        }
    ]
    assert [e for e in world.events if T1 in e] == []  # the promotion stopped at the canary
    # the undo's restore put net v1 back (Fleet.restore: not a move); nothing else loaded there
    assert [e for e in world.loads() if e[1] == T0] == [
        ("load", T0, "net", ("1", "2")),
        ("load", T0, "net", ("1",)),
    ]
    events = list(world.events)
    change = Change("net", world.config("net"), ("1",))
    with pytest.raises(PromotionError, match=f"{T0} is fenced off for this promotion: {why}"):
        fleet.move(T0, change)  # whatever moves next in this promotion: refused, nothing sent
    assert world.events == events


def test_a_failed_load_whose_memory_comes_back_fences_nothing(world: World, endpoint: Endpoint) -> None:
    footprint(world, "net", "2", 300 * MIB)
    leaking(world, endpoint, T0, 200 * MIB)  # within the host's 256 MiB floor: its gauge's noise
    run = promotion(world)
    with pytest.raises(PromotionFailed, match="failed to load"):
        run.run("net", "2")
    assert run.ctx is not None
    assert run.ctx.fleet.fenced == {}
    assert run.ctx.result.to_dict()["headroom"]["leaks"] == []


# -- no figures: no check, and a note ------------------------------------------------------------------


def test_without_a_metrics_url_nothing_is_checked_and_a_note_says_so(
    world: World, endpoint: Endpoint
) -> None:
    footprint(world, "net", "2", 100 * GIB)  # would be refused anywhere
    world.env = replace(world.env, metrics_urls=((T1, world.env.metrics_url(T1)),))
    endpoint.memory[T1].base = 0
    endpoint.memory[T1].total = 200 * GIB
    result = world.promote("net", "2")
    assert result.ok
    assert f"memory headroom was not checked at {T0}: no metrics URL for it" in " ".join(result.notes)
    assert [c["replica"] for c in result.to_dict()["headroom"]["checks"]] == [T1]
    world.env = replace(world.env, metrics_urls=())
    world.registry.add("net", "3", MEMBER.format(name="net", src="MID", dst="OUT"))
    footprint(world, "net", "3", 100 * GIB)
    result = world.promote("net", "3")
    assert result.ok
    assert result.to_dict()["headroom"]["checks"] == []
    assert f"memory headroom was not checked at {T0}, {T1}: no metrics URL for it" in " ".join(result.notes)


def test_an_endpoint_that_does_not_answer_is_a_note_not_a_pass(world: World, endpoint: Endpoint) -> None:
    footprint(world, "net", "2", 100 * GIB)
    endpoint.pages.clear()  # 404 everywhere
    result = world.promote("net", "2")
    assert result.ok
    assert result.to_dict()["headroom"]["checks"] == []
    assert (
        "memory headroom was not checked at t0:8001, t1:8001: its metrics could not be read (HTTP Error 404"
        in (" ".join(result.notes))
    )


# -- Triton's text ----------------------------------------------------------------------------------


def test_triton_memory_gauges_are_read_per_gpu_and_for_the_host() -> None:
    text = (
        gpus(10, 2) + HOST.format(total=16 * GIB, used=4 * GIB) + 'nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5\n'
    )
    found = parse_gauges(text)
    assert dict(found.gpus) == {"GPU-0": (80 * GIB, 70 * GIB), "GPU-1": (80 * GIB, 78 * GIB)}
    assert found.host == (16 * GIB, 4 * GIB)
    assert (found.used("gpu"), found.used("host"), found.free("GPU-1")) == (148 * GIB, 4 * GIB, 2 * GIB)
    with pytest.raises(ValueError, match=r"nv_cpu_memory_used_bytes = 'NaN' is not a byte count"):
        parse_gauges("nv_cpu_memory_used_bytes NaN\n")


# -- the readings over time, and the record's picture of them ------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"


def served(endpoint: Endpoint) -> list[tuple[str, str, int, int]]:
    """(replica, device, used, total) of every page the stand-in serves from now on, in order."""
    found: list[tuple[str, str, int, int]] = []
    for url, memory in endpoint.memory.items():

        def page(url: str = url, memory: Memory = memory) -> str:
            used = memory.used  # read once: what is recorded is what is served
            found.append((url, "host", used, memory.total))
            return HOST.format(total=memory.total, used=used)

        endpoint.pages[url.split(":")[0]] = page
    return found


def artifacts(world: World) -> dict[str, bytes]:
    """The files of each folder the record stage hands to ``log_artifacts``, read while it exists."""
    kept: dict[str, bytes] = {}
    logged = world.registry.runs.log_artifacts

    def keep(run_id: str, folder: Path, path: str | None = None) -> None:
        kept.update(files(folder))
        logged(run_id, folder, path)

    world.registry.runs.log_artifacts = keep  # type: ignore[method-assign]
    return kept


def test_every_reading_of_the_gauges_is_kept_as_a_sample_in_the_order_read(
    world: World, endpoint: Endpoint
) -> None:
    for url in (T0, T1):
        endpoint.memory[url].sizes[("net", "2")] = 300 * MIB  # unknown: measured on the canary
    read = served(endpoint)
    result = world.promote("net", "2")
    assert result.ok
    found = result.to_dict()["headroom"]
    samples = found["samples"]
    assert [(s["replica"], s["device"], s["used_bytes"], s["total_bytes"]) for s in samples] == read
    whats = [(s["replica"], s["what"]) for s in samples]
    polls = len(whats) - 2  # before the canary's load, after it until the gauge moved; then t1
    assert polls >= 1
    assert whats == [(T0, "before load of net v2")] + [(T0, "after load of net v2")] * polls + [
        (T1, "before load of net v2")
    ]
    before, after = 2 * GIB + 500 * MIB, 2 * GIB + 800 * MIB  # net v1 held; then net v2 beside it
    assert [s["used_bytes"] for s in samples] == [before] + [after] * polls + [before]
    assert {s["total_bytes"] for s in samples} == {8 * GIB}
    assert all(isinstance(s["used_bytes"], int) and isinstance(s["total_bytes"], int) for s in samples)
    assert [s["seconds"] for s in samples] == sorted(s["seconds"] for s in samples)
    assert [(e["replica"], e["what"]) for e in found["events"]] == [
        (T0, "load of net v2"),
        (T1, "load of net v2"),
    ]


def test_only_the_newest_samples_are_kept(endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(headroom, "SAMPLES", 3)
    figures = {"used": 3 * GIB}
    read = []

    def page() -> str:
        read.append(figures["used"])
        return HOST.format(total=8 * GIB, used=figures["used"])

    endpoint.pages["r"] = page
    guard = Headroom(lambda url: endpoint.url(url), interval=INTERVAL)
    for version in "123":
        change = Change("m", CONFIG.format(versions=version, kind="KIND_CPU", gpus=""), (version,))
        guard.before_load("r:8001", change)
        figures["used"] += GIB  # a load each: the measurement's first poll shows it
        assert guard.after_load("r:8001", change, None) == ""
    assert len(read) > 3
    assert [s.used_bytes for s in guard.samples()] == read[-3:]
    assert len(guard.to_dict()["samples"]) == 3


@pytest.mark.parametrize("refused", [False, True])
def test_the_record_stage_logs_a_picture_of_the_memory_beside_the_report(
    world: World, endpoint: Endpoint, refused: bool
) -> None:
    footprint(world, "net", "2", GIB)
    if refused:
        endpoint.memory[T1].base = 8 * GIB - 500 * MIB - GIB  # 1,024 MiB free, 1,229 MiB needed
    kept = artifacts(world)
    if refused:
        with pytest.raises(PromotionFailed, match=f"{T1}: not enough memory"):
            world.promote("net", "2")
    else:
        assert world.promote("net", "2").ok
    assert sorted(kept) == ["ledger.jsonl", "memory.png", "report.json", "verdict.json"]  # memory.png beside
    assert kept["memory.png"][:8] == PNG
    events = json.loads(kept["report.json"])["headroom"]["events"]
    assert [(e["replica"], e["what"]) for e in events] == [
        (T0, "load of net v2"),
        (T1, "refused net v2" if refused else "load of net v2"),
    ]


def test_without_samples_no_picture_is_drawn(world: World, endpoint: Endpoint) -> None:
    world.env = replace(world.env, metrics_urls=())
    kept = artifacts(world)
    assert world.promote("net", "2").ok
    assert "memory.png" not in kept
    assert "report.json" in kept
    assert plots.memory_plot({"samples": []}, "nothing", Path("/nonexistent/memory.png")) is None


def test_a_picture_that_cannot_be_drawn_is_a_warning_not_a_failed_promotion(
    world: World, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("no display for you")

    monkeypatch.setattr(record, "memory_plot", broken)
    kept = artifacts(world)
    result = world.promote("net", "2")
    assert result.ok
    assert "memory.png" not in kept
    assert "report.json" in kept
    assert "could not plot the replicas' memory: RuntimeError: no display for you" in caplog.text
    assert world.registry.recorded[-1]["ok"] is True


def test_gpus_and_the_host_are_drawn_on_axes_of_their_own(tmp_path: Path) -> None:
    """A leaking GPU replica's samples and events, as the guard reports them."""
    samples = [
        {
            "seconds": t,
            "replica": url,
            "device": device,
            "used_bytes": used,
            "total_bytes": total,
            "what": what,
        }
        for t, what, leaked in ((0.0, "before load of m v2", 0), (0.5, "leak check after m v2", GIB))
        for url in (T0, T1)
        for device, used, total in (
            ("GPU-0f3c9a12-aaaa-bbbb-cccc-1234567890ab", 40 * GIB + leaked, 80 * GIB),
            ("host", 12 * GIB, 512 * GIB),
        )
    ]
    events = [
        {"seconds": 0.1, "replica": T0, "what": "load of m v2"},
        {"seconds": 0.3, "replica": T0, "what": "failed load of m v2"},
        {"seconds": 0.6, "replica": T0, "what": "leak of 1,024 MiB after m v2"},
        {"seconds": 0.7, "replica": T1, "what": "refused m v2"},
    ]
    path = tmp_path / "memory.png"
    found = plots.memory_plot({"samples": samples, "events": events}, "Memory over m v2 to 'prod'", path)
    assert found == path
    assert path.read_bytes()[:8] == PNG
    assert list(plots.series(samples)) == [
        (T0, "GPU-0f3c9a12-aaaa-bbbb-cccc-1234567890ab"),
        (T0, "host"),
        (T1, "GPU-0f3c9a12-aaaa-bbbb-cccc-1234567890ab"),
        (T1, "host"),
    ]
