"""The mlreg CLI: exit codes and the lines users see."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from mlreg.cli.main import app
from tests.cli import CliRunner
from tests.conftest import TEMPLATE


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the embedded registry under MLREG_HOME
    return CliRunner()


def test_help_lists_the_command_groups(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "template" in result.output
    assert "stack" in result.output
    assert "Exit codes: 0 done;" in result.output  # one error class, one exit code, listed once
    assert "12 SettingsError" in " ".join(result.output.split())


def test_stack_status_when_nothing_runs(runner: CliRunner) -> None:
    result = runner.invoke(app, ["stack", "status"])
    assert result.exit_code == 1
    assert "the local stack is not running (start it with 'mlreg stack up')" in result.output


def test_stack_down_when_nothing_runs(runner: CliRunner) -> None:
    result = runner.invoke(app, ["stack", "down"])
    assert result.exit_code == 0
    assert "the local stack was not running" in result.output


def test_stack_up_on_a_missing_repository_names_it_and_the_fix(
    runner: CliRunner,
    tmp_path: Path,
) -> None:
    result = runner.invoke(app, ["stack", "up", "--repository", str(tmp_path / "nope")])
    assert result.exit_code == 7
    assert f"error: model repository '{tmp_path / 'nope'}' does not exist" in result.output
    assert "fix: build one with 'mlreg template build" in result.output
    assert "Traceback" not in result.output


def test_template_build_of_an_unknown_model(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["template", "build", str(tmp_path / "out"), "-m", "nope"])
    assert result.exit_code == 11
    assert "error: no model named nope in the template" in result.output
    assert "fix: choose from: ensemble_multi_modal_model, image_model" in result.output


def test_template_build_of_python_models_needs_no_export(
    runner: CliRunner,
    tmp_path: Path,
) -> None:
    result = runner.invoke(
        app, ["template", "build", str(tmp_path / "out"), "-m", "table_data_preprocess", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"table_data_preprocess"' in result.output
    assert (tmp_path / "out/table_data_preprocess/1/model.py").is_file()


# -- the CLI contract: one error class, one exit code, one JSON document -------------------------


def test_every_error_class_has_its_own_exit_code() -> None:
    from registry.errors import EXIT_CODES

    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    assert EXIT_CODES["UsageError"] == 2
    assert EXIT_CODES["SettingsError"] == 12


def test_a_bad_option_is_a_usage_error_with_the_fix(runner: CliRunner) -> None:
    result = runner.invoke(app, ["versions", "image_model", "--bogus"])
    assert result.exit_code == 2
    assert "error: No such option: --bogus" in result.stderr
    assert "fix: see 'mlreg versions --help'" in result.stderr
    assert "Traceback" not in result.output


def test_json_usage_errors_print_one_json_document(runner: CliRunner) -> None:
    result = runner.invoke(app, ["versions", "--bogus", "--json"])
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document == {
        "ok": False,
        "error": "No such option: --bogus",
        "fix": "see 'mlreg versions --help'",
        "exit_code": 2,
        "kind": "UsageError",
    }
    missing = runner.invoke(app, ["show", "image_model", "--json"])  # --version is required
    assert missing.exit_code == 2
    assert json.loads(missing.stdout)["error"] == "Missing option '--version' / '-V'."


def test_an_unsupported_tracking_uri_is_a_settings_error_in_every_command(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://registry.example")
    for command in (["versions", "m"], ["show", "m", "-V", "1"], ["alias", "set", "m", "a", "1"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 12, (command, result.output)
        assert (
            "error: MLFLOW_TRACKING_URI='foo://registry.example': MLflow keeps no model registry "
            "at a 'foo' URI" in result.stderr
        )
        assert "fix: use sqlite:///PATH, http(s)://HOST:PORT" in result.stderr
        assert "internal error" not in result.output


def test_a_bad_timeout_is_named_but_help_still_works(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_TRITON_TIMEOUT", "soon")
    assert runner.invoke(app, ["stack", "status", "--help"]).exit_code == 0
    result = runner.invoke(app, ["stack", "status"])
    assert result.exit_code == 12
    assert "error: MLREG_TRITON_TIMEOUT='soon' is not a number of seconds" in result.stderr
    assert "fix: set MLREG_TRITON_TIMEOUT to e.g. 30" in result.stderr


def test_an_unusable_mlreg_home_is_named(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "a-file" / "home"))
    result = runner.invoke(app, ["stack", "status", "--json"])
    assert result.exit_code == 12
    assert (
        f"error: the state folder MLREG_HOME={tmp_path / 'a-file' / 'home'} cannot be used: "
        f"'{tmp_path / 'a-file'}' is a file, not a folder" in result.stderr
    )
    assert "fix: set MLREG_HOME to a writable folder" in result.stderr
    assert json.loads(result.stdout)["kind"] == "SettingsError"


def test_a_missing_mlreg_home_is_fine_and_not_created(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "not" / "yet"))
    result = runner.invoke(app, ["stack", "status"])
    assert result.exit_code == 1
    assert "the local stack is not running" in result.output
    assert not (tmp_path / "not").exists()


def test_versions_of_an_unknown_model_exits_4(runner: CliRunner, registry_home: Path) -> None:
    result = runner.invoke(app, ["versions", "no_such_model"])
    assert result.exit_code == 4
    assert "error: model 'no_such_model' is not registered in MLflow (sqlite:///" in result.stderr
    assert "fix: check the name; 'mlreg export' or 'mlreg register MODEL PATH' registers one" in result.stderr


def test_versions_on_a_fresh_home_says_so_and_creates_nothing(runner: CliRunner, tmp_path: Path) -> None:
    """No registry yet: nothing is registered, and asking must not create MLREG_HOME or its database."""
    result = runner.invoke(app, ["versions", "image_model"])
    assert result.exit_code == 4
    assert "error: model 'image_model' is not registered in MLflow (sqlite:///" in result.stderr
    assert not (tmp_path / "home").exists()


def test_a_closed_pipe_is_reported_with_its_own_exit_code(tmp_path: Path) -> None:
    """A real closed pipe: the reader's end is closed before mlreg writes a line."""
    import subprocess
    import sys

    env = {**os.environ, "MLREG_HOME": str(tmp_path / "home")}
    env.pop("MLREG_DEBUG", None)
    with subprocess.Popen(
        [sys.executable, "-m", "mlreg", "validate", str(TEMPLATE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as process:
        stdout, stderr_pipe = process.stdout, process.stderr
        assert stdout is not None
        assert stderr_pipe is not None
        stdout.close()
        stderr = stderr_pipe.read().decode()
    assert process.returncode == 141, stderr
    assert "error: the program reading mlreg's output closed it before the end (a closed pipe)" in stderr
    assert "internal error" not in stderr
    assert "Traceback" not in stderr


def test_tables_are_rich_tables_with_whole_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from mlreg.cli.sink import render_table

    render_table(
        ["MODEL", "VERSION"],
        [["ensemble_multi_modal_model_with_a_long_name", 12], ["m", None]],
        right={"VERSION"},
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "MODEL                                        VERSION",
        "ensemble_multi_modal_model_with_a_long_name       12",
        "m                                                  -",
    ]


# The TensorFlow start-up lines of a real export: tests/integration/test_unit_moved_exports.py
# A registration's findings naming the user's folder (it writes through MLflow):
# tests/integration/test_registry.py


def test_a_state_folder_that_cannot_be_created_is_a_settings_error(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc accepts no new folder, even from root: a real failure of mkdir under MLREG_HOME."""
    monkeypatch.setenv("MLREG_HOME", "/proc/mlreg-home")
    result = runner.invoke(app, ["stack", "up", "--no-ui"])
    assert result.exit_code == 12
    assert "error: the state folder MLREG_HOME=/proc/mlreg-home cannot be used: " in result.stderr
    assert "fix: set MLREG_HOME to a writable folder" in result.stderr


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"kind": "promotions", "promotions": [{"version": "1"}]},
            "not a promotion batch report as mlreg writes it: key 'model' is missing",
        ),
        (
            {"versions": [{"model": "a", "version": "1"}]},
            "not an export report as mlreg writes it: key 'validation' is missing",
        ),
        (
            {"kind": "promotions", "promotions": "abc"},
            "not a promotion batch report as mlreg writes it: a value has the wrong type or form (TypeError",
        ),
        ({"anything": 1}, "not a document mlreg writes (promote, export or validate --json)"),
    ],
)
def test_report_on_a_document_mlreg_did_not_write_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, doc: dict, message: str
) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["report", str(path), "--markdown"])
    assert result.exit_code == 2, result.output
    assert f"error: {path}: {message}" in result.stderr
    assert "fix: pass the" in result.stderr
    assert "internal error" not in result.output


def _registered_models(home: Path) -> list[str]:
    """The registered models in the embedded registry's database (read as MLflow wrote it)."""
    with contextlib.closing(sqlite3.connect(home / "mlflow.db")) as conn:  # `with connect()` only commits
        return [name for (name,) in conn.execute("SELECT name FROM registered_models")]


def test_export_changed_without_a_base_to_compare_with_refuses_before_registering(
    runner: CliRunner, tmp_path: Path, registry_home: Path
) -> None:
    result = runner.invoke(app, ["export", "--changed"])
    assert result.exit_code == 2, result.output
    assert (
        "error: --changed lists the versions alias 'staging' does not hold yet, but no registered model "
        f"in MLflow (sqlite:///{tmp_path / 'home' / 'mlflow.db'}) holds 'staging': "
        "there is nothing to compare with"
    ) in result.stderr
    assert "fix: pass --against the alias of an environment promoted to" in result.stderr
    assert not (tmp_path / "home" / "exports").exists()  # no exporter ran
    assert _registered_models(tmp_path / "home") == []  # nothing registered


def test_export_against_without_changed_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", "--against", "production"])
    assert result.exit_code == 2, result.output
    assert "error: --against only applies with --changed" in result.stderr
    assert "fix: pass --changed --against production, or drop --against" in result.stderr
    assert not (tmp_path / "home" / "exports").exists()


def test_export_changed_needs_only_one_model_holding_the_alias(
    registry_state: Callable[[str], Path],
) -> None:
    """Model ``a`` v1 registered by MLflow, then its alias ``production`` set (conftest's states)."""
    from registry.errors import UsageError
    from registry.export import require_base
    from registry.mlflow import MlflowRegistry
    from registry.settings import Settings

    def registry(state: str) -> MlflowRegistry:
        return MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(registry_state(state))}))

    for state in ("empty", "a_v1"):
        with pytest.raises(UsageError, match="no registered model in MLflow .* holds 'production'"):
            require_base(registry(state).models, "production")
    held = registry("a_v1_production")
    assert held.models.alias_versions("production") == {"a": "1"}
    require_base(held.models, "production")


# mlreg store: the CLI parses and renders, mlreg/ops/store_* do the work


def test_store_push_ls_verify_on_a_local_folder(runner: CliRunner, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    pushed = runner.invoke(app, ["store", "push", str(TEMPLATE / "image_preprocess"), "--store", store])
    assert pushed.exit_code == 0, pushed.output
    assert pushed.output.splitlines()[-1].startswith(f"pushed 1 version(s) to {store}: ")
    listed = runner.invoke(app, ["store", "ls", "--store", store, "--json"])
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.stdout)
    assert set(document) == {"store", "archive", "versions", "missing", "archive_error", "locks"}
    [row] = document["versions"]
    assert (row["model"], row["version"], row["location"]) == ("image_preprocess", "1", "live")
    verified = runner.invoke(app, ["store", "verify", "image_preprocess", "1", "--store", store])
    assert verified.exit_code == 0, verified.output
    assert verified.output.startswith("image_preprocess/1: verified (")


def test_store_verify_names_a_changed_file_and_exits_5(runner: CliRunner, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert (
        runner.invoke(app, ["store", "push", str(TEMPLATE / "image_preprocess"), "-s", str(store)]).exit_code
        == 0
    )
    (store / "image_preprocess" / "1" / "model.py").write_text("print('planted')\n")
    result = runner.invoke(app, ["store", "verify", "--store", str(store), "--json"])
    assert result.exit_code == 5
    assert json.loads(result.stdout)["ok"] is False  # the report first, then the one error
    assert f"error: {store}: 1 of 1 version(s) do not match their manifest: image_preprocess/1/model.py" in (
        result.stderr
    )
    assert "fix: put the registered bytes back ('mlreg store repair MODEL VERSION'" in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--digest", "abc"], "error: --digest needs MODEL and VERSION"),
        (
            ["m", "1", "--digest", "abc", "--registered"],
            "error: --digest and --registered name the digest twice",
        ),
        (["--signatures"], "error: --signatures needs the keys to trust"),
    ],
)
def test_store_verify_option_clashes_are_usage_errors(
    runner: CliRunner, tmp_path: Path, args: list[str], says: str
) -> None:
    store = tmp_path / "store"
    assert (
        runner.invoke(app, ["store", "push", str(TEMPLATE / "image_preprocess"), "-s", str(store)]).exit_code
        == 0
    )
    result = runner.invoke(app, ["store", "verify", "--store", str(store), *args])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_store_init_writes_the_root_marker_once(runner: CliRunner, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = runner.invoke(app, ["store", "init", "--store", store])
    assert first.output.strip() == (
        f"{store}: root marker .mlreg-root.json written; Triton can start on this repository"
    )
    again = runner.invoke(app, ["store", "init", "--store", store, "--json"])
    assert json.loads(again.stdout) == {"store": store, "marker": ".mlreg-root.json", "created": False}


def test_the_upload_bar_masks_the_credentials_of_the_store_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.progress import Progress

    from mlreg.cli import progress

    labels: list[str] = []
    add_task = Progress.add_task

    def recorded(self: Progress, description: str, *args: object, **kwargs: object) -> object:
        labels.append(description)
        return add_task(self, description, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(progress, "enabled", lambda settings=None: True)
    monkeypatch.setattr(Progress, "add_task", recorded)
    with progress.byte_progress("pushing to s3://AKIAKEY:SeCrEt@minio:9000/models") as advance:
        assert advance is not None
        advance(10)
    assert labels == ["pushing to s3://***@minio:9000/models"]


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_store_gc_exits_with_the_storage_error_when_a_move_did_not_finish(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from mlreg.ops import store_gc
    from pipelines.promote.retention import RetentionReport
    from registry.errors import StorageError

    failed = RetentionReport(2, failed=["m v1: no space left"])
    monkeypatch.setattr(store_gc, "store_gc", lambda *args, **kwargs: failed)
    result = runner.invoke(app, ["store", "gc", *args])
    assert result.exit_code == StorageError.exit_code, result.output
    assert "error: 1 move(s) did not finish: m v1: no space left" in result.output
    if args:
        assert json.loads(result.stdout)["failed"] == ["m v1: no space left"]
