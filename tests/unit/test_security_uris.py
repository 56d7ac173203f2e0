"""Issue 33, item 5: no secret echoed.  A store URI with credentials in it is refused where it
enters (``open_store``, an environment's ``store``), before any server is asked; every URI is
redacted before it is printed, recorded (MLflow params, ``report.json``) or raised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from pipelines.core.plan import Plan
from pipelines.core.reports import PromotionResult, StageRecord, UploadReport
from pipelines.promote.environments import Environment
from pipelines.promote.record import record_promotion
from pipelines.storage import check_store_uri, open_store
from registry.errors import StorageError, UsageError
from registry.settings import redact_data, redact_uri
from tests.cli import CliRunner, Result
from tests.fakes import FakeRegistry, FakeRuns

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzSECRET"  # an AWS secret: '/' and '+' in it
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_URIS = [
    f"s3://{KEY_ID}:{SECRET}@127.0.0.1:9000/bucket/p",
    f"s3://http://{KEY_ID}:{SECRET}@127.0.0.1:9000/bucket/p",  # Triton's endpoint syntax
    f"s3://{SECRET}@127.0.0.1:9000/bucket/p",  # a user info alone: a token
]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow",
            "postgresql+psycopg2://mlflow:***@db:5432/mlflow",
        ),
        (f"s3://{KEY_ID}:{SECRET}@host:9000/b/p", "s3://***@host:9000/b/p"),
        (f"s3://http://{KEY_ID}:{SECRET}@host:9000/b/p", "s3://http://***@host:9000/b/p"),
        ("s3://user@host/b/p", "s3://***@host/b/p"),
        ("https://ghp_token@github.com/o/r", "https://***@github.com/o/r"),
        ("https://h/x?X-Amz-Signature=abc&X-Amz-Date=1", "https://h/x?X-Amz-Signature=***&X-Amz-Date=1"),
        (
            "error: 's3://k:s@h/b/p' is locked by alice@box:12",
            "error: 's3://***@h/b/p' is locked by alice@box:12",
        ),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),  # a port is no password
        ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
        ("file:///home/a@b/models", "file:///home/a@b/models"),  # an '@' in a path
        ("https://host/pkg@1.2", "https://host/pkg@1.2"),
        ("alice@box locked it", "alice@box locked it"),  # no URI at all
    ],
)
def test_redact_masks_credentials_and_nothing_else(text: str, shown: str) -> None:
    assert redact_uri(text) == shown
    assert redact_uri(shown) == shown  # idempotent: the sink may redact what a stage redacted


def test_redact_data_reaches_every_string_of_a_document() -> None:
    uri = SECRET_URIS[0]
    document = {"store": uri, "stages": [{"detail": f"uploaded to {uri}"}], uri: 1, "n": 2}
    assert SECRET not in json.dumps(redact_data(document))
    assert redact_data(document)["n"] == 2


@pytest.mark.parametrize("uri", SECRET_URIS)
def test_open_store_refuses_a_uri_with_credentials_and_says_where_they_go(uri: str) -> None:
    with pytest.raises(StorageError, match="carries credentials") as caught:
        open_store(uri)
    assert SECRET not in str(caught.value)
    assert KEY_ID not in str(caught.value)
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in str(caught.value.fix)


def test_a_local_folder_with_an_at_sign_is_no_uri(tmp_path: Path) -> None:
    folder = tmp_path / "ops@example"
    assert check_store_uri(str(folder)) == str(folder)
    assert open_store(folder).uri == str(folder)
    with pytest.raises(StorageError, match=r"the store URI 'gs://\*\*\*@bucket/p' carries credentials"):
        open_store("gs://token@bucket/p")  # any scheme: the credentials are refused first


# -- the CLI: refused before any server, the secret in no output ------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose mlreg.toml has an environment with credentials in its store URI."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "mlreg.toml").write_text(
        f'[environments.prod]\nstore = "{SECRET_URIS[0]}"\ntargets = ["127.0.0.1:1"]\n'
    )
    monkeypatch.setenv("MLREG_HOME", str(root / ".mlreg"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return root


def _shown(result: Result) -> str:
    return result.stdout + result.stderr


@pytest.mark.parametrize("uri", SECRET_URIS)
@pytest.mark.parametrize(
    "command",
    [["store", "ls"], ["store", "ls", "--json"], ["store", "verify", "--json"], ["store", "init"]],
)
def test_store_commands_refuse_a_secret_uri_without_echoing_it(
    project: Path, command: list[str], uri: str
) -> None:
    result = CliRunner().invoke(app, [*command, "--store", uri])
    assert result.exit_code == 5, _shown(result)
    assert SECRET not in _shown(result)
    assert KEY_ID not in _shown(result)
    assert "carries credentials" in result.stderr
    assert "fix: remove them from the URI: boto3 and Triton read AWS_ACCESS_KEY_ID" in result.stderr
    assert "Traceback" not in _shown(result)
    if "--json" in command:
        document = json.loads(result.stdout)
        assert (document["kind"], document["exit_code"]) == ("StorageError", 5)


@pytest.mark.parametrize(
    "command",
    [
        ["promote", "m", "--version", "1", "--env", "prod", "--json"],
        ["promote", "m", "--version", "1", "--env", "prod", "--dry-run"],
        ["status", "--env", "prod"],
        ["status", "--env", "prod", "--json"],
        ["store", "unlock", "m", "--env", "prod"],
        ["rollback", "m", "--to-version", "1", "--env", "prod", "--json"],
    ],
)
def test_an_environment_with_a_secret_store_is_refused_naming_the_file(
    project: Path, command: list[str]
) -> None:
    """Refused when mlreg.toml is read, before MLflow or any server: nothing recorded anywhere."""
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, _shown(result)
    assert SECRET not in _shown(result)
    assert KEY_ID not in _shown(result)
    assert f"error: {project / 'mlreg.toml'} [environments.prod] store: the store URI 's3://***@" in (
        result.stderr
    )
    assert "carries credentials" in result.stderr
    assert not (project / ".mlreg" / "mlflow.db").exists()  # no run was recorded


def test_a_secret_in_the_tracking_uri_is_masked_in_the_error(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"foo://mlflow:{SECRET}@db/x")
    result = CliRunner().invoke(app, ["versions", "m", "--json"])
    assert result.exit_code == 12, _shown(result)
    assert SECRET not in _shown(result)
    assert "foo://mlflow:***@db/x" in json.loads(result.stdout)["error"]


# -- what a promotion records: params and report.json -----------------------------------------------


class RecordingRuns(FakeRuns):
    """The fake's runs, keeping the artifacts a run logged (report.json) as text."""

    def __init__(self, registry: FakeRegistry) -> None:
        super().__init__(registry)
        self.artifacts: dict[str, str] = {}

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        self.artifacts.update({p.name: p.read_text() for p in folder.iterdir()})


