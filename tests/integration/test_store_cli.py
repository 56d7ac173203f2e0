"""`mlreg store push|ls` and `mlreg triton status`, as users type them."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.devstack import local_s3
from pipelines.storage.base import Repository
from pipelines.storage.push import push_model
from pipelines.storage.s3 import S3Objects
from pipelines.storage.verify import MANIFEST
from registry.errors import StorageError
from registry.manifest import sha256_file
from registry.signing import SIGNATURE_FILE
from tests.cli import CliRunner
from tests.conftest import TEMPLATE
from tests.integration.conftest import RunningTriton

pytestmark = pytest.mark.integration


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    return CliRunner()


def test_store_push_then_ls_on_s3(runner: CliRunner, built_repository: Path, s3_server) -> None:
    bucket = f"c-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    uri = s3_server.store_uri(bucket, "prod")
    first = runner.invoke(app, ["store", "push", str(built_repository), "--store", uri])
    assert first.exit_code == 0, first.output
    assert "image_model/1: sent 4 file(s)" in first.output
    second = runner.invoke(
        app, ["store", "push", str(built_repository / "image_model"), "--store", uri, "--json"]
    )
    assert json.loads(second.output)["versions"][0]["skipped"] != []
    assert json.loads(second.output)["versions"][0]["sent"] == []
    listing = runner.invoke(app, ["store", "ls", "--store", uri])
    assert listing.exit_code == 0
    assert any(line.split() == ["image_model", "1", "verified", "4"] for line in listing.output.splitlines())


def test_store_push_to_a_missing_bucket(runner: CliRunner, built_repository: Path, s3_server) -> None:
    result = runner.invoke(
        app, ["store", "push", str(built_repository), "--store", s3_server.store_uri("nope-bucket")]
    )
    assert result.exit_code == 5
    assert "bucket 'nope-bucket' does not exist" in result.output
    assert "fix: create the bucket or correct the store URI" in result.output


def test_triton_status_lists_loaded_models(runner: CliRunner, triton: RunningTriton) -> None:
    result = runner.invoke(app, ["triton", "status", "--url", triton.info.grpc_url])
    assert result.exit_code == 0, result.output
    assert f"{triton.info.grpc_url}: Triton 2." in result.output
    assert any(line.split() == ["image_model", "1:READY"] for line in result.output.splitlines())


def test_triton_status_of_an_unreachable_server(runner: CliRunner) -> None:
    from pipelines.devstack.local_triton import free_port

    url = f"127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["triton", "status", "--url", url])
    assert result.exit_code == 6
    assert result.output.startswith(f"{url}: unreachable: server metadata failed on {url}")


def test_store_verify_names_the_changed_file(runner: CliRunner, built_repository: Path, s3_server) -> None:
    bucket = f"v-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    uri = s3_server.store_uri(bucket, "prod")
    pushed = runner.invoke(
        app, ["store", "push", str(built_repository / "table_data_preprocess"), "--store", uri]
    )
    assert pushed.exit_code == 0, pushed.output
    good = runner.invoke(app, ["store", "verify", "table_data_preprocess", "1", "--store", uri, "--json"])
    assert good.exit_code == 0, good.output
    [version] = json.loads(good.stdout)["versions"]
    assert (version["status"], version["problems"]) == ("verified", [])
    assert version["hashed_bytes"] == version["bytes"] > 0  # verify re-hashes everything
    store = Repository(S3Objects(bucket, "prod", s3_server.endpoint))
    key = "prod/table_data_preprocess/1/model.py"
    original = store.objects.client.get_object(Bucket=bucket, Key=key)
    body = original["Body"].read()
    tampered = body.replace(b"def ", b"def  ", 1)[: len(body)]
    store.objects.client.put_object(Bucket=bucket, Key=key, Body=tampered, Metadata=original["Metadata"])
    bad = runner.invoke(app, ["store", "verify", "--store", uri, "--json"])
    assert bad.exit_code == 5
    document = json.loads(bad.stdout)
    assert document["ok"] is False
    [problem] = [p for v in document["versions"] for p in v["problems"]]
    assert problem["file"] == "model.py"
    assert problem["problem"] == "sha256"
    assert "error: s3://" in bad.stderr
    assert "1 of 1 version(s) do not match their manifest: table_data_preprocess/1/model.py" in bad.stderr
    human = runner.invoke(app, ["store", "verify", "table_data_preprocess", "--store", uri])
    assert human.exit_code == 5
    assert "table_data_preprocess/1: corrupt" in human.stdout
    assert "  model.py changed: its sha256 differs from the manifest" in human.stdout
    listing = runner.invoke(app, ["store", "ls", "--store", uri])
    assert any(
        line.split()[:3] == ["table_data_preprocess", "1", "corrupt"] for line in listing.stdout.splitlines()
    )


def test_store_verify_of_an_unknown_version(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["store", "verify", "nope", "3", "--store", str(tmp_path)])
    assert result.exit_code == 5
    assert f"error: {tmp_path}: nope has no version '3' in the store (stored: none)" in result.stderr
    assert "fix: see 'mlreg store ls'" in result.stderr


def test_store_ls_says_unverified_for_bytes_not_hashed_here(
    runner: CliRunner, built_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    pushed = runner.invoke(app, ["store", "push", str(built_repository / "image_model"), "--store", store])
    assert pushed.exit_code == 0, pushed.output
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "another-machine"))  # no digest cache there
    listing = runner.invoke(app, ["store", "ls", "--store", store, "--json"])
    assert [(r["model"], r["state"]) for r in json.loads(listing.stdout)["versions"]] == [
        ("image_model", "unverified")
    ]
    assert runner.invoke(app, ["store", "verify", "--store", store]).exit_code == 0
    listing = runner.invoke(app, ["store", "ls", "--store", store, "--json"])
    assert [r["state"] for r in json.loads(listing.stdout)["versions"]] == ["verified"]


def test_store_init_writes_the_root_marker_once(runner: CliRunner, s3_server) -> None:
    bucket = f"i-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    uri = s3_server.store_uri(bucket, "staging")
    first = runner.invoke(app, ["store", "init", "--store", uri, "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"store": uri, "marker": ".mlreg-root.json", "created": True}
    second = runner.invoke(app, ["store", "init", "--store", uri])
    assert (
        second.stdout.strip()
        == f"{uri}: root marker .mlreg-root.json already there; Triton can start on this repository"
    )


# -- a stored version is written once (real S3: moto_server) --------------------------------------


def _objects(store: Repository) -> dict[str, str]:
    """sha256 of every object under the store's prefix (files, manifests, signatures, configs)."""
    listed = store.objects.client.list_objects_v2(
        Bucket=store.objects.bucket, Prefix=f"{store.objects.prefix}/"
    )
    return {
        o["Key"]: hashlib.sha256(
            store.objects.client.get_object(Bucket=store.objects.bucket, Key=o["Key"])["Body"].read()
        ).hexdigest()
        for o in listed.get("Contents", [])
    }


