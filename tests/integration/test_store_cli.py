"""`mlreg store push|ls` and `mlreg triton status`, as users type them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.devstack import local_s3
from tests.cli import CliRunner
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
    from pipelines.storage.s3 import S3Store

    store = S3Store(bucket, "prod", s3_server.endpoint)
    key = "prod/table_data_preprocess/1/model.py"
    original = store.client.get_object(Bucket=bucket, Key=key)
    body = original["Body"].read()
    tampered = body.replace(b"def ", b"def  ", 1)[: len(body)]
    store.client.put_object(Bucket=bucket, Key=key, Body=tampered, Metadata=original["Metadata"])
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
