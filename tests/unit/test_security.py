"""The control key's sources, the config paths Triton would follow out of a version folder, and the
bytecode caches a verification removes (no server; the real ones: tests/integration/test_security.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pipelines.devstack.processes import redacted
from pipelines.promote.environments import load_environments
from pipelines.storage import open_store
from pipelines.triton import control_key
from pipelines.triton.control_key import ControlKey, local_key
from registry.contracts.validate import validate_path
from registry.errors import UsageError
from registry.settings import Settings

# -- the control key ------------------------------------------------------------------------------


def test_a_key_never_shows_its_value() -> None:
    key = ControlKey("s3cr3t-value", "$MLREG_CONTROL_KEY")
    assert "s3cr3t-value" not in repr(key) + str(key)
    assert str(key) == "the control key from $MLREG_CONTROL_KEY"
    assert key.grpc_headers() == {"triton-grpc-protocol-mlreg-control-key": "s3cr3t-value"}
    assert control_key.restriction_args("K") == [
        "--http-restricted-api=model-repository,trace,statistics:mlreg-control-key=K",
        "--grpc-restricted-protocol=model-repository,trace,statistics:mlreg-control-key=K",
    ]
    assert redacted(["tritonserver", *control_key.restriction_args("s3cr3t-value")]) == [
        "tritonserver",
        "--http-restricted-api=model-repository,trace,statistics:mlreg-control-key=<redacted>",
        "--grpc-restricted-protocol=model-repository,trace,statistics:mlreg-control-key=<redacted>",
    ]  # what the start-up log line shows


def test_where_a_key_is_found_first_match_wins(tmp_path: Path) -> None:
    home = tmp_path / ".mlreg"
    assert control_key.control_key(home, environ={}) is None  # nothing names one
    generated = local_key(home, environ={})
    assert (home / "control.key").stat().st_mode & 0o777 == 0o600
    assert local_key(home, environ={}).value == generated.value  # generated once
    assert control_key.control_key(home, environ={}) == generated
    (tmp_path / "file.key").write_text("from-file\n")
    (tmp_path / "file.key").chmod(0o600)  # a key file only its owner reads (as ssh asks)
    env = {"MLREG_CONTROL_KEY_FILE": str(tmp_path / "file.key")}
    assert control_key.control_key(home, environ=env).value == "from-file"  # type: ignore[union-attr]
    env["MLREG_CONTROL_KEY"] = "from-variable"
    assert control_key.control_key(home, environ=env).value == "from-variable"  # type: ignore[union-attr]
    env["STAGING_KEY"] = "named"
    named = control_key.control_key(home, "env:STAGING_KEY", environ=env)
    assert (named.value, named.origin) == ("named", "$STAGING_KEY")  # type: ignore[union-attr]
    assert local_key(home, environ=env).value == "from-variable"  # the stack takes the variable


@pytest.mark.parametrize(
    ("named", "content", "message"),
    [
        ("env:UNSET_KEY", None, "names $UNSET_KEY, which is not set"),
        ("missing.key", None, "cannot read the control key from"),
        ("bad.key", "two words\n", "does not hold a control key"),
        ("bad.key", "", "does not hold a control key"),
    ],
)
def test_a_key_that_cannot_be_read_is_one_clear_error(
    tmp_path: Path, named: str, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / named).write_text(content)
        (tmp_path / named).chmod(0o600)
    with pytest.raises(UsageError, match=re.escape(message)) as error:
        control_key.control_key(tmp_path, named, base=tmp_path, environ={})
    assert "two words" not in error.value.message  # a file's content is never echoed


def test_an_environment_names_its_key_never_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLREG_CONTROL_KEY")  # the suite's (tests/conftest.py): the local stack's own
    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "prod.key").write_text("prod-key\n")
    (tmp_path / "secrets" / "prod.key").chmod(0o600)
    (tmp_path / "mlreg.toml").write_text(
        '[environments.staging]\nstore = "s3://b/s"\ntargets = ["t:8001"]\ncontrol_key = "env:STAGE_KEY"\n'
        '[environments.prod]\nstore = "s3://b/p"\ntargets = ["t:8001"]\ncontrol_key = "secrets/prod.key"\n'
    )
    envs = load_environments(settings)
    assert envs["staging"].control_key == "env:STAGE_KEY"
    assert envs["prod"].key(settings).value == "prod-key"  # type: ignore[union-attr]
    assert envs["local"].key(settings).origin == str(settings.home / "control.key")  # type: ignore[union-attr]
    (tmp_path / "mlreg.toml").write_text(
        '[environments.prod]\nstore = "s3://b/p"\ntargets = ["t:8001"]\ncontrol_key = "Zm9vYmFyLXNlY3JldA"\n'
    )
    with pytest.raises(UsageError) as error:  # the key itself written by mistake: not echoed back
        load_environments(settings)
    assert "Zm9vYmFyLXNlY3JldA" not in error.value.message + str(error.value.fix)
    assert 'control_key must be "env:VAR" or the path of a file' in error.value.message


# -- paths Triton would follow out of the version folder ------------------------------------------


@pytest.fixture
def repo(standin_repository: Path, tmp_path: Path) -> Path:
    target = tmp_path / "repo"
    shutil.copytree(standin_repository, target)
    return target


def _errors_after(repo: Path, model: str, old: str, new: str) -> list[str]:
    path = repo / model / "config.pbtxt"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return [f.message for f in validate_path(repo).findings if f.is_error and f.rule == "paths"]


@pytest.mark.parametrize(
    ("model", "old", "new", "message"),
    [
        (
            "image_model",
            'default_model_filename: "model"',
            'default_model_filename: "../../../../etc/model"',
            "default_model_filename '../../../../etc/model' leaves the version folder",
        ),
        (
            "image_model",
            'default_model_filename: "model"',
            'default_model_filename: "/srv/other/model"',
            "default_model_filename '/srv/other/model' leaves the version folder",
        ),
        (
            "image_model",
            'default_model_filename: "model"',
            'default_model_filename: "model"\ncc_model_filenames { key: "7.5" value: "../x.plan" }',
            "cc_model_filenames['7.5'] '../x.plan' leaves the version folder",
        ),
        (
            "table_data_preprocess",
            'backend: "python"',
            'backend: "../../tmp/evil"',
            "backend '../../tmp/evil' is not a backend name",
        ),
        (
            "table_data_preprocess",
            'backend: "python"',
            'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"/opt/env.tar.gz" } }',
            "parameter EXECUTION_ENV_PATH '/opt/env.tar.gz' leaves the version folder",
        ),
        (
            "table_data_preprocess",
            'backend: "python"',
            'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }',
            "parameter EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/env.tar.gz' leaves the version folder",
        ),
        (
            "table_data_preprocess",
            'backend: "python"',
            'backend: "python"\nparameters { key: "LABELS_FILE" value { string_value: "../../labels.txt" } }',
            "parameter LABELS_FILE '../../labels.txt' leaves the version folder",
        ),
    ],
)
def test_a_path_leaving_the_version_folder_is_a_contract_error(
    repo: Path, model: str, old: str, new: str, message: str
) -> None:
    assert [m for m in _errors_after(repo, model, old, new) if message in m] != []


def test_paths_inside_the_version_folder_pass(repo: Path) -> None:
    """The other side: what a real model names stays allowed."""
    assert (
        _errors_after(
            repo,
            "table_data_preprocess",
            'backend: "python"',
            'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"$$TRITON_MODEL_DIRECTORY/1/env.tar.gz" } }',
        )
        == []
    )
    assert (
        _errors_after(
            repo, "image_model", 'default_model_filename: "model"', 'default_model_filename: "sub/model"'
        )
        == []
    )


# -- bytecode caches --------------------------------------------------------------------------------


def test_a_verified_version_loses_its_bytecode_caches_and_a_refused_one_keeps_everything(
    tmp_path: Path,
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.py").write_text("x = 1\n")
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", source)
    cache = tmp_path / "store" / "m" / "1" / "__pycache__" / "model.cpython-311.pyc"
    assert cache.parent.read_bytes() == b""  # the guard a local store keeps
    cache.parent.unlink()  # someone with write access to the store replaces it with a cache
    cache.parent.mkdir()
    cache.write_bytes(b"planted")
    checked = store.versions.check_version("m", "1")
    assert (checked.ok, checked.bytecode) == (True, ["m/1/__pycache__/model.cpython-311.pyc"])
    assert cache.is_file()  # a check only reads
    store.versions.verify_version("m", "1", drop_bytecode=True)
    assert not cache.exists()  # removed before anything loads it, and the empty guard back
    assert cache.parent.read_bytes() == b""
    cache.parent.unlink()
    cache.parent.mkdir()
    cache.write_bytes(b"planted")
    (tmp_path / "store" / "m" / "1" / "model.py").write_text("x = 2\n")  # other bytes: refused
    with pytest.raises(Exception, match="does not match what was registered"):
        store.versions.verify_version("m", "1", drop_bytecode=True)
    assert cache.read_bytes() == b"planted"  # a refusal changes nothing
