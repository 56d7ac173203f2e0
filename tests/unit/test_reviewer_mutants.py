"""A second reviewer's guarantee mutants (issue 46, tests/mutants/reviewer2.toml): each test here
kills a mutant that every existing test let through -- the relay's webhook checks, the fenced
upload's proof of ownership, the trace files' deletes and the metrics' counter resets.  All in
process, on real parts: the relay's wire functions, a local store folder, a captures folder."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlreg.cli.main import _configure_logging
from mlreg.cli.promote_render import batch_stage, failure_lines
from mlreg.cli.sink import render_table
from mlreg.relay import record
from mlreg.relay.wire import MAX_BODY, Refused, parse, payload, sign, verify
from pipelines.checks.capture import Captures, purge
from pipelines.core.litter import marker_key, remove_fenced_uploads
from pipelines.fleet.replicas import open_control, open_control_notes
from pipelines.storage.archive import archive_of, move_to_archive
from pipelines.storage.base import Repository
from pipelines.storage.local import LocalObjects
from pipelines.triton import metrics
from pipelines.triton.control import TritonControl
from registry.contracts.warmup import MB_VARIABLE, REQUESTS_VARIABLE, WarmupBound
from registry.errors import PromotionError, SettingsError, StorageError
from registry.settings import redact_uri
from tests.standin_triton import StandinFleet
from tests.unit.worlds import scorer_8_and_10

# -- the relay's webhook: signed with the secret, bounded, a storable model name ---------------------

SECRET = b"reviewer-relay-secret"
NOW = 1_800_000_000.0


def _headers(body: bytes, secret: bytes, delivery_id: str = "d-1") -> dict[str, str]:
    stamp = str(int(NOW))
    return {
        "x-mlflow-delivery-id": delivery_id,
        "x-mlflow-timestamp": stamp,
        "x-mlflow-signature": sign(secret, delivery_id, stamp, body),
    }


def test_a_delivery_signed_with_an_empty_secret_is_refused_by_a_relay_without_one() -> None:
    """Anyone can compute the HMAC with an empty key: a relay whose secret reads empty must refuse
    every delivery, never take the one signed with nothing."""
    body = payload("scorer", "champion", "2")
    with pytest.raises(Refused) as refused:
        verify(_headers(body, b""), body, b"", NOW, 300.0)
    assert refused.value.status == 401
    assert verify(_headers(body, SECRET), body, SECRET, NOW, 300.0).event is not None  # the control


@pytest.mark.parametrize("name", ["..", "."])
def test_an_alias_event_naming_a_dot_folder_as_its_model_is_refused(name: str) -> None:
    """``..`` matches the store's name characters but names the folder above: never a model."""
    with pytest.raises(Refused) as refused:
        parse(payload(name, "champion", "2"))
    assert refused.value.status == 400
    assert "storable model name" in refused.value.reason
    kind, event = parse(payload("scorer.v2", "champion", "2"))  # dots inside a name are fine
    assert (kind, event and event.model) == ("model_version_alias.created", "scorer.v2")


def test_a_signed_body_over_the_bound_is_refused_by_verify_itself() -> None:
    """The bound holds where the body is judged, not only in the HTTP layer's Content-Length check
    (a chunked request has none): a signed body one byte over it is 413, one at it is taken."""
    head = payload("scorer", "champion", "2")
    at_bound = head + b" " * (MAX_BODY - len(head))  # JSON allows trailing blanks
    assert verify(_headers(at_bound, SECRET), at_bound, SECRET, NOW, 300.0).event is not None
    over = at_bound + b" "
    with pytest.raises(Refused) as refused:
        verify(_headers(over, SECRET), over, SECRET, NOW, 300.0)
    assert refused.value.status == 413


# -- a fenced promotion's upload: removed only with its own proof, never while an ensemble pins it --

CONFIG = """name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy { specific { versions: [ 8 ] } }
"""
ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "scorer" model_version: 10
      input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } }
  ]
}
"""
FENCED = {"model": "scorer", "version": "10", "owner": "ci@runner-7:99", "token": "f" * 24, "at": 0}


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _store_with_fenced_upload(tmp_path: Path, marker: dict[str, object]) -> Repository:
    """scorer v8 serves (the config lists it); v10 was uploaded by a promotion that lost its lock,
    its marker at the root as ``marker``."""
    store = scorer_8_and_10(tmp_path, CONFIG)
    store.objects.write(marker_key("scorer", "10"), json.dumps(marker).encode())
    return store


def test_a_fenced_upload_an_ensemble_pins_only_loses_its_marker(tmp_path: Path) -> None:
    """README, "Delete only what you made": a version that serves or that an ensemble pins only
    loses its marker.  Here the store's ensemble pins scorer v10 (its config lists only v8)."""
    store = _store_with_fenced_upload(tmp_path, FENCED)
    store.session.write_config("ens", ENSEMBLE)
    files = [f for f in _files(tmp_path / "store") if f.startswith("scorer/10/")]
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], {})
    assert lines == []
    assert store.list_versions("scorer") == ["8", "10"]
    assert [f for f in _files(tmp_path / "store") if f.startswith("scorer/10/")] == files  # every file
    assert not (tmp_path / "store" / marker_key("scorer", "10")).exists()  # a stale marker, dropped


