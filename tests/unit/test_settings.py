"""Issue 33, item 6: settings that say what they mean.  Each misreading found by the probes is
refused with the message a user sees: mlreg.toml's environments (gpu, targets, bake checks, nan
thresholds, trusted keys), a model name no store can lock, a version that is not a positive
number; and the checks that passed what they should not (a failed load's stale reasons, the
"targets serve from this store" check on an empty store, ``store ls`` on a pruned archive)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from mlreg.cli.main import app
from pipelines.core.context import PromotionContext
from pipelines.promote.environments import environment
from pipelines.rollout.all_at_once import check_serves_from_store
from pipelines.storage import MODEL_NAME_MAX, NAME_MAX, open_store
from pipelines.storage.archive import move_to_archive
from pipelines.storage.base import lock_key
from registry.errors import PromotionError, SettingsError, StorageError, TritonError, UsageError
from registry.settings import Settings
from tests.cli import CliRunner, Result

# -- mlreg.toml -----------------------------------------------------------------------------------


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    return tmp_path / "mlreg.toml"


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})


def _refused(tmp_path: Path, toml: Path, section: str, message: str) -> UsageError:
    toml.write_text(f'[environments.e]\nstore = "s"\n{section}\n')
    with pytest.raises(UsageError, match=message) as caught:
        environment(_settings(tmp_path), "e")
    assert str(toml) in caught.value.message  # the file is named
    return caught.value


def test_gpu_must_be_a_boolean_not_a_string(tmp_path: Path, toml: Path) -> None:
    error = _refused(
        tmp_path,
        toml,
        'gpu = "false"',
        r"environment 'e': gpu must be true or false \(a TOML boolean\), not 'false'",
    )
    assert error.fix == "write gpu = false (or gpu = true), without quotes, in [environments.e]"
    toml.write_text('[environments.e]\nstore = "s"\ngpu = false\n')
    assert environment(_settings(tmp_path), "e").gpu is False


def test_a_target_listed_twice_is_refused(tmp_path: Path, toml: Path) -> None:
    _refused(
        tmp_path,
        toml,
        'targets = ["a:8001", "b:8001", "A:8001"]',
        r"environment 'e': targets lists A:8001, a:8001 more than once",
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            '[environments.e.bake]\nchecks = [{ metric = "latency_ratio", min = 3.0, max = 2.0 }]',
            r"the latency_ratio check's min = 3 is above its max = 2: no value passes it",
        ),
        ("max_failure_ratio = nan", r"max_failure_ratio = nan is not a number"),
        ("max_latency_ratio = nan", r"max_latency_ratio = nan is not a number"),
        (
            '[environments.e.bake]\nchecks = [{ metric = "failure_ratio", max = nan }]',
            r"failure_ratio max = nan is not a number",
        ),
        ('canary = "nan%"', r"canary = 'nan' is not a number"),
        ("perf_seconds = nan", r"perf_seconds = nan is not a number"),
    ],
)
def test_bake_checks_and_thresholds_that_cannot_pass_or_fail_are_refused(
    tmp_path: Path, toml: Path, section: str, message: str
) -> None:
    _refused(tmp_path, toml, section, message)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_timeout_that_is_not_a_number_of_seconds_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match=f"MLREG_TRITON_TIMEOUT='{value}' is not a number of seconds"):
        Settings.from_env(env={"MLREG_HOME": "/tmp/x", "MLREG_TRITON_TIMEOUT": value})


def _pem_pair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a key at all\n", r"trusted key .*keys/k\.pem is not a PEM public key or certificate"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", r"is not a PEM public key"),
        (None, r"trusted key .*keys/k\.pem is a private key: trust takes the public key"),
    ],
)
def test_a_trusted_key_that_is_garbage_or_private_is_one_clear_error_naming_the_file(
    tmp_path: Path, toml: Path, content: bytes | None, message: str
) -> None:
    private, public = _pem_pair()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k.pem").write_bytes(private if content is None else content)
    error = _refused(tmp_path, toml, 'signatures = "required"\ntrusted_keys = ["keys/k.pem"]', message)
    if content is None:
        assert "openssl ec -in k.pem -pubout -out k.pub" in str(error.fix)
    (tmp_path / "keys" / "k.pem").write_bytes(public)  # the public half is trusted
    env = environment(_settings(tmp_path), "e")
    assert env.signatures is not None
    assert env.signatures.keys == (tmp_path / "keys" / "k.pem",)


# -- the CLI: model names and versions ------------------------------------------------------------


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return CliRunner()


def test_model_name_limit_is_what_a_local_store_can_lock(tmp_path: Path) -> None:
    """The limit is computed from the lock's file name and the temporary name it is created
    through; a name of that length locks on a real local store, a 250-character one cannot."""
    longest_temp = len(".") + len(lock_key("x" * MODEL_NAME_MAX)) + len(".new4194304.") + 8
    assert longest_temp == NAME_MAX == 255
    store = open_store(tmp_path / "store")
    with store.session.lock("m" * MODEL_NAME_MAX, wait=0):
        assert store.session.locks()[0].model == "m" * MODEL_NAME_MAX
    with (
        pytest.raises((StorageError, OSError), match="File name too long"),
        store.session.lock("m" * 250, wait=0),
    ):
        pass  # (a raw OSError today: the local store's cleanup of its temporary file fails the same way)


@pytest.mark.parametrize("length", [250, 300])
def test_a_model_name_no_store_can_lock_is_refused_at_register_before_anything_is_written(
    runner: CliRunner, tmp_path: Path, length: int
) -> None:
    name = "m" * length
    folder = tmp_path / "version"
    folder.mkdir()
    result = runner.invoke(app, ["register", name, str(folder), "--config", str(tmp_path / "config.pbtxt")])
    assert result.exit_code == 4, result.output
    assert f"error: model name '{'m' * 32}...mmmm' is {length} characters long" in result.stderr
    assert f"a model name may have at most {MODEL_NAME_MAX} characters" in result.stderr
    assert (
        f"fix: shorten the model's name to {MODEL_NAME_MAX} characters or fewer: config.pbtxt's name "
        "and its folder's name alike"
    ) in result.stderr
    assert not (tmp_path / "home").exists()  # nothing written: no registry, no state folder


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["promote", "m", "--version", "-1"], "--version '-1'"),
        (["promote", "m", "-V", "0"], "--version '0'"),
        (["rollback", "m", "--to-version", "-1"], "--to-version '-1'"),
        (["show", "m", "--version", "two"], "--version 'two'"),
        (["sign", "m", "0", "--sign-key", "k.pem"], "VERSION '0'"),
        (["alias", "set", "m", "staging", "1.5"], "VERSION '1.5'"),
    ],
)
def test_a_version_that_is_not_a_positive_number_is_named(
    runner: CliRunner, command: list[str], shown: str
) -> None:
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    assert f"error: {shown} is not a positive version number" in result.stderr
    assert "fix: pass a registered version: 1, 2, 3... ('mlreg versions MODEL' lists them)" in result.stderr


# -- a failed load quotes this version's reason ---------------------------------------------------


class IndexClient:
    """tritonclient's gRPC client as a failed load leaves it: the repository index holds v2's
    stale failure and v3's fresh one; the load answers ``said``."""

    def __init__(self, said: str) -> None:
        self.said = said

    def load_model(self, model: str, **kwargs: Any) -> None:
        from tritonclient.utils import InferenceServerException

        raise InferenceServerException(self.said, status="StatusCode.INTERNAL")

    def get_model_repository_index(self, **kwargs: Any) -> dict[str, Any]:
        return {
            "models": [
                {"name": "m", "version": "1", "state": "READY"},
                {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "v2 stale: boom"},
                {"name": "m", "version": "3", "state": "UNAVAILABLE", "reason": "v3 fresh: bang"},
                {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "other's"},
            ]
        }

    def is_model_ready(self, model: str, version: str, **kwargs: Any) -> bool:
        return False


