"""`mlreg store push|ls` and `mlreg triton status`, as users type them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlreg.cli.main import app
from pipelines import local_s3
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
    from pipelines.local_triton import free_port

    url = f"127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["triton", "status", "--url", url])
    assert result.exit_code == 6
    assert result.output.startswith(f"{url}: unreachable: server metadata failed on {url}")