def test_a_marker_naming_another_version_is_no_proof_and_removes_nothing(tmp_path: Path) -> None:
    """README: an upload marker naming another version is not one of mlreg's (left, named).  The
    marker at v10's key says v11: v10 keeps its folder and the marker stays for a person to read."""
    store = _store_with_fenced_upload(tmp_path, {**FENCED, "version": "11"})
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], {})
    assert lines == [
        f"{tmp_path / 'store'}: {marker_key('scorer', '10')} is not an upload marker mlreg wrote: left as it "
        "is (remove it by hand)"
    ]
    assert store.list_versions("scorer") == ["8", "10"]
    assert (tmp_path / "store" / marker_key("scorer", "10")).exists()
    # the control: the marker naming its own version is the proof, and v10 goes
    store.objects.write(marker_key("scorer", "10"), json.dumps(FENCED).encode())
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        assert len(remove_fenced_uploads(store, ["scorer"], {})) == 1
    assert store.list_versions("scorer") == ["8"]


# -- trace files: only <name>.json.<n>, directly under a location or one replica folder below ------


def _captures_tree(tmp_path: Path) -> Path:
    location = tmp_path / "captures"
    for rel in ("trace.json.1", "replica-0/trace.json.2", "replica-0/deep/trace.json.3", "notes.txt"):
        (location / rel).parent.mkdir(parents=True, exist_ok=True)
        (location / rel).write_text("{}")
    (tmp_path / "beside.json.4").write_text("not mlreg's")  # outside the location, a trace's name
    return location


def test_deleting_trace_files_never_leaves_the_location_nor_takes_another_name(tmp_path: Path) -> None:
    """``Captures.delete`` is the one place prune and purge delete through: a name that climbs out
    (``..``), one two folders below, or one that is no trace file's is left, whoever asks."""
    location = _captures_tree(tmp_path)
    Captures(str(location)).delete(
        ["../beside.json.4", "replica-0/deep/trace.json.3", "notes.txt", "replica-0/trace.json.2"]
    )
    assert (tmp_path / "beside.json.4").read_text() == "not mlreg's"
    assert _files(location) == ["notes.txt", "replica-0/deep/trace.json.3", "trace.json.1"]


def test_purge_of_a_listing_at_any_depth_deletes_only_one_folder_below(tmp_path: Path) -> None:
    """An S3 prefix lists every key at every depth (no folders): purge judges each name.  A local
    object store plays the prefix here (the same listing and delete calls an S3 one answers)."""
    location = _captures_tree(tmp_path)
    captures = Captures(str(location))
    captures._s3 = LocalObjects(location)  # a real object store's listing: every depth
    assert sorted(f.name for f in captures.files()) == ["replica-0/trace.json.2", "trace.json.1"]
    captures.delete([f.name for f in captures.files()])
    assert _files(location) == ["notes.txt", "replica-0/deep/trace.json.3"]
    assert purge(str(location)).deleted == []  # the local location, listed by its own scan: nothing left


# -- metrics: any counter lower than at the previous scrape is a reset -----------------------------


def test_a_counter_one_lower_than_at_the_previous_scrape_is_a_reset() -> None:
    """A replica restarted and served 9 requests since: 10 -> 9 is a reset like 50 -> 3."""
    before = {("m", "1"): metrics.Counters(10, 0, 100)}
    after = {("m", "1"): metrics.Counters(9, 0, 100)}
    assert metrics.faults("m", {"1"}, before, after) == [
        'nv_inference_request_success{model="m",version="1"} went down from 10 to 9 '
        "(a counter reset: the replica restarted)"
    ]
    assert metrics.faults("m", {"1"}, before, before) == []  # unchanged is no reset


# -- the relay's record in the store: the environment's own, bounded ---------------------------------


def _record_bytes(env: str, padding: int = 0) -> bytes:
    doc = {"environment": env, "model": "scorer", "deployed": "4", "previous": "3", "at": 1.0, "history": []}
    return json.dumps(doc).encode() + b" " * padding


