"""Repository stores against a real S3-compatible server (moto_server) and a local folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipelines.devstack import local_s3
from pipelines.devstack.local_s3 import S3Server
from pipelines.storage import open_store
from pipelines.storage.base import Repository, lock_key
from pipelines.storage.push import push_path
from pipelines.storage.s3 import S3Objects
from registry.errors import StorageError
from registry.manifest import sha256_file
from tests.conftest import ROOT
from tests.integration.stacks import TEARDOWN_GRACE

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    local_s3.create_bucket(s3_server.endpoint, name)
    return name


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_template_push_is_complete_and_idempotent(
    kind: str,
    built_repository: Path,
    s3_server: S3Server,
    tmp_path: Path,
    request,
) -> None:
    uri = (
        s3_server.store_uri(request.getfixturevalue("bucket"), "models/prod")
        if kind == "s3"
        else str(tmp_path / "store")
    )
    store = open_store(uri)
    first = push_path(store, built_repository)
    assert {r.model for r in first} == {p.name for p in built_repository.iterdir()}
    assert sum(r.bytes_sent for r in first) > 100_000
    assert store.list_models() == sorted(p.name for p in built_repository.iterdir())
    for model in store.list_models():
        assert store.list_versions(model) == ["1"]
        manifest = store.versions.read_manifest(model, "1")
        version = built_repository / model / "1"
        assert manifest is not None
        assert manifest.files == {
            p.relative_to(version).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
            for p in version.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        config = built_repository / model / "config.pbtxt"
        assert manifest.config == {"sha256": sha256_file(config), "size": config.stat().st_size}
        assert store.versions.verify_version(model, "1").status == "verified"
    # the ensemble's empty version folder exists (its manifest doubles as S3's placeholder)
    assert store.versions.read_manifest("ensemble_multi_modal_model", "1").files == {}
    again = push_path(store, built_repository)
    assert sum(r.bytes_sent for r in again) == 0
    assert all(r.sent == [] for r in again)
    sent: list[int] = []
    (built_repository / "table_data_preprocess" / "1" / "extra.txt").write_text("new")
    try:  # a stored version is written once: a file more is other bytes
        with pytest.raises(
            StorageError, match=r"(?s)table_data_preprocess v1 is already stored with other.*extra"
        ):
            push_path(store, built_repository / "table_data_preprocess", progress=sent.append)
    finally:
        (built_repository / "table_data_preprocess" / "1" / "extra.txt").unlink()
    assert sent == []
    assert store.versions.verify_version("table_data_preprocess", "1").status == "verified"


def test_names_triton_cannot_read_from_s3_are_refused(tmp_path: Path, s3_server, bucket) -> None:
    bad = tmp_path / "my model"
    (bad / "1").mkdir(parents=True)
    (bad / "config.pbtxt").write_text('name: "my model"\n')
    store = open_store(s3_server.store_uri(bucket))
    with pytest.raises(
        StorageError,
        match=r"model name 'my model' cannot be stored: path parts "
        r"may only use letters, digits",
    ):
        push_path(store, tmp_path)
    assert store.list_models() == []


def test_interrupted_upload_resumes_sending_only_what_is_missing(
    tmp_path: Path,
    s3_server: S3Server,
    bucket: str,
) -> None:
    """The S3 server freezes (SIGSTOP) mid-upload: a real fault, then SIGCONT and rerun."""
    version = tmp_path / "big_model" / "1"
    version.mkdir(parents=True)
    for i in range(4):
        (version / f"part{i}.bin").write_bytes(os.urandom(2 << 20))
    store = Repository(S3Objects(bucket, "p", s3_server.endpoint, read_timeout=1, retries=1))
    done: list[int] = []

    frozen: list[bool] = []

    def freeze_after_first_file(n: int) -> None:
        # Files go one after another and each is verified before the next starts, so the first
        # byte counted beyond the first file means part0 is stored: freeze the server then (once).
        done.append(n)
        if sum(done) > 2 << 20 and not frozen:
            frozen.append(True)
            os.kill(s3_server.pid, signal.SIGSTOP)

    try:
        with pytest.raises(StorageError, match=r"cannot (upload|verify) 'big_model/1/part\d\.bin'"):
            store.versions.put_version("big_model", "1", version, progress=freeze_after_first_file)
    finally:
        os.kill(s3_server.pid, signal.SIGCONT)
    assert store.versions.read_manifest("big_model", "1") is None
    resumed = Repository(S3Objects(bucket, "p", s3_server.endpoint)).versions.put_version(
        "big_model", "1", version
    )
    assert "part0.bin" in resumed.skipped
    assert sorted(resumed.sent + resumed.skipped) == [f"part{i}.bin" for i in range(4)]
    assert len(resumed.sent) < 4
    manifest = store.versions.read_manifest("big_model", "1")
    assert manifest is not None
    assert manifest.files == {
        f"part{i}.bin": {"sha256": sha256_file(version / f"part{i}.bin"), "size": 2 << 20} for i in range(4)
    }


LOCK_HOLDER = """
import sys, time
from pipelines.storage import open_store
store = open_store(sys.argv[1])
with store.session.lock("image_model", owner="holder-process", ttl=60):
    print("locked", flush=True)
    sys.stdin.readline()  # held until the test says (a fixed sleep ran out on a busy machine)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""