def _variant(dest: Path, line: bytes = b"") -> Path:
    """The template's table_data_preprocess (a python model: no export needed) copied, with
    ``line`` appended to its model.py (other bytes)."""
    folder = dest / "table_data_preprocess"
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    with (folder / "1" / "model.py").open("ab") as f:
        f.write(line)
    return folder


def test_store_push_over_a_stored_signed_version_with_other_bytes_is_refused(
    runner: CliRunner, s3_server, tmp_path: Path
) -> None:
    bucket = f"w-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    uri = s3_server.store_uri(bucket, "prod")
    same = _variant(tmp_path / "same")
    assert runner.invoke(app, ["store", "push", str(same), "--store", uri]).exit_code == 0
    store = Repository(S3Objects(bucket, "prod", s3_server.endpoint))
    store.objects.write(
        f"table_data_preprocess/1/{SIGNATURE_FILE}", b'{"mediaType": "signature"}'
    )  # as promoted
    before = _objects(store)
    other = _variant(tmp_path / "other", b"SIGN = -1\n")
    refused = runner.invoke(app, ["store", "push", str(other.parent), "--store", uri])
    assert refused.exit_code == 5, refused.output
    assert f"error: {uri}: table_data_preprocess v1 is already stored with other bytes" in refused.stderr
    assert "  model.py: other bytes (stored sha256 " in refused.stderr
    assert "fix: register these bytes as a new version of table_data_preprocess" in refused.stderr
    assert "Traceback" not in refused.output
    assert _objects(store) == before  # every byte, the manifest and the signature as they were
    again = runner.invoke(app, ["store", "push", str(same), "--store", uri])
    assert again.exit_code == 0, again.output
    assert "table_data_preprocess/1: sent 0 file(s) (0 bytes), skipped" in again.stdout
    assert _objects(store) == before
    assert store.session.locks() == []