def test_a_relay_record_written_for_another_environment_is_refused(tmp_path: Path) -> None:
    """The rollback target production's relay reads is production's: a record naming staging at
    production's key (a store copied, a hand edit) is not one the relay wrote for it."""
    store = LocalObjects(tmp_path / "store")
    store.write(record.key("production", "scorer"), _record_bytes("staging"))
    with pytest.raises(StorageError, match="is not one the relay wrote"):
        record.read(store, "production", "scorer")
    store.write(record.key("production", "scorer"), _record_bytes("production"))  # the control
    assert record.read(store, "production", "scorer").previous == "3"


def test_a_relay_record_over_its_bound_is_refused_unparsed(tmp_path: Path) -> None:
    store = LocalObjects(tmp_path / "store")
    at_bound = _record_bytes("production")
    at_bound += b" " * (record.MAX_BYTES - len(at_bound))
    store.write(record.key("production", "scorer"), at_bound)
    assert record.read(store, "production", "scorer").deployed == "4"  # at the bound: read
    store.write(record.key("production", "scorer"), at_bound + b" ")
    with pytest.raises(StorageError, match="is not one the relay wrote"):
        record.read(store, "production", "scorer")


# -- the control-plane probe: a replica that does not answer is not counted as open ----------------


def _dead_address() -> str:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_replica_that_does_not_answer_the_probe_is_not_counted_open(tmp_path: Path) -> None:
    """README: "A replica that does not answer the probe is not counted as open."  An open
    stand-in tritonserver (real gRPC, no key) beside an address nobody answers: only the first
    is open, and the refusal names it alone."""
    dead = _dead_address()
    with StandinFleet(tmp_path / "store", 1, key=None) as fleet:
        opened = fleet.replicas[0].grpc_url
        assert open_control([dead, opened], 5.0) == [opened]
        assert open_control([dead], 5.0) == []
        targets = {url: TritonControl(url, timeout=5.0, key=None) for url in (dead, opened)}
        try:
            with pytest.raises(PromotionError) as refused:
                open_control_notes("prod", False, [dead, opened], targets.__getitem__, 5.0)
        finally:
            for target in targets.values():
                target.close()
    assert refused.value.context["replicas"] == [opened]
    assert dead not in refused.value.message


# -- no credential of a URI in a log line or a table cell ----------------------------------------------

CREDENTIALED = "s3://AKIAEXAMPLE:wJalrXUtnFEMIK7MDENG@minio:9000/bucket/p"


@pytest.fixture
def root_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """A handler on the root logger, as the CLI's basicConfig leaves one, removed after."""
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")  # _configure_logging sets it by default
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        for each in root.handlers:  # the filter the CLI added to the test runner's own handlers
            each.filters = [f for f in each.filters if getattr(f, "__name__", "") != "_redacting"]


def test_every_log_line_the_cli_configures_masks_a_uris_credentials(root_stream: io.StringIO) -> None:
    _configure_logging(False, quiet_tensorflow=False)
    logging.getLogger("pipelines.reviewer").warning("cannot reach %s", CREDENTIALED)
    line = root_stream.getvalue()
    assert "wJalrXUtnFEMIK7MDENG" not in line
    assert "AKIAEXAMPLE" not in line
    assert "cannot reach s3://***@minio:9000/bucket/p" in line


def test_a_table_cell_masks_a_uris_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    render_table(["model", "store"], [["scorer", CREDENTIALED]])
    out = capsys.readouterr().out
    assert "wJalrXUtnFEMIK7MDENG" not in out
    assert "s3://***@minio:9000/bucket/p" in out


def test_a_batchs_stage_and_failure_lines_mask_a_uris_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    """``promote --from-*`` and ``fleet sync`` print these on stderr even with --json."""
    batch_stage("deploy", "ok", 1.0, f"uploaded to {CREDENTIALED}")
    failure_lines([{"model": "scorer", "version": "2", "error": f"cannot read {CREDENTIALED}", "fix": ""}])
    err = capsys.readouterr().err
    assert "wJalrXUtnFEMIK7MDENG" not in err
    assert err.count("s3://***@minio:9000/bucket/p") == 2


@pytest.mark.parametrize(
    ("uri", "masked"),
    [
        ("https://h/p?access_token=abc123&x=1", "https://h/p?access_token=***&x=1"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Security-Token=FQoG%2Fabc&X-Amz-Date=1",
            "https://b.s3.amazonaws.com/k?X-Amz-Security-Token=***&X-Amz-Date=1",
        ),
        (
            "https://acct.blob.core.windows.net/c/b?sv=2024&sig=abc%3D",
            "https://acct.blob.core.windows.net/c/b?sv=2024&sig=***",
        ),
        ("https://h/p?client_secret=abc", "https://h/p?client_secret=***"),
    ],
)
def test_every_secret_query_parameter_is_masked(uri: str, masked: str) -> None:
    """README: every URI mlreg prints, records or raises is redacted -- a token in a query too."""
    assert redact_uri(f"cannot read {uri} (HTTP 403)") == f"cannot read {masked} (HTTP 403)"


