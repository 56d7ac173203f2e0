"""A reviewer's guarantee mutants (tests/mutants/reviewer.toml): the fast unit tests that kill the ones
the suite let through.  Each test builds the smallest state its guarantee speaks of, with the real
parts (a local store folder, the trace parser on bytes as Triton writes them), asserts that state,
and carries its positive control (the same state without the fault passes)."""

from __future__ import annotations

import json
import os
import py_compile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pipelines.checks import traces
from pipelines.checks.traces import CHILDREN, FORGED, Reading, load_records, parse_trace, tensor_of
from pipelines.core.litter import MAX_MARKER_BYTES, marker_key, remove_fenced_uploads
from pipelines.storage import Repository, lock_key, open_store
from pipelines.storage.closed_world import folder_entries
from pipelines.storage.locking import model_lock
from pipelines.storage.push import push_model
from pipelines.triton.control_key import MAX_KEY_FILE, control_key
from pipelines.triton.metrics import MAX_BODY, parse_answer
from registry.errors import PromotionError, StorageError, UsageError
from registry.signing import SignatureError, SigningKey, Trust, sign, verify
from tests.unit.worlds import scorer_8_and_10

MODEL, VERSION = "scorer", "9"
CONFIG = f'name: "{MODEL}"\nbackend: "python"\nversion_policy {{ specific {{ versions: [ {VERSION} ] }} }}\n'
MODEL_PY = "import triton_python_backend_utils as pb_utils\n\nSOURCE = 'verified'\n"
PLANTED = "print('PLANTED-RAN')\n"