def test_lock_contention_between_two_processes(s3_server: S3Server, bucket: str) -> None:
    uri = s3_server.store_uri(bucket, "repo")
    store = open_store(uri)
    with subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, uri, "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    ) as holder:
        assert holder.stdin is not None
        assert holder.stdout is not None
        try:
            assert holder.stdout.readline().strip() == "locked"
            with (
                pytest.raises(StorageError, match="model 'image_model' is locked by holder-process"),
                store.session.lock("image_model", owner="me"),
            ):
                pass
            holder.stdin.write("release\n")  # it lets go a second later, while this waits for it
            holder.stdin.flush()
            with store.session.lock("image_model", owner="me", wait=30) as mine:
                assert mine.owner == "me"
                assert store.session.read_lock("image_model").owner == "me"
                assert holder.stdout.readline().strip() == "released"
            assert holder.wait(timeout=30) == 0
        finally:
            holder.kill()
    assert store.session.read_lock("image_model") is None


def test_a_stale_lock_is_taken_over(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    with store.session.lock("m", owner="crashed", ttl=-1):
        with store.session.lock("m", owner="next") as mine:
            assert mine.owner == "next"
            # the lock stays out of the model folder (Triton would reload every version) and
            # is no folder at the root (Triton would take it for a model)
            assert not (tmp_path / "m").exists()
            assert store.list_models() == []
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Repository:
    if request.param == "local":
        return open_store(str(tmp_path / "repo"))
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("bucket")
    return open_store(server.store_uri(bucket, f"cas-{tmp_path.name}"))


def test_compare_and_swap_only_replaces_what_was_read(any_store: Repository) -> None:
    assert any_store.objects.create("k.json", b"one")
    assert not any_store.objects.create("k.json", b"two")
    data, token = any_store.objects.read_versioned("k.json") or (b"", "")
    assert data == b"one"
    assert any_store.objects.replace("k.json", b"two", token)
    assert not any_store.objects.replace("k.json", b"three", token)  # the token names the old object
    any_store.objects.delete_if_unchanged("k.json", token)  # stale token: nothing deleted
    data, fresh = any_store.objects.read_versioned("k.json") or (b"", "")
    assert data == b"two"
    any_store.objects.delete_if_unchanged("k.json", fresh)
    assert any_store.objects.read_versioned("k.json") is None
    assert not any_store.objects.replace("k.json", b"four", fresh)  # gone: nothing to replace


TAKE_OVER = """
import sys, time
from pathlib import Path
from pipelines.storage import open_store
store, go, release = open_store(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[2] + ".release")
print("ready", flush=True)
deadline = time.monotonic() + 120
while not go.exists():
    assert time.monotonic() < deadline, "never told to go"
    time.sleep(0.001)
try:
    with store.session.lock("m", owner=f"taker-{sys.argv[3]}"):
        print("won", flush=True)
        while not release.exists():  # held until every other taker has tried
            assert time.monotonic() < deadline, "never released"
            time.sleep(0.005)
except Exception as exc:
    print("lost", exc, flush=True)
"""


def test_one_of_many_takes_over_a_stale_lock(any_store: Repository, tmp_path: Path) -> None:
    """Six processes find the same expired lock at once: exactly one may take it over."""
    assert any_store.objects.create(
        lock_key("m"), json.dumps({"owner": "gone@elsewhere:1", "expires_at": 0}).encode()
    )
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TAKE_OVER, any_store.uri, str(go), str(i)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
            cwd=ROOT,
        )
        for i in range(6)
    ]
    for proc in procs:  # all of them imported and waiting
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    go.touch()
    firsts = [proc.stdout.readline() for proc in procs if proc.stdout is not None]  # won, or lost
    (tmp_path / "go.release").touch()
    outputs = [first + p.communicate(timeout=60)[0] for first, p in zip(firsts, procs, strict=True)]
    winners = [o for o in outputs if o.startswith("won")]
    assert len(winners) == 1, outputs
    assert all("is locked by taker-" in o for o in outputs if not o.startswith("won")), outputs
    assert any_store.session.read_lock("m") is None  # the winner released it