# -- a load verifies every version its config makes Triton read: latest N and all ------------------

POLICY_CONFIG = 'name: "scorer"\nbackend: "python"\nversion_policy {{ {policy} }}\n'


def _three_versions(tmp_path: Path) -> tuple[Repository, dict[str, str]]:
    """scorer v1, v2, v3 stored by one writer; a fresh store object (a new run) that has checked
    nothing yet, and each version's manifest digest (what MLflow registered for it)."""
    root = tmp_path / "store"
    seed = Repository.local(root)
    digests = {}
    for version in ("1", "2", "3"):
        source = tmp_path / "src" / version
        source.mkdir(parents=True)
        (source / "model.py").write_text(f"SOURCE = 'v{version}'\n")
        seed.versions.put_version("scorer", version, source)
        digests[version] = seed.versions.read_manifest("scorer", version).digest  # type: ignore[union-attr]
    return Repository.local(root), digests


@pytest.mark.parametrize(
    ("policy", "read"),
    [("latest { num_versions: 2 }", "2"), ("all { }", "1")],
    ids=["latest-2", "all"],
)
def test_a_load_verifies_every_folder_its_policy_makes_triton_read(
    tmp_path: Path, policy: str, read: str
) -> None:
    """Only v3 was held to MLflow's digest in this run; a load whose version_policy makes Triton
    read v2 (latest 2) or v1 and v2 (all) too names a version never checked: refused, naming it."""
    store, digests = _three_versions(tmp_path)
    store.versions.verify_version("scorer", "3", digests["3"])
    config = POLICY_CONFIG.format(policy=policy)
    with pytest.raises(StorageError, match=rf"scorer v{read} was not checked in this run"):
        store.versions.verify_load("scorer", ("3",), config)
    store.versions.verify_load("scorer", ("3",), POLICY_CONFIG.format(policy="latest { num_versions: 1 }"))
    for version in ("1", "2"):  # the control: once each is held to its digest, the load goes
        store.versions.verify_version("scorer", version, digests[version])
    store.versions.verify_load("scorer", ("3",), config)


# -- the warmup bound: set only by its two variables, each a positive, finite number ----------------


@pytest.mark.parametrize("raw", ["inf", "1e999", "0", "0.0", "nan"])
@pytest.mark.parametrize("name", [MB_VARIABLE, REQUESTS_VARIABLE])
def test_a_warmup_bound_that_is_no_bound_is_refused(name: str, raw: str) -> None:
    """README, "Warmups are bounded": a value that is not a positive number is refused -- "inf"
    would lift the bound, 0 would refuse every declared warmup."""
    with pytest.raises(SettingsError, match=f"{name}={raw!r} is not a positive number"):
        WarmupBound.from_env({name: raw})
    assert WarmupBound.from_env({name: "0.5"}) != WarmupBound()  # the control: a small one is taken


# -- the archive: a version is live or in both places, never neither --------------------------------


def test_a_copy_to_the_archive_that_is_not_whole_keeps_the_live_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: a move to the archive leaves the version live or in both places, never neither.  On
    S3 (and a local archive on another file system) it is a copy, a check, then the delete: here
    the copy loses one object (a fake for a fault no local folder makes: an object gone between
    its copy and the check), so the check fails and the live copy stays, every file of it."""
    store = Repository.local(tmp_path / "store")
    source = tmp_path / "src" / "1"
    source.mkdir(parents=True)
    (source / "model.py").write_text("SOURCE = 'v1'\n")
    (source / "weights.bin").write_bytes(b"w" * 4096)
    store.versions.put_version("scorer", "1", source)
    live = _files(tmp_path / "store" / "scorer")
    archive = archive_of(store)
    copy = store.objects.copy_object_to
    monkeypatch.setattr(store.objects, "move_version_to", lambda *args: False)  # copy, check, delete
    monkeypatch.setattr(
        store.objects,
        "copy_object_to",
        lambda key, *rest: None if key.endswith("weights.bin") else copy(key, *rest),
    )
    with pytest.raises(
        StorageError, match="the archived copy of scorer/1 is not whole; the live copy is kept"
    ):
        move_to_archive(store, archive, "scorer", "1")
    assert _files(tmp_path / "store" / "scorer") == live
    assert store.list_versions("scorer") == ["1"]
    monkeypatch.setattr(store.objects, "copy_object_to", copy)  # the control: a whole copy moves it
    assert move_to_archive(store, archive, "scorer", "1") > 0
    assert store.list_versions("scorer") == []
    assert archive.list_versions("scorer") == ["1"]