def _seeded(tmp_path: Path) -> Repository:
    """scorer v9 pushed as mlreg pushes it, verified clean."""
    folder = tmp_path / "src" / MODEL
    (folder / VERSION).mkdir(parents=True)
    (folder / VERSION / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(CONFIG)
    store = open_store(tmp_path / "store")
    push_model(store, folder)
    store.versions.verify_version(MODEL, VERSION)
    return store


# -- A closed world: a sourceless module in a version folder --------------------------------------


def test_a_sourceless_module_in_a_version_folder_is_an_unexpected_entry(tmp_path: Path) -> None:
    """The version folder comes first on the python stub's sys.path, and Python imports a
    sourceless ``<name>.pyc`` found there: ``9/triton_python_backend_utils.pyc`` runs in place of
    the backend's module.  Only bytecode under ``__pycache__/`` is mlreg's to allow (dropped before
    a load); a ``.pyc`` anywhere else is a file the manifest does not list."""
    store = _seeded(tmp_path)
    source = tmp_path / "planted.py"
    source.write_text(PLANTED)
    compiled = tmp_path / "planted.pyc"
    py_compile.compile(str(source), str(compiled), doraise=True)
    store.objects.write(f"{MODEL}/{VERSION}/triton_python_backend_utils.pyc", compiled.read_bytes())
    store.versions.distrusted.clear()
    with pytest.raises(StorageError) as caught:
        store.versions.verify_version(MODEL, VERSION)
    assert "triton_python_backend_utils.pyc" in caught.value.message
    assert folder_entries(store.objects, MODEL, (VERSION,)) == [
        (f"{VERSION}/triton_python_backend_utils.pyc", f"is not listed in the manifest of {VERSION}/")
    ]
    # the control: removed again, the folder verifies and nothing is named
    (tmp_path / "store" / MODEL / VERSION / "triton_python_backend_utils.pyc").unlink()
    store.versions.distrusted.clear()
    store.versions.verify_version(MODEL, VERSION)
    assert folder_entries(store.objects, MODEL, (VERSION,)) == []


# -- Inputs we did not write: a trace file that is not Triton's ------------------------------------


def _stamp(trace: int, name: str, ns: int) -> str:
    return f'{{"id":{trace},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}'


def _tensor(trace: int, activity: str, name: str, data: str, shape: str) -> str:
    return (
        f'{{"id":{trace},"activity":"{activity}","tensor":{{"name":"{name}","data":"{data}",'
        f'"shape":"{shape}","dtype":"FP32"}}}}'
    )


def _model_record(trace: int, request_id: str, parent: int | None = None) -> str:
    parent_key = "" if parent is None else f',"parent_id":{parent}'
    return f'{{"id":{trace},"model_name":"m","model_version":1,"request_id":"{request_id}"{parent_key}}}'


def _request(trace: int, request_id: str, parent: int | None = None) -> list[str]:
    """One request's records as Triton 2.51 writes them (a model record, its stamps, its tensors)."""
    return [
        _stamp(trace, "HTTP_RECV_START", 10),
        _model_record(trace, request_id, parent),
        _stamp(trace, "REQUEST_START", 20),
        _stamp(trace, "QUEUE_START", 30),
        _tensor(trace, "TENSOR_QUEUE_INPUT", "X", "1,2,3,4", "1,4"),
        _tensor(trace, "TENSOR_BACKEND_OUTPUT", "Y", "10", "1,1"),
        _stamp(trace, "COMPUTE_START", 40),
        _stamp(trace, "COMPUTE_END", 50),
        _stamp(trace, "REQUEST_END", 60),
    ]


def _parsed(records: list[str]) -> tuple[object, Reading]:
    """What the capture reader makes of a file holding ``records``: its request (None: not judged)
    and the reading's counts."""
    reading = Reading()
    loaded = load_records(("[" + ",".join(records) + "]").encode(), reading)
    assert loaded is not None, reading.skipped
    return parse_trace(loaded, "trace.json.1", reading), reading


def test_the_honest_file_of_these_tests_is_one_judged_request() -> None:
    """The positive control of the forgery tests below: their base file is Triton's, judged."""
    found, reading = _parsed(_request(7, "c1"))
    assert found is not None
    assert (reading.forged, reading.forged_files, reading.skipped) == (0, 0, {})


def test_a_trace_file_stamping_one_activity_twice_is_forged_never_judged() -> None:
    """Triton stamps each activity once per trace: a second REQUEST_START (which would set the
    request's latency to anything) is not Triton's, so the file is forged, none of it judged."""
    found, reading = _parsed([*_request(7, "c1"), _stamp(7, "REQUEST_START", 1)])
    assert found is None
    assert (reading.forged, reading.forged_files) == (1, 1)
    assert reading.skipped == {FORGED: 1}


def test_a_trace_file_stamping_an_activity_triton_has_not_is_forged() -> None:
    """Each timestamp names one of Triton 2.51's activities; any other name is not its file."""
    found, reading = _parsed([*_request(7, "c1"), _stamp(7, "MODEL_MAGIC", 35)])
    assert found is None
    assert (reading.forged, reading.forged_files) == (1, 1)


def test_a_trace_file_with_a_second_input_set_is_forged() -> None:
    """One request has one input set: a second ``X`` (here zeros, what a wrong candidate would
    answer) under the same trace is never Triton's."""
    found, reading = _parsed([*_request(7, "c1"), _tensor(7, "TENSOR_QUEUE_INPUT", "X", "0,0,0,0", "1,4")])
    assert found is None
    assert (reading.forged, reading.forged_files) == (1, 1)


def test_an_ensemble_child_trace_must_follow_its_parent_and_carry_its_request_id() -> None:
    """An armed ensemble's request is one family: the root (no parent_id) and each step's child,
    numbered after its parent, with the root's request id.  The control: such a family is one
    request, its child counted and never replayed; a child numbered before its parent, or with
    another request id (what an id could forge), makes the file forged."""
    family, reading = _parsed([*_request(8, "c1"), *_request(9, "c1", parent=8)])
    assert family is not None
    assert (reading.forged, reading.skipped) == (0, {CHILDREN: 1})
    before, reading = _parsed([*_request(8, "c1"), *_request(7, "c1", parent=8)])
    assert before is None
    assert (reading.forged, reading.forged_files) == (len(_request(7, "c1")), 1)
    other, reading = _parsed([*_request(8, "c1"), *_request(9, "c2", parent=8)])
    assert other is None
    assert (reading.forged, reading.forged_files) == (len(_request(9, "c2")), 1)


def test_a_captured_tensor_over_the_bound_is_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor larger than MAX_TENSOR_BYTES (64 MiB) is never built from a capture.  The bound
    is lowered to 16 bytes here (a real 64 MiB capture would cost the test seconds and memory):
    four FP32 values (16 bytes) are replayed, five (20 bytes) are not."""
    assert traces.MAX_TENSOR_BYTES == 64 << 20  # the bound README states
    monkeypatch.setattr(traces, "MAX_TENSOR_BYTES", 16)
    four = tensor_of({"name": "X", "data": "1,2,3,4", "shape": "1,4", "dtype": "FP32"})
    assert four is not None
    assert four.shape == (1, 4)
    assert tensor_of({"name": "X", "data": "1,2,3,4,5", "shape": "1,5", "dtype": "FP32"}) is None


# -- Inputs we did not write: a control key file ------------------------------------------------------


def test_a_control_key_file_over_4_kib_is_no_key(tmp_path: Path) -> None:
    """A key is one word; a file of more than MAX_KEY_FILE characters holds something else and is
    refused, never sent (the control: one of exactly MAX_KEY_FILE characters is a key)."""
    assert MAX_KEY_FILE == 4096
    path = tmp_path / "control.key"
    path.write_text("k" * MAX_KEY_FILE + "\n")
    os.chmod(path, 0o600)
    key = control_key(environ={"MLREG_CONTROL_KEY_FILE": str(path)})
    assert key is not None
    assert key.value == "k" * MAX_KEY_FILE
    path.write_text("k" * (MAX_KEY_FILE + 1))
    with pytest.raises(UsageError, match="does not hold a control key") as caught:
        control_key(environ={"MLREG_CONTROL_KEY_FILE": str(path)})
    assert "k" * 64 not in caught.value.message  # never echoed


# -- Delete only what you made: an upload marker over its bound --------------------------------------

LITTER_CONFIG = 'name: "scorer"\nbackend: "python"\nversion_policy { specific { versions: [ 8 ] } }\n'


@pytest.mark.parametrize("padded", [False, True])
def test_an_upload_marker_over_4_kib_is_not_mlregs_and_removes_nothing(tmp_path: Path, padded: bool) -> None:
    """scorer v10 unserved, its marker naming another holder's lease: the next holder removes that
    upload (the control) -- unless the marker is over MAX_MARKER_BYTES, which mlreg never writes
    (~150 bytes): then it is not one of mlreg's, left and named, and the version stays."""
    store = scorer_8_and_10(tmp_path, LITTER_CONFIG)
    marker: dict[str, object] = {
        "model": "scorer",
        "version": "10",
        "owner": "ci@runner-7:99",
        "token": "f" * 24,
    }
    if padded:
        marker["at"] = " " * MAX_MARKER_BYTES  # valid, naming scorer/10, but past the bound
    raw = json.dumps(marker).encode()
    assert (len(raw) > MAX_MARKER_BYTES) is padded
    store.objects.write(marker_key("scorer", "10"), raw)
    with store.session.lock("scorer", owner="me@here:1", ttl=60):
        lines = remove_fenced_uploads(store, ["scorer"], {})
    if padded:
        assert lines == [
            f"{store.uri}: {marker_key('scorer', '10')} is not an upload marker mlreg wrote: left as it is "
            "(remove it by hand)"
        ]
        assert store.list_versions("scorer") == ["8", "10"]
        assert store.objects.read(marker_key("scorer", "10")) == raw
    else:
        assert lines == [
            f"scorer/10 removed from {store.uri}: uploaded by ci@runner-7:99's promotion, which lost its "
            "lock before it finished (a fenced promotion writes nothing, its undo included)"
        ]
        assert store.list_versions("scorer") == ["8"]
        assert store.objects.read(marker_key("scorer", "10")) is None


# -- Inputs we did not write: a metrics answer over its bound ------------------------------------------

METRICS = b'nv_inference_request_success{model="m",version="1"} 3\n'


def test_a_metrics_answer_over_32_mib_is_not_tritons() -> None:
    """A metrics answer is Triton's only when it holds an nv_ metric and is at most MAX_BODY (32
    MiB): a larger one, nv_ metric and all, is refused with its own cause, never parsed (the
    control: the same counters alone are read)."""
    assert MAX_BODY == 32 * 2**20
    assert parse_answer("http://t0:8002/metrics", METRICS)[("m", "1")].success == 3
    padded = METRICS + b"# " + b"x" * MAX_BODY + b"\n"
    with pytest.raises(PromotionError) as caught:
        parse_answer("http://t0:8002/metrics", padded)
    assert caught.value.message == (
        "http://t0:8002/metrics does not answer Triton's metrics: it answered more than 32 MiB"
    )
    assert caught.value.context["status"] == "not-triton"


# -- Locks: a verb never waits, and never hides a lock it left ------------------------------------------


def test_a_verb_refuses_a_lock_another_holder_has_at_once(tmp_path: Path) -> None:
    """A verb that writes under a model (store push, retire, repair...) takes its lock without
    waiting: a live lock of another holder is refused at once, naming the holder, not a wait."""
    store, other = Repository.local(tmp_path / "store"), Repository.local(tmp_path / "store")
    with other.session.lock("m", owner="ci@elsewhere:1", ttl=60):
        started = time.monotonic()
        with (
            pytest.raises(StorageError, match="model 'm' is locked by ci@elsewhere:1"),
            model_lock(store.session, "m"),
        ):
            pass
        assert time.monotonic() - started < 2.0  # at once (a wait would be seconds)
    with model_lock(store.session, "m") as lease:  # the control: released, it is taken
        assert lease.owner != "ci@elsewhere:1"


@pytest.mark.parametrize("left", [False, True])
def test_an_error_under_a_verbs_lock_names_the_lock_it_could_not_release(tmp_path: Path, left: bool) -> None:
    """The verb's own error stays, and names each lock its release could not remove (here for
    real: the lock object turned into a folder, which cannot be read as a lock); the control: a
    lock released leaves the message as it was, and no lock behind."""
    store = Repository.local(tmp_path / "store")
    lock = tmp_path / "store" / lock_key("m")

    def verb() -> None:
        with model_lock(store.session, "m"):
            if left:
                lock.unlink()
                lock.mkdir()
            raise UsageError("the verb's own error")

    with pytest.raises(UsageError) as caught:
        verb()
    if left:
        assert caught.value.message.startswith(
            f"the verb's own error; the lock of 'm' was left at {store.uri.rstrip('/')}/{lock_key('m')} ("
        )
        assert "mlreg store unlock m" in caught.value.message
        assert lock.is_dir()
    else:
        assert caught.value.message == "the verb's own error"
        assert not lock.exists()


# -- Signed model versions: a verification remembered is one under the same trust --------------------

SIGNED = {"model.py": "a" * 64, "config.pbtxt": "c" * 64}


def _ec_key(folder: Path, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / f"{name}.pem").write_bytes(private)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (folder / f"{name}.pub").write_bytes(public)


def test_a_signature_verified_under_one_trust_is_refused_under_another(tmp_path: Path) -> None:
    """mlreg remembers a verified signature (a version checked again costs a lookup, not a DSSE
    verification), keyed by the trusted key files as they are: the same bundle, verified first
    under the key that signed it, is refused under a trust that no longer holds that key -- another
    key file, or the trusted file's bytes replaced by another key's."""
    _ec_key(tmp_path, "signer")
    _ec_key(tmp_path, "other")
    bundle = sign(SIGNED, SigningKey(tmp_path / "signer.pem"), "scorer")
    trusted = Trust("required", (tmp_path / "signer.pub",))
    assert verify(bundle, SIGNED, trusted, "scorer v1").files == SIGNED  # remembered from here
    with pytest.raises(SignatureError, match="which is not trusted"):
        verify(bundle, SIGNED, Trust("required", (tmp_path / "other.pub",)), "scorer v1")
    (tmp_path / "signer.pub").write_bytes((tmp_path / "other.pub").read_bytes())  # the key rotated
    with pytest.raises(SignatureError, match="which is not trusted"):
        verify(bundle, SIGNED, trusted, "scorer v1")