def _triton(said: str) -> Any:
    from pipelines.triton.control import TritonControl

    triton = TritonControl("127.0.0.1:1", timeout=1.0)
    triton._client = IndexClient(said)
    return triton


def test_a_failed_load_quotes_only_the_reason_of_the_versions_it_loads() -> None:
    config = json.dumps({"name": "m", "version_policy": {"specific": {"versions": ["1", "3"]}}})
    with pytest.raises(TritonError) as caught:
        _triton("failed to poll from model repository").load("m", config=config)
    assert caught.value.message.endswith("(server's reason: v3 fresh: bang)")
    assert "stale" not in caught.value.message


def test_a_failed_load_of_the_stores_config_adds_nothing_triton_already_said() -> None:
    with pytest.raises(TritonError) as caught:
        _triton("load failed for model 'm': version 3 is at UNAVAILABLE state: v3 fresh: bang").load("m")
    assert "stale" not in caught.value.message
    assert "server's reason" not in caught.value.message


def test_waiting_for_a_version_quotes_its_reason_only() -> None:
    with pytest.raises(TritonError) as caught:
        _triton("").wait_ready("m", "3", timeout=5)
    assert caught.value.message == "127.0.0.1:1: model 'm' version 3 is UNAVAILABLE: v3 fresh: bang"