def test_missing_bucket_and_unreachable_endpoint(s3_server: S3Server) -> None:
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        open_store(s3_server.store_uri("no-such-bucket")).list_models()
    from pipelines.devstack.local_triton import free_port

    dead = Repository(S3Objects("b", "", f"http://127.0.0.1:{free_port()}", retries=1))
    with pytest.raises(StorageError, match=r"cannot list '': EndpointConnectionError"):
        dead.list_models()


def test_wrong_credentials_are_named(tmp_path: Path, monkeypatch) -> None:
    """A second moto_server with authentication on: bogus keys are rejected for real."""
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    server, process = local_s3.start_s3(tmp_path / "moto-auth.log")
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        store = Repository(S3Objects("models", "", server.endpoint, retries=1))
        with pytest.raises(StorageError, match="credentials rejected"):
            store.list_models()
    finally:
        local_s3.stop_s3(server.pid, process)


# -- bytes verified before a load, on a real S3 server -------------------------------------------


def s3_version(tmp_path: Path, s3_server: S3Server, bucket: str) -> tuple[Repository, Path, str]:
    folder = tmp_path / "src" / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    (folder / "1" / "model.py").write_text("SIGN = 1\n")
    (folder / "1" / "weights.bin").write_bytes(os.urandom(20 << 20))  # multipart upload
    uri = s3_server.store_uri(bucket, f"v-{tmp_path.name}")
    store = open_store(uri, digest_cache=tmp_path / "digests.json")
    store.versions.put_version("m", "1", folder / "1")
    return store, folder, uri