def test_of_two_writers_of_one_new_s3_version_exactly_one_succeeds(s3_server, tmp_path: Path) -> None:
    bucket = f"r-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    folders = [_variant(tmp_path / str(i), f"WRITER = {i}\n".encode()) for i in range(2)]
    start = threading.Barrier(2)

    def push(folder: Path) -> object:
        store = Repository(S3Objects(bucket, "prod", s3_server.endpoint))
        start.wait(timeout=60)  # a writer that never comes breaks the barrier: the other fails, not hangs
        try:
            return push_model(store, folder)
        except StorageError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(push, folders))
    failed = [o for o in outcomes if isinstance(o, StorageError)]
    assert len(failed) == 1, outcomes
    assert re.search(
        r"is locked by|already stored with other bytes|created by another writer", failed[0].message
    )
    winner = folders[outcomes.index(next(o for o in outcomes if not isinstance(o, StorageError)))]
    store = Repository(S3Objects(bucket, "prod", s3_server.endpoint))
    assert store.versions.verify_version("table_data_preprocess", "1", full=True).status == "verified"
    assert store.objects.read("table_data_preprocess/1/model.py") == (winner / "1" / "model.py").read_bytes()


class RacedS3Objects(S3Objects):
    """S3 objects on which ``racer`` runs just before it creates a manifest: another writer's
    whole upload of the same new version lands between this one's files and its manifest."""

    racer: Callable[[], object] | None = None

    def create(self, key: str, data: bytes) -> bool:
        if key.endswith(MANIFEST) and self.racer is not None:
            racer, self.racer = self.racer, None
            racer()
        return super().create(key, data)


def test_the_manifest_of_a_new_s3_version_is_created_with_if_none_match(s3_server, tmp_path: Path) -> None:
    """Two writers that do not lock (an older mlreg): the manifest is a conditional put (moto 5.2
    answers 412 PreconditionFailed to If-None-Match: * on an existing key), so the second writer
    cannot overwrite the first one's; it is refused, naming the version and what to do."""
    bucket = f"n-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    first, second = (_variant(tmp_path / str(i), f"WRITER = {i}\n".encode()) for i in range(2))
    other = Repository(S3Objects(bucket, "prod", s3_server.endpoint))
    raced = RacedS3Objects(bucket, "prod", s3_server.endpoint)
    store = Repository(raced)
    raced.racer = lambda: other.versions.put_version("table_data_preprocess", "1", second / "1")
    with pytest.raises(
        StorageError, match=r"table_data_preprocess v1 was created by another writer"
    ) as caught:
        store.versions.put_version("table_data_preprocess", "1", first / "1")
    assert "mlreg store verify table_data_preprocess 1" in str(caught.value.fix)
    manifest = store.versions.read_manifest("table_data_preprocess", "1")
    assert manifest is not None
    assert manifest.files["model.py"]["sha256"] == sha256_file(second / "1" / "model.py")
