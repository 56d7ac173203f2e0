"""Shadow captures are untrusted input, and mlreg deletes only what it made (issue 44, items 4-5).

Trace files here are written byte for byte as Triton 2.51 writes them with ``log_frequency 1``
(one file per sampled request; the record order seen on the wheel's tritonserver for an HTTP
request: the frontend's receive stamps first, then the model record, the tensors, the rest), with
the client's request id written *unescaped* -- exactly what lets a client forge records.  The
real-server check of the same format is in tests/integration/test_shadow.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.checks.capture import Captures, Shadow, parse_shadow, purge, read_captures, settle
from pipelines.checks.replay import ShadowResult, compare
from pipelines.checks.shadow import capture_after, replay_step
from pipelines.checks.traces import (
    CHILDREN,
    DUPLICATE_KEY,
    FORGED,
    TOO_DEEP,
    Reading,
    load_records,
    parse_trace,
)
from pipelines.core.plan import Role, Step
from pipelines.promote import after
from pipelines.triton.control import RequestNonce
from registry.errors import UsageError
from registry.settings import Settings
from tests.unit.trace_files import CONFIG, triton_file, write_honest


def forging_id(first_fake: int, fakes: int) -> str:
    """A request id that closes its string and appends ``fakes`` requests of zeros (inputs and
    outputs: a wrong candidate answering zeros would match them), then reopens a string."""
    zeros = np.zeros((1, 4), np.float32)
    parts = []
    for fake in range(first_fake, first_fake + fakes):
        body = triton_file(fake, f"f{fake}", zeros, np.zeros((1, 1), np.float32)).decode()[1:-1]
        parts.append(body)
    return 'evil"},' + ",".join(parts) + ',{"id":1,"x":"'


def _step() -> Step:
    return Step("m", "2", Role.MODEL, None, CONFIG, CONFIG, ["1"])


def _model(scale: float):
    def infer(
        model: str, inputs: dict[str, np.ndarray], names: list[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        return {"Y": (inputs["X"].sum(axis=1, keepdims=True) * scale).astype(np.float32)}

    return infer


def test_records_forged_through_a_request_id_are_named_and_never_judged(tmp_path: Path) -> None:
    """The repro: one request whose id appends 100 fake requests of zeros.  A 5x-wrong candidate
    was passed ("0 of 99 diverged") when those were read as captures; now the forged file is
    skipped and named, only the honest captures are judged, and the wrong candidate is refused."""
    traces = tmp_path / "traces"
    write_honest(traces, 60)
    forged = triton_file(
        9000, forging_id(9001, 100), np.ones((1, 4), np.float32), np.full((1, 1), 4.0, np.float32)
    )
    (traces / "trace.json.9000").write_bytes(forged)
    reading = read_captures(str(traces), "m", "1", 10_000)
    assert len(reading.requests) == 60
    assert all(r.request_id.startswith("c") for r in reading.requests)  # no fake, nor the forger's own
    assert (reading.forged_files, reading.forged) == (1, 100 * 15 + 1)  # each fake's 15 records, the tail
    assert reading.skipped == {FORGED: reading.forged}
    shadow = Shadow(captures=str(traces), count=500)
    wrong, _ = replay_step(_step(), "1", (_model(5.0), "m"), _model(1.0), shadow)
    assert not wrong.ok
    assert wrong.judged == 60  # the honest captures only
    assert wrong.diverged == 60
    assert wrong.verdict.startswith("refused: 60 divergent request(s)")
    assert (
        "1501 forged records from request ids that break Triton's trace format, in 1 file(s)" in wrong.line()
    )
    same, _ = replay_step(_step(), "1", (_model(1.0), "m"), _model(1.0), shadow)
    assert (same.ok, same.judged, same.diverged) == (True, 60, 0)


@pytest.mark.parametrize(
    ("injected", "why"),
    [
        # a second input set under the request's own trace id (guessed): never Triton's
        (
            'x"},{"id":7,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":"X","data":"0,0,0,0",'
            '"shape":"1,4","dtype":"FP32"}},{"id":7,"timestamps":[{"name":"QUEUE_END","ns":1}]},{"id":7,"z":"',
            "second input set",
        ),
        ('x"},{"id":7,"activity":"TENSOR_MAGIC","tensor":{}},{"id":7,"z":"', "unknown activity"),
        (
            'x"},{"id":7,"activity":["TENSOR_QUEUE_INPUT"],"tensor":{}},{"id":7,"z":"',
            "an unhashable activity",
        ),
        ('x"},{"id":7,"timestamps":[{"name":{"a":1},"ns":1}]},{"id":7,"z":"', "an unhashable stamp name"),
        ('x"},[1,2],{"id":7,"z":"', "a record that is no object"),
        ('x","extra":"1', "a key Triton never writes"),
        ('x"},{"id":7,"model_name":"m","model_version":1,"request_id":"y', "a second model record"),
        ('x"},{"id":7,"timestamps":[{"name":"REQUEST_END","ns":5}]},{"id":7,"z":"', "a repeated stamp"),
    ],
)
def test_what_triton_never_writes_for_one_request_is_forged(tmp_path: Path, injected: str, why: str) -> None:
    traces = tmp_path / "traces"
    write_honest(traces, 3)
    x = np.ones((1, 4), np.float32)
    (traces / "trace.json.50").write_bytes(triton_file(7, injected, x, x.sum(axis=1, keepdims=True)))
    reading = read_captures(str(traces), "m", "1", 100)
    assert [r.request_id for r in reading.requests] == ["c0", "c1", "c2"], why
    assert reading.forged_files == 1, why
    assert reading.forged >= 1, why


def test_a_30000_deep_array_in_a_request_id_is_skipped_with_a_reason(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_honest(traces, 2)
    deep = 'x","a":' + "[" * 30_000 + "]" * 30_000 + ',"b":"'
    x = np.ones((1, 4), np.float32)
    (traces / "trace.json.9").write_bytes(triton_file(9, deep, x, x.sum(axis=1, keepdims=True)))
    reading = read_captures(str(traces), "m", "1", 100)  # no RecursionError
    assert [r.request_id for r in reading.requests] == ["c0", "c1"]
    assert reading.skipped[TOO_DEEP] == 1
    assert reading.forged_files == 1


def test_mlreg_prefixed_ids_from_clients_are_judged_and_only_this_promotions_nonce_is_skipped(
    tmp_path: Path,
) -> None:
    """Requests with ids ``mlreg-<n>`` from any client used to be skipped as mlreg's own (the
    replay said "no captured request" and passed): now they are ordinary captures, judged; only
    this promotion's own requests (a secret nonce) are left out."""
    traces = tmp_path / "traces"
    nonce, earlier = RequestNonce(), RequestNonce()  # this promotion's, and another's
    write_honest(traces, 60, prefix="mlreg-")
    write_honest(traces, 5, start=60, prefix=nonce.prefix, seed=4)
    write_honest(traces, 7, start=70, prefix=earlier.prefix, seed=5)
    assert len(nonce.prefix) >= len("mlreg-") + 32  # 16 random bytes: not guessable
    assert nonce.prefix != earlier.prefix  # one per promotion, not one per process
    assert nonce.prefix not in repr(nonce)
    shadow = Shadow(captures=str(traces), count=500, own=nonce.prefix)
    assert nonce.prefix not in repr(shadow)  # never shown where the settings are
    wrong, _ = replay_step(_step(), "1", (_model(5.0), "m"), _model(1.0), shadow)
    assert wrong.judged == 67  # the clients' mlreg-<n> ids and an earlier promotion's, not this one's five
    assert nonce.prefix not in str(wrong.to_dict())
    assert not wrong.ok