def test_an_s3_object_replaced_with_its_sha256_metadata_kept_is_refused(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    store, folder, uri = s3_version(tmp_path, s3_server, bucket)
    proven = store.versions.verify_version("m", "1", store.versions.read_manifest("m", "1").digest)
    assert (proven.reused, proven.hashed_bytes) == (2, 0)  # the ETags recorded at upload prove it
    assert isinstance(store.objects, S3Objects)
    key = f"{store.objects.prefix}/m/1/model.py"
    head = store.objects.client.head_object(Bucket=bucket, Key=key)
    store.objects.client.put_object(Bucket=bucket, Key=key, Body=b"SIGN = 7\n", Metadata=head["Metadata"])
    assert store.objects.client.head_object(Bucket=bucket, Key=key)["Metadata"] == {
        "sha256": sha256_file(folder / "1" / "model.py")
    }
    # a fresh process with the same digest cache: the object's ETag no longer matches the record
    again = open_store(uri, digest_cache=tmp_path / "digests.json")
    registered = sha256_file(folder / "1" / "model.py")
    with pytest.raises(
        StorageError,
        match=r"m/1 does not match what was registered; refusing to use it:\n  model\.py changed: its "
        rf"sha256 differs from the manifest \(expected sha256 {registered}, found sha256 [0-9a-f]{{64}}\)",
    ):
        again.versions.verify_version("m", "1")
    assert again.objects.read("m/1/model.py") == b"SIGN = 7\n"  # refused, nothing changed
    repaired = again.versions.put_version("m", "1", folder / "1")
    assert (repaired.sent, repaired.skipped) == (["model.py"], ["weights.bin"])
    assert again.versions.verify_version("m", "1").status == "verified"


def test_without_a_recorded_etag_s3_bytes_are_hashed_once(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    store, folder, uri = s3_version(tmp_path, s3_server, bucket)
    elsewhere = open_store(uri, digest_cache=tmp_path / "other-machine.json")
    first = elsewhere.versions.verify_version("m", "1")
    assert (first.reused, first.hashed_bytes) == (0, (20 << 20) + 9)
    second = open_store(uri, digest_cache=tmp_path / "other-machine.json").versions.verify_version("m", "1")
    assert (second.reused, second.hashed_bytes) == (2, 0)
    full = elsewhere.versions.verify_version("m", "1", full=True)
    assert full.hashed_bytes == (20 << 20) + 9


def test_a_wrong_sha256_in_an_s3_manifest_is_refused(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    store, folder, _ = s3_version(tmp_path, s3_server, bucket)
    registered = store.versions.read_manifest("m", "1").digest
    data = json.loads(store.objects.read("m/1/.mlreg-manifest.json") or b"")
    data["files"]["weights.bin"]["sha256"] = "f" * 64
    store.objects.write("m/1/.mlreg-manifest.json", json.dumps(data).encode())
    with pytest.raises(StorageError, match=r"(?s)\.mlreg-manifest\.json was edited.*weights\.bin changed"):
        store.versions.verify_version("m", "1", registered)


def test_triton_starts_on_a_fresh_s3_prefix_only_after_init(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    from pipelines.devstack import local_triton
    from pipelines.storage import ensure_root
    from registry.errors import StackError
    from registry.settings import Settings

    uri = s3_server.store_uri(bucket, "fresh/staging")
    standins = Settings.from_env().backends_source
    with pytest.raises(StackError, match=r"tritonserver exited with code \d+ while starting"):
        local_triton.start_server(uri, tmp_path / "bare", standins, timeout=120)
    assert ensure_root(uri) is True
    assert ensure_root(uri) is False  # not empty any more: left alone
    info, process = local_triton.start_server(uri, tmp_path / "state", standins, timeout=120)
    try:
        from pipelines.triton.control import TritonControl

        with TritonControl(info.grpc_url) as triton:
            assert triton.model_states() == {}
    finally:
        local_triton.stop_pid(info.pid, info.shm_prefix, grace=TEARDOWN_GRACE, process=process)
    assert open_store(uri).list_models() == []


def test_stack_up_on_an_empty_s3_prefix_marks_its_root(
    tmp_path: Path, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.devstack import stack
    from registry.settings import Settings

    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    uri = s3_server.store_uri(bucket, "new-env")
    try:
        status = stack.stack_up(settings, repository=uri)
        assert status.running
        assert status.info is not None
        assert status.info.repository == uri
    finally:
        stack.stack_down(settings)
    assert json.loads(open_store(uri).objects.read(".mlreg-root.json") or b"{}")["store"] == uri


def test_on_a_versioned_bucket_the_version_id_is_part_of_the_proof(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    S3Objects(bucket, "", s3_server.endpoint).client.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    store, folder, uri = s3_version(tmp_path, s3_server, bucket)
    assert isinstance(store.objects, S3Objects)
    recorded = store.objects.digests.entries[store.objects.cache_key("m/1/model.py")]
    assert recorded[2] not in {"null", "None"}  # the object's VersionId was recorded at upload
    assert store.versions.verify_version("m", "1").reused == 2
    key = f"{store.objects.prefix}/m/1/model.py"
    head = store.objects.client.head_object(Bucket=bucket, Key=key)
    store.objects.client.put_object(Bucket=bucket, Key=key, Body=b"SIGN = 7\n", Metadata=head["Metadata"])
    with pytest.raises(StorageError, match=r"model\.py changed: its sha256 differs from the manifest"):
        open_store(uri, digest_cache=tmp_path / "digests.json").versions.verify_version("m", "1")