# -- the targets serve from this store, an empty one included --------------------------------------


def _context(store: Any, listed: dict[str, list[str]]) -> PromotionContext:
    fleet = SimpleNamespace(urls=list(listed), states_of=lambda url: {m: {"1": "READY"} for m in listed[url]})
    plan = SimpleNamespace(steps=[SimpleNamespace(model="m")])
    return cast(
        PromotionContext,
        SimpleNamespace(
            plan=plan,
            store=store,
            fleet=fleet,
            env=SimpleNamespace(name="e", served_from=(), local_stack=False),
        ),
    )


def test_an_empty_store_does_not_pass_for_a_target_serving_another_repository(tmp_path: Path) -> None:
    store = open_store(tmp_path / "empty")
    with pytest.raises(
        PromotionError,
        match=r"t0:8001 does not serve from the store .*empty: the store holds no other model, and its "
        r"repository lists other, unrelated \(fix",
    ):
        check_serves_from_store(_context(store, {"t0:8001": ["m", "other", "unrelated"]}))
    check_serves_from_store(_context(store, {"t0:8001": []}))  # an empty repository: nothing to load wrongly
    check_serves_from_store(_context(store, {"t0:8001": ["m"]}))  # only this promotion's model
    (tmp_path / "empty" / "other").mkdir(parents=True)
    check_serves_from_store(_context(store, {"t0:8001": ["m", "other", "unrelated"]}))  # the usual rule


# -- store ls says when archived versions disappeared ------------------------------------------------


def _ls(runner: CliRunner, root: Path, *extra: str) -> Result:
    result = runner.invoke(app, ["store", "ls", "--store", str(root), *extra])
    assert result.exit_code == 0, result.output
    return result


def test_store_ls_names_archived_versions_that_disappeared(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "models"
    store = open_store(root)
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.py").write_text("x = 1\n")
    for version in "1234":
        store.versions.put_version("m", version, source)
    archive = store.archive()
    for version in "123":
        move_to_archive(store, archive, "m", version)
    assert json.loads(_ls(runner, root, "--json").stdout)["missing"] == {}
    shutil.rmtree(root.parent / ".mlreg-archive" / "models" / "m" / "1")
    shutil.rmtree(root.parent / ".mlreg-archive" / "models" / "m" / "2")
    assert json.loads(_ls(runner, root, "--json").stdout)["missing"] == {"m": ["1", "2"]}
    assert (
        f"missing: m v1, v2: neither live nor archived (if this store held any, it was deleted from the "
        f"archive {archive.uri}; a promotion to one uploads the registry's copy again)"
    ) in _ls(runner, root).stdout