def test_fewer_honest_captures_than_the_minimum_is_inconclusive_and_refuses(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_honest(traces, 10)
    found, _ = replay_step(_step(), "1", (_model(1.0), "m"), _model(1.0), Shadow(captures=str(traces)))
    assert not found.ok
    assert found.verdict.startswith("inconclusive: 10 captured request(s) of v1 could be judged")
    assert "min_captures 50" in found.verdict
    assert "--skip-shadow" in found.verdict
    skipped, _ = replay_step(
        _step(), "1", (_model(1.0), "m"), _model(1.0), Shadow(captures=str(traces)), skip=True
    )
    assert (skipped.ok, skipped.verdict) == (True, "skipped: --skip-shadow")


def test_a_canary_gone_mid_replay_is_not_a_pass(tmp_path: Path) -> None:
    """Neither side answers (the canary killed): nothing judged is inconclusive, never "passed"."""
    from registry.errors import TritonError

    def dead(*args: object, **kwargs: object) -> dict[str, np.ndarray]:
        raise TritonError("unreachable")

    traces = tmp_path / "traces"
    write_honest(traces, 60)
    found, _ = replay_step(_step(), "1", (dead, "m"), dead, Shadow(captures=str(traces)))
    assert (found.ok, found.judged, found.serving_failed) == (False, 0, 60)
    assert found.verdict.startswith("inconclusive")


def test_captures_that_cannot_be_read_refuse_named(tmp_path: Path) -> None:
    shadow = Shadow(captures=str(tmp_path / "gone"))
    found, _ = replay_step(_step(), "1", (_model(1.0), "m"), _model(1.0), shadow)
    assert not found.ok
    assert found.verdict.startswith(f"refused: the captures under {tmp_path / 'gone'} could not be read")


def test_the_sample_spans_every_replica_not_the_newest_files(tmp_path: Path) -> None:
    """One replica holding 1000 captures, another 60: a sample of 100 takes from both."""
    write_honest(tmp_path / "replica-0", 1000, prefix="a")
    write_honest(tmp_path / "replica-1", 60, prefix="b", start=2000, seed=5)  # inputs of their own
    reading = read_captures(str(tmp_path), "m", "1", 100)
    sources = [r.request_id[0] for r in reading.requests]
    assert len(sources) == 100
    assert (sources.count("a"), sources.count("b")) == (50, 50)  # replica by replica in turn
    mtimes = [r.when for r in reading.requests]
    assert mtimes == sorted(mtimes)  # replayed in capture order
    again = read_captures(str(tmp_path), "m", "1", 100)
    assert {r.request_id for r in again.requests} != {r.request_id for r in reading.requests}  # unpredictable


def test_tensors_reach_reports_only_where_the_environment_allows(tmp_path: Path) -> None:
    x = np.array([[0.25, 0.5, 0.75, 1.0]], np.float32)
    from pipelines.checks.traces import Captured

    requests = [Captured("m", "1", "c1", {"X": x}, {"Y": np.array([[2.5]], np.float32)})]
    ours = [({"Y": np.array([[9.0]], np.float32)}, 1.0)]
    again = [({"Y": np.array([[2.5]], np.float32)}, 1.0)]
    kept = compare(
        requests, ours, again, {"Y": "regression"}, Shadow(min_captures=1), ShadowResult("m", "2", "1")
    )
    [first] = kept.first
    assert first["inputs"] == {"X": "shape [1, 4]"}
    assert first["candidate"] == {"Y": "shape [1, 1]"}
    assert "0.25" not in str(kept.to_dict())
    allowed = Shadow(min_captures=1, record_tensors=True)
    shown = compare(requests, ours, again, {"Y": "regression"}, allowed, ShadowResult("m", "2", "1"))
    assert shown.first[0]["inputs"]["X"].startswith("[0.25, 0.5, 0.75, 1]")


# -- the settings refuse what cannot be read or would delete what mlreg keeps ------------------------


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg"), "PATH": os.environ["PATH"]})


def test_a_shadow_table_without_captures_is_refused_except_on_the_local_stack(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    shadow = parse_shadow("x", {"rate": 1, "count": 100}, tmp_path)
    with pytest.raises(UsageError, match="no captures location"):
        settle("x", shadow, str(tmp_path / "store"), settings)
    local = settle("x", shadow, str(settings.local_repository), settings)
    assert local is not None
    assert local.stack == str(settings.stack_dir)
    for replica in ("traces", "replica-1/traces", "replica-2/traces"):
        (settings.stack_dir / replica).mkdir(parents=True)
    assert local.locations() == [
        str(settings.stack_dir / "traces"),
        str(settings.stack_dir / "replica-1/traces"),
        str(settings.stack_dir / "replica-2/traces"),
    ]


@pytest.mark.parametrize(
    "captures",
    [
        "store",
        "store/scorer",
        ".",
        ".mlreg",
        ".mlreg/stack",
        ".mlreg/stack/replica-1",
        ".mlreg-archive/store",
    ],
)
def test_captures_overlapping_what_mlreg_keeps_is_refused(tmp_path: Path, captures: str) -> None:
    settings = _settings(tmp_path)
    shadow = parse_shadow("x", {"captures": captures}, tmp_path)
    with pytest.raises(UsageError, match="overlaps"):
        settle("x", shadow, str(tmp_path / "store"), settings)


def test_s3_captures_sharing_the_stores_prefix_is_refused_and_a_prefix_of_its_own_is_not(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    store = "s3://127.0.0.1:9000/bucket/models"
    for bad in (
        "s3://bucket/models/traces",
        "s3://127.0.0.1:9000/bucket",
        "s3://bucket/.mlreg-archive/models",
    ):
        with pytest.raises(UsageError, match="overlaps"):
            settle("x", parse_shadow("x", {"captures": bad}, tmp_path), store, settings)
    good = settle("x", parse_shadow("x", {"captures": "s3://bucket/traces"}, tmp_path), store, settings)
    assert good is not None
    assert good.locations() == ["s3://bucket/traces"]


def test_min_captures_above_count_and_log_frequency_other_than_one_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="min_captures 80 is more than count 40"):
        parse_shadow("x", {"captures": "t", "count": 40, "min_captures": 80}, tmp_path)
    with pytest.raises(UsageError, match="log_frequency must be 1"):
        parse_shadow("x", {"captures": "t", "log_frequency": 10}, tmp_path)


# -- delete only what you made ---------------------------------------------------------------------------


def _others(root: Path) -> dict[Path, bytes]:
    """Files a captures folder may hold beside the traces: none of them mlreg's to delete."""
    files = {
        root / "manifest.json": b'{"files": {}}',
        root / "triton.json": b'{"pid": 1}',
        root / "notes.json.bak": b"{}",
        root / "replica-0" / "trace.json": b"[]",  # log_frequency 0's file: not what mlreg arms
        root / "replica-0" / "config.pbtxt": b'name: "m"',
        root / "deep" / "er" / "trace.json.1": b"[]",  # two folders down: not a replica's
        root / "replica-0" / "trace.json.7.tmp": b"[]",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (1000, 1000))
    outside = root.parent / "outside.json.1"
    outside.write_bytes(b"[]")
    (root / "replica-0" / "link.json.1").symlink_to(outside)
    return {**files, outside: b"[]"}


def _digests(files: dict[Path, bytes]) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_purge_and_prune_delete_only_the_trace_files_mlreg_armed(tmp_path: Path) -> None:
    root = tmp_path / "captures"
    traces = write_honest(root / "replica-0", 5)
    traces_1 = write_honest(root / "replica-1", 3, start=10)
    others = _others(root)
    before = _digests(others)
    gone = Captures(str(root)).prune(Shadow(max_age_hours=0))  # everything is too old
    assert sorted(gone) == sorted([f"replica-0/{n}" for n in traces] + [f"replica-1/{n}" for n in traces_1])
    assert _digests(others) == before  # every other file byte-identical
    write_honest(root / "replica-0", 2)
    purged = purge([str(root), str(tmp_path / "missing")])
    assert sorted(purged.deleted) == [f"{root}/replica-0/trace.json.0", f"{root}/replica-0/trace.json.1"]
    missing = tmp_path / "missing"
    assert purged.unreached == [
        f"{missing}: the captures folder {missing} does not exist (or is not a folder)"
    ]
    assert _digests(others) == before
    assert (root / "replica-0" / "link.json.1").is_symlink()


# -- after record: best effort, bounded, a signal ends it with the real outcome ---------------------------


def test_an_after_record_step_that_hangs_is_left_behind_within_its_deadline() -> None:
    hang = threading.Event()

    def frozen(progress: after.Progress) -> list[str]:
        progress("s3://bucket/traces")
        hang.wait(60)  # a frozen S3 prefix
        return []

    began = time.monotonic()
    notes = after.best_effort("capture arming", frozen, deadline_s=0.5)
    hang.set()
    assert time.monotonic() - began < 3
    assert notes == [
        "promoted; capture arming did not finish within 0.5 s on s3://bucket/traces: left behind"
    ]


def test_a_sigterm_after_record_ends_the_step_with_the_real_outcome() -> None:
    """A real SIGTERM to this process while capture arming waits on a frozen replica: no
    ``Terminated`` (the CLI's handler is in place, as in ``mlreg``), the note names the replica."""
    from mlreg.cli.signals import sigterm_raises

    hang = threading.Event()

    def frozen(progress: after.Progress) -> list[str]:
        progress("10.0.0.7:8001")
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        hang.wait(60)
        return []

    with sigterm_raises():
        began = time.monotonic()
        notes = after.best_effort("capture arming", frozen, deadline_s=30)
        elapsed = time.monotonic() - began
    hang.set()
    assert elapsed < 5
    assert notes == ["promoted; capture arming interrupted on 10.0.0.7:8001 (SIGTERM)"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


@pytest.fixture
def frozen_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 endpoint that accepts connections and never answers (a SIGSTOP'd server, as the
    issue's repro froze moto): a real socket, nothing mocked."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # connections queue in the backlog; no answer ever comes
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("pipelines.checks.capture.S3_PATIENCE", (0.5, 0))  # 10 s, 1 retry in production
    try:
        yield f"s3://127.0.0.1:{server.getsockname()[1]}/bucket/traces"
    finally:
        server.close()


def test_a_frozen_s3_captures_prefix_refuses_within_its_bound_and_prunes_nothing(frozen_s3: str) -> None:
    """The repro: frozen, the replay waited 244 s in silence, then skipped and promoted.  Now it
    refuses, named, within the S3 requests' bound; the after-record prune ends with a note."""
    began = time.monotonic()
    found, _ = replay_step(_step(), "1", (_model(1.0), "m"), _model(1.0), Shadow(captures=frozen_s3))
    assert time.monotonic() - began < 10
    assert not found.ok
    assert found.verdict.startswith(f"refused: the captures under {frozen_s3} could not be read")
    notes = after.best_effort(
        "capture arming",
        lambda progress: capture_after((), _no_replica, [], Shadow(captures=frozen_s3), progress),
        deadline_s=5,
    )
    assert len(notes) == 1
    assert notes[0].startswith(f"captured files under {frozen_s3} could not be pruned")


def _no_replica(url: str) -> Any:
    raise AssertionError(f"no replica is reached: {url}")


def test_a_sigterm_while_capture_is_armed_after_record_leaves_a_promotion_that_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 item 6 / issue 45: a replica frozen during capture arming and a SIGTERM then (a
    real signal, the CLI's handler in place) exit with the real outcome -- promoted, the alias
    moved, the note naming the replica -- not "Terminated" after a recorded success."""
    from dataclasses import replace

    from mlreg.cli.signals import sigterm_raises
    from tests.fakes import FakeTarget
    from tests.unit.worlds import World

    # capture arming opens each replica as TritonControl is opened: ``with connect(url) as triton``
    monkeypatch.setattr(FakeTarget, "__enter__", lambda self: self, raising=False)
    monkeypatch.setattr(FakeTarget, "__exit__", lambda self, *exc: None, raising=False)
    world = World(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    world.env = replace(world.env, shadow=Shadow(captures=str(traces)))
    frozen = threading.Event()
    plain = world.fleet.handle

    def handle(target: Any, call: Any) -> None:
        if call.method == "trace" and not frozen.is_set():
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            frozen.wait(30)  # the replica does not answer
        plain(target, call)

    world.fleet.handle = handle  # type: ignore[method-assign]  # the targets are made with it
    with sigterm_raises():
        result = world.promote("pre", "1")
    frozen.set()
    assert result.ok
    assert world.registry.models.aliases("pre").get("test") == "1"
    assert "promoted; capture arming interrupted on t0:8001 (SIGTERM)" in result.notes


def test_the_repro_tables_load_as_the_issue_asks(tmp_path: Path) -> None:
    """mlreg.toml as the issue tried it: rate/count without captures on the local stack (was:
    "replay skipped: the environment names no captures", promoted) -- now the stack's replicas'
    trace folders; the same table on another store is refused, as is captures = the stack."""
    from pipelines.promote.environments import load_environments

    settings = _settings(tmp_path)
    toml = tmp_path / "mlreg.toml"
    toml.write_text("[environments.local.shadow]\nrate = 1\ncount = 100\n")
    shadow = load_environments(settings)["local"].shadow
    assert shadow is not None
    assert (shadow.captures, shadow.stack) == ("", str(settings.stack_dir))
    toml.write_text(
        f'[environments.prod]\nstore = "{tmp_path / "store"}"\n[environments.prod.shadow]\nrate = 1\n'
    )
    with pytest.raises(UsageError, match="no captures location"):
        load_environments(settings)
    prod = f'[environments.prod]\nstore = "{tmp_path / "store"}"\n'
    toml.write_text(prod + '[environments.prod.shadow]\ncaptures = ".mlreg/stack"\n')
    with pytest.raises(UsageError, match="overlaps MLREG_HOME"):
        load_environments(settings)


# -- review of issue 44 (F6, F7, F10 and the residual list) ---------------------------------------


def test_a_request_id_repeating_keys_is_forged_not_a_capture_of_another_model(tmp_path: Path) -> None:
    """F6: an id ``x","model_name":"m","model_version":1,"request_id":"y`` on a request to another
    model made ``json.loads`` keep the last keys: a capture of m v1 from another model's answers.
    Triton never writes a key twice: the file is forged, counted and named."""
    traces = tmp_path / "traces"
    write_honest(traces, 3)
    relabel = 'x","model_name":"m","model_version":1,"request_id":"y'
    zeros = np.zeros((1, 4), np.float32)
    other = triton_file(40, relabel, zeros, np.zeros((1, 1), np.float32)).replace(
        b'"model_name":"m"', b'"model_name":"other"', 1
    )
    (traces / "trace.json.40").write_bytes(other)
    reading = read_captures(str(traces), "m", "1", 100)
    assert [r.request_id for r in reading.requests] == ["c0", "c1", "c2"]  # no "y"
    assert (reading.forged_files, reading.skipped[DUPLICATE_KEY]) == (1, 1)
    assert reading.skipped[FORGED] == 1
    assert load_records(other, Reading()) is None  # not parsed at all
    escaped = other.replace(b'"model_name":"m"', b'"model\\u005fname":"m"', 1)  # the same key, spelt apart
    assert escaped.count(b'"model_name"') == 1
    reading = Reading()
    assert load_records(escaped, reading) is None
    assert reading.skipped[DUPLICATE_KEY] == 1


def test_one_client_repeating_a_request_cannot_fill_the_sample(tmp_path: Path) -> None:
    """F7: 60 captures of one all-zero request filled a sample of 50 ("50 honest, 1 distinct").
    Each distinct input is judged once, min_captures counts distinct inputs, and the result says
    "N captures, D distinct"."""
    traces = tmp_path / "traces"
    zeros = np.zeros((1, 4), np.float32)
    for n in range(60):
        (traces).mkdir(exist_ok=True)
        (traces / f"trace.json.{n}").write_bytes(
            triton_file(n + 1, f"flood{n}", zeros, np.zeros((1, 1), np.float32))
        )
    write_honest(traces, 10, start=100)
    reading = read_captures(str(traces), "m", "1", 50)
    assert (reading.captured, len(reading.requests)) == (70, 11)  # the flood is one input
    assert len({r.inputs["X"].tobytes() for r in reading.requests}) == 11
    shadow = Shadow(captures=str(traces), count=500, min_captures=20)
    found, _ = replay_step(_step(), "1", (_model(1.0), "m"), _model(1.0), shadow)
    assert (found.ok, found.captures, found.distinct) == (False, 70, 11)
    assert found.verdict.startswith("inconclusive: 11 captured request(s)")
    assert "(70 captures, 11 distinct)" in found.line()
    write_honest(traces, 30, start=200, seed=9)
    wrong, _ = replay_step(_step(), "1", (_model(5.0), "m"), _model(1.0), shadow)
    assert (wrong.ok, wrong.judged, wrong.captures, wrong.distinct) == (False, 41, 100, 41)
    # every input but the flood's zeros (0 x 5 = 0) diverges
    assert "on 40 of 41 captured requests (97.6%) (100 captures, 41 distinct)" in wrong.line()


FIXTURE = Path(__file__).parents[1] / "fixtures" / "ensemble_trace.json"


def test_a_real_ensemble_trace_is_honest_and_only_the_request_sent_is_replayed(tmp_path: Path) -> None:
    """F10: the file Triton 2.51 (the wheel's tritonserver) wrote for one request to an armed
    ensemble ``pipe`` (python members ``double`` then ``plus1``): three trace ids, the children's
    model records with ``"parent_id":1``.  Not forged; the request sent (pipe's) is the capture,
    the children checked and counted, never replayed."""
    data = FIXTURE.read_bytes()
    records = load_records(data, Reading())
    assert records is not None
    assert sorted({r["id"] for r in records}) == [1, 2, 3]
    assert sorted(r.get("parent_id", 0) for r in records if "model_name" in r) == [0, 1, 1]
    reading = Reading()
    found = parse_trace(records, "trace.json.0", reading)
    assert (reading.forged, reading.skipped) == (0, {CHILDREN: 2})
    assert found is not None
    assert (found.model, found.version, found.request_id) == ("pipe", "1", "client-ensemble-armed")
    assert found.inputs["X"].tolist() == [[1.0, 2.0]]
    assert found.outputs["Z"].tolist() == [[3.0, 5.0]]
    assert found.source == "trace.json.0#1"
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "trace.json.0").write_bytes(data)
    assert read_captures(str(traces), "double", "1", 10).requests == []  # a child: never replayed
    assert len(read_captures(str(traces), "pipe", "1", 10).requests) == 1


def _text(records: list[dict[str, Any]]) -> bytes:
    import json

    return json.dumps(records).encode()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda r: r.update(parent_id=9) if r.get("model_name") == "double" else None,
            "a parent not in the file",
        ),
        (lambda r: r.pop("parent_id") if r.get("model_name") == "plus1" else None, "a second root"),
        (
            lambda r: r.update(request_id="other") if r.get("model_name") == "plus1" else None,
            "another request id",
        ),
        (lambda r: r.update(parent_id=3) if r.get("model_name") == "pipe" else None, "no root at all"),
        (
            lambda r: r.update(parent_id="1") if r.get("model_name") == "double" else None,
            "a parent_id string",
        ),
        (
            lambda r: r.pop("model_name")
            and r.pop("model_version")
            and r.pop("request_id")
            and r.pop("parent_id")
            if r.get("model_name") == "double"
            else None,
            "a child without its model record",
        ),
    ],
)
def test_a_family_triton_never_writes_is_forged(change: Any, why: str) -> None:
    import json

    records = json.loads(FIXTURE.read_bytes())
    for record in records:
        change(record)
    reading = Reading()
    assert parse_trace(records, "trace.json.0", reading) is None, why
    assert reading.forged_files == 1, why
    assert reading.forged >= 1, why


def test_a_child_trace_forged_through_a_plain_request_id_is_never_replayed(tmp_path: Path) -> None:
    """A request to a plain model whose id appends a whole fake child trace (parent_id naming the
    real one, inputs and outputs of zeros, another model's name): the fake child is never judged --
    only the request sent is, as Triton wrote it."""
    zeros = np.zeros((1, 4), np.float32)
    child = triton_file(8, "c", zeros, np.zeros((1, 1), np.float32), version=5).decode()[1:-1]
    child = child.replace('"request_id":"c"}', '"request_id":"c","parent_id":7}')
    injected = 'c"},' + child + ',{"id":8,"model_version":5,"parent_id":7,"request_id":"c","model_name":"'
    x = np.ones((1, 4), np.float32)
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "trace.json.7").write_bytes(triton_file(7, injected, x, x.sum(axis=1, keepdims=True)))
    assert read_captures(str(traces), "m", "5", 10).requests == []  # the fake child: never a capture
    reading = read_captures(str(traces), "m", "1", 10)
    assert reading.forged_files == 1  # its second model record for trace 8: not Triton's


def test_a_capture_swapped_for_a_link_a_fifo_or_a_larger_file_is_not_followed(tmp_path: Path) -> None:
    """Residual: a name listed, then swapped before the read -- a symlink is not followed, a FIFO
    not waited on, and a file grown past the bound is read to ``limit`` + 1 bytes only."""
    traces = tmp_path / "traces"
    write_honest(traces, 1)
    captures = Captures(str(traces))
    secret = tmp_path / "secret.json"
    secret.write_text("[]")
    (traces / "trace.json.5").symlink_to(secret)
    with pytest.raises(OSError, match="symbolic link"):  # ELOOP: O_NOFOLLOW
        captures.read("trace.json.5")
    os.mkfifo(traces / "trace.json.6")
    began = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        captures.read("trace.json.6")  # no writer: a blocking open would never return
    assert time.monotonic() - began < 2
    (traces / "trace.json.7").write_bytes(b"x" * 5000)
    assert len(captures.read("trace.json.7", limit=1000)) == 1001
    assert captures.read("trace.json.0").startswith(b"[")


def _retaining_world(tmp_path: Path) -> Any:
    from dataclasses import replace

    from tests.unit.worlds import MEMBER, World

    world = World(tmp_path)
    world.env = replace(world.env, keep=1)
    world.registry.add("pre", "2", MEMBER.format(name="pre", src="IN", dst="MID"))
    assert world.promote("pre", "1").ok
    return world


def test_retain_after_record_is_bounded_and_a_sigterm_keeps_the_real_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retain`` after record: a store that freezes while the version beyond the window is archived
    (a stand-in: a frozen S3 copy cannot be provoked on a local store) is left behind within its
    bound, noted; a real SIGTERM then ends the wait -- promoted, the alias moved, exit 0's note."""
    from mlreg.cli.signals import sigterm_raises
    from pipelines.promote import retention, runner

    world = _retaining_world(tmp_path)
    real, frozen = retention.retain, threading.Event()

    def freezing(ctx: Any) -> Any:
        frozen.wait(30)
        return real(ctx)

    monkeypatch.setattr(runner.retention, "retain", freezing)
    monkeypatch.setattr(runner, "RETAIN_S", 0.5)
    began = time.monotonic()
    result = world.promote("pre", "2")
    assert time.monotonic() - began < 20
    assert result.ok
    assert world.registry.models.aliases("pre").get("test") == "2"
    assert (
        f"promoted; retention did not finish within 0.5 s on {world.env.store}: left behind" in result.notes
    )
    frozen.set()

    world2 = _retaining_world(tmp_path / "two") if (tmp_path / "two").mkdir() is None else None
    assert world2 is not None
    frozen2 = threading.Event()

    def signalled(ctx: Any) -> Any:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        frozen2.wait(30)
        return real(ctx)

    monkeypatch.setattr(runner.retention, "retain", signalled)
    monkeypatch.setattr(runner, "RETAIN_S", 30.0)
    with sigterm_raises():
        began = time.monotonic()
        result = world2.promote("pre", "2")
        elapsed = time.monotonic() - began
    frozen2.set()
    assert elapsed < 20
    assert result.ok
    assert world2.registry.models.aliases("pre").get("test") == "2"
    assert "promoted; retain interrupted (SIGTERM)" in result.notes


def test_each_promotion_makes_its_own_nonce_gives_it_to_its_triton_clients_and_records_it_nowhere(
    tmp_path: Path,
) -> None:
    """Residual: the nonce was one per process; now one per promotion, made when it starts, on
    the Triton clients it connects (what sends mlreg's requests) and in its shadow settings (what
    leaves them out), and in no result."""
    from dataclasses import replace

    from pipelines.core.context import Options
    from pipelines.promote.runner import Promotion, _stamped
    from pipelines.triton.control import TritonControl
    from tests.unit.worlds import MEMBER, World

    world = World(tmp_path)
    world.env = replace(world.env, shadow=Shadow(captures=str(tmp_path / "traces")))
    world.registry.add("pre", "2", MEMBER.format(name="pre", src="IN", dst="MID"))
    owns = []
    for version in ("1", "2"):
        promotion = Promotion(
            world.settings, world.env, world.registry, Options(skip_quality=True), connect=world.fleet.connect
        )
        result = promotion.run("pre", version)
        assert result.ok
        assert promotion.ctx is not None
        assert promotion.ctx.env.shadow is not None
        own = promotion.ctx.env.shadow.own
        assert own.startswith("mlreg-")
        assert len(own) >= len("mlreg-") + 32
        assert own not in str(result.to_dict())
        assert own not in repr(promotion.ctx.env)
        owns.append(own)
    assert owns[0] != owns[1]  # per promotion
    assert world.env.shadow is not None
    assert world.env.shadow.own == ""  # the environment itself unchanged
    nonce = RequestNonce()
    client = _stamped(lambda url: TritonControl(url), nonce)("127.0.0.1:1")  # no call is made
    try:
        assert client.nonce is nonce  # type: ignore[attr-defined]
    finally:
        client.close()  # type: ignore[attr-defined]
    assert nonce.request_id().startswith(nonce.prefix)