class RecordingRegistry(FakeRegistry):
    """The fake registry, keeping the artifacts a run logged (``runs``: ``RecordingRuns``)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = self.recording = RecordingRuns(self)


def test_a_promotion_record_holds_no_secret(tmp_path: Path) -> None:
    """Defence in depth: were a URI with credentials to reach a promotion (built by code, not
    mlreg.toml), its params, report.json, --json and stage lines still show it redacted."""
    uri = SECRET_URIS[1]
    env = Environment("prod", uri, ("t0:8001",), "prod", gpu=False)
    upload = UploadReport(10, uri, ["m/1/model.py"])
    result = PromotionResult(Plan(env, ("t0:8001",), "m", "1"), error=f"upload to {uri} failed")
    result.stages.append(StageRecord("assemble", "failed", 0.1, upload.detail(), upload))
    registry = RecordingRegistry()
    record_promotion(registry, result, env, "mlreg-promotions")
    recorded: dict[str, Any] = {"runs": registry.recorded, "artifacts": registry.recording.artifacts}
    assert "report.json" in registry.recording.artifacts
    assert registry.recorded[0]["params"]["store"] == "s3://http://***@127.0.0.1:9000/bucket/p"
    everything = json.dumps(recorded) + json.dumps(result.to_dict()) + upload.detail()
    assert SECRET not in everything
    assert KEY_ID not in everything


def test_an_error_raised_with_a_secret_is_printed_redacted(project: Path) -> None:
    """The output sink masks whatever an error carries (here a UsageError naming a URI)."""
    from mlreg.cli.failures import error_document

    error = UsageError(f"cannot read {SECRET_URIS[0]}", fix=f"check {SECRET_URIS[2]}")
    document = error_document(error, 2)
    assert SECRET not in json.dumps(document)
    assert document["error"] == "cannot read s3://***@127.0.0.1:9000/bucket/p"
