"""The pure parts of issue 26's items 1, 2 and 7: a full disk recognised, the record stage's
writes put back, the no-op's alias repair, status over what serves and what the alias names; and
issue 38's item 1 on a real database another process holds (nothing of it needs MLflow's import)
and item 5's undo of a failed ``mlreg sign``."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mlreg.cli.main import app
from mlreg.ops.status_replicas import served_models
from mlreg.ops.status_rows import _missing_detail
from pipelines.core.context import Options
from pipelines.core.ports import Registry
from pipelines.core.undo import UndoLog
from pipelines.fleet.fleet import Fleet
from pipelines.promote.environments import Environment
from pipelines.promote.record import RecordWrites, failed_record, repair_record
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from registry.disk import disk_full_error, is_disk_full
from registry.errors import RegistryError
from registry.manifest import CONFIG_ENTRY, digest_of_manifest, manifest_of, sha256_file
from registry.mlflow import MlflowRegistry
from registry.mlflow.translate import translated
from registry.register import sign_registered
from registry.settings import Settings
from registry.signing import SIGNATURE_ARTIFACT, SIGNED_BY_TAG, SigningKey
from tests.cli import CliRunner
from tests.conftest import TEMPLATE
from tests.fakes import FakeRegistry
from tests.unit.worlds import Servers


def test_enospc_and_sqlites_full_database_are_one_disk_full_error(tmp_path: Path) -> None:
    inner = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x" / "f"))
    wrapped = RuntimeError("MLflow wrapped it")
    wrapped.__cause__ = inner
    assert is_disk_full(wrapped)
    error = disk_full_error(wrapped, tmp_path, "MLflow artifact upload")
    assert error.message == f"disk full at {tmp_path}: MLflow artifact upload failed"
    assert "free space" in (error.fix or "")
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert not is_disk_full(OSError(errno.ECONNREFUSED, "Connection refused"))


def test_a_failed_alias_move_is_put_back_by_the_undo_log_with_the_tags_and_says_what_moved(
    tmp_path: Path,
) -> None:
    registry = FakeRegistry()
    registry.alias_map = {"member": {"s3": "8"}, "ens": {"s3": "3"}}
    registry.tags[("member", "5")] = {}
    writes = RecordWrites(cast(Registry, registry), "s3", "promoted_s3")
    undo = UndoLog(gpu=False)
    undo.wrote_registry(writes)  # as the record stage does, before its first write
    writes.tag_version("member", "5", "2026-12-04T10:00:00Z")
    writes.move_alias("member", "5")
    assert registry.alias_map["member"] == {"s3": "5"}  # the move happened
    registry.fail_on.add("set_alias ens")
    with pytest.raises(RegistryError) as info:
        writes.move_alias("ens", "4")
    registry.fail_on.clear()
    error = failed_record(writes, info.value)
    assert "the aliases it moved go back: member (was v8)" in error.message
    store = open_store(tmp_path / "store")
    report = undo.replay(Fleet(store, (), lambda url: None, 1), store)  # type: ignore[arg-type, return-value]
    assert registry.alias_map == {"member": {"s3": "8"}, "ens": {"s3": "3"}}
    assert "promoted_s3" not in registry.tags[("member", "5")]
    assert report.restored == [  # newest first; the failed write noted before it was sent: put back too
        "alias 's3' of ens (moved to v4) back to v3",
        "alias 's3' of member (moved to v5) back to v8",
    ]
    assert report.ok


def test_mlflow_down_leaves_the_moves_named_in_the_undo_report(tmp_path: Path) -> None:
    registry = FakeRegistry()
    registry.alias_map = {"member": {"s3": "8"}}
    writes = RecordWrites(cast(Registry, registry), "s3", "promoted_s3")
    undo = UndoLog(gpu=False)
    undo.wrote_registry(writes)
    writes.move_alias("member", "5")
    registry.down = True
    error = failed_record(writes, RegistryError("MLflow: alias update failed"))
    assert "a rerun repairs its alias" in (error.fix or "")
    store = open_store(tmp_path / "store")
    report = undo.replay(Fleet(store, (), lambda url: None, 1), store)  # type: ignore[arg-type, return-value]
    assert report.failed == [
        "alias 's3' of member (moved to v5) could not be put back to 8: "
        "MLflow (memory://registry): set_alias failed: connection refused"
    ]


def test_the_no_op_repairs_the_alias_and_a_failed_attempts_tag() -> None:
    registry = FakeRegistry()
    registry.alias_map = {"member": {"s3": "5"}}
    registry.tags[("member", "8")] = {"promoted_s3": "2026-12-04T09:00:00Z"}
    registry.tags[("member", "5")] = {"promoted_s3": "2026-12-04T10:00:00Z"}  # the failed attempt's
    registry.tags[("member", "2")] = {"promoted_s3": "2026-12-01T10:00:00Z"}  # history: kept
    env = SimpleNamespace(name="s3", alias="s3")
    notes = repair_record(cast(Registry, registry), env, {"member": "8"})  # type: ignore[arg-type]
    assert registry.alias_map["member"]["s3"] == "8"
    assert "promoted_s3" not in registry.tags[("member", "5")]
    assert registry.tags[("member", "2")] == {"promoted_s3": "2026-12-01T10:00:00Z"}
    assert notes[0] == "alias 's3' of member moved back to v8 (was 5)"


def test_status_takes_what_serves_and_says_what_the_store_lacks() -> None:
    live: dict[str, Any] = {
        "a:8001": {"scorer": {"5": "READY"}, "old": {"": ""}},
        "b:8001": "unreachable: refused",
    }
    assert served_models(live) == {"scorer"}
    detail = _missing_detail("5", {"a:8001": ["5"], "b:8001": "unreachable"})
    assert detail == " (alias names v5, v5 serves): a restarted replica cannot load it"


# -- issue 38, item 1: the embedded registry's database held by another process -----------------

HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def _held(db: Path) -> Iterator[int]:
    """A second process holding ``db`` in a ``BEGIN EXCLUSIVE`` transaction until the block ends;
    yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.communicate("", timeout=30)  # stdin closed: it rolls back and ends


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _model_folder(where: Path, name: str) -> Path:
    """The template's python-backend model as model ``name``."""
    folder = where / name
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "table_data_preprocess"', f'name: "{name}"'))
    return folder


def test_a_registry_database_another_process_holds_is_one_error_naming_it_and_a_rerun_reads_it(
    registry_state: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Item 1: ``BEGIN EXCLUSIVE`` held on the real mlflow.db (made by MLflow: model ``a`` v1, alias
    ``production``) by a second process.  ``versions`` and ``register`` exit 4 once the bounded wait
    (MLREG_MLFLOW_TIMEOUT, 0.2 s here; was 12-22 s and exit 70) ran out, naming the file, the
    process that holds it and the fix; ``status`` says it on the model's row.  The database is not
    written; once the other process ends its transaction the same commands read it."""
    home = registry_state("a_v1_production")
    db = home / "mlflow.db"
    _model_folder(home / "model_repository", "a")  # status lists the store's models
    candidate = _model_folder(tmp_path / "candidate", "a")
    monkeypatch.setenv("MLREG_HOME", str(home))
    monkeypatch.setenv("MLREG_MLFLOW_TIMEOUT", "0.2")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLREG_DEBUG", raising=False)
    runner, before = CliRunner(), _sha256(db)
    with _held(db) as pid:
        _commands_refused(runner, db, pid, candidate)
        registry = MlflowRegistry(Settings.from_env())
        _adapter_refused(registry)
        _promote_refused(home, tmp_path, capfd)
    assert _sha256(db) == before  # nothing written
    listed = runner.invoke(app, ["versions", "a"])
    assert listed.exit_code == 0, listed.output
    assert [line.split()[0] for line in listed.output.splitlines()[1:]] == ["1"]
    assert "production" in listed.output
    assert registry.models.aliases("a") == {"production": "1"}  # the same adapter, patient again
    assert "locked" not in runner.invoke(app, ["status"]).output


def _commands_refused(runner: CliRunner, db: Path, pid: int, candidate: Path) -> None:
    """``versions`` and ``register`` exit 4 naming the file, its holder and the fix; ``status``
    says it on the model's row."""
    said = f"error: the embedded MLflow registry {db} is locked by another process (held by pid {pid} ("
    for args, code in ((["versions", "a"], 4), (["register", "a", str(candidate)], 4), (["status"], 1)):
        result = runner.invoke(app, args)
        assert result.exit_code == code, (args, result.output)
        assert "Traceback" not in result.output
        assert "internal error" not in result.output
        if code == 4:
            assert said in result.output, result.output
            assert "failed after 0.2 s" in result.output
            assert "fix: wait until that process ends its transaction, or stop it" in result.output
    assert f"a drift: MLflow unreachable: the embedded MLflow registry {db} is locked" in result.output


def _adapter_refused(registry: MlflowRegistry) -> None:
    """The adapter's ping waits once in vain; its next read fails at once."""
    with pytest.raises(RegistryError, match="is locked by another process") as info:
        registry.models.ping()
    assert info.value.context["code"] == "DATABASE_LOCKED"
    with pytest.raises(RegistryError, match="is locked by another process") as info:
        registry.models.aliases("a")  # this adapter waited once in vain: at once now
    assert info.value.message.endswith(": reading it failed")  # no "after 0.2 s": no wait


def _promote_refused(home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A promotion over fake Tritons with the real adapter: its MLflow warm-up thread meets the
    lock and keeps quiet (it printed two tracebacks), the promotion stops before any change with
    the one RegistryError (exit 4), and nothing was loaded."""
    store = tmp_path / "store"
    shutil.copytree(home / "model_repository", store)
    servers = Servers(store)
    env = Environment("test", str(store), ("t0:8001",), "test", gpu=False)
    registry = MlflowRegistry(Settings.from_env())
    promotion = Promotion(
        registry.settings, env, registry, Options(skip_quality=True), connect=servers.connect
    )
    capfd.readouterr()
    with pytest.raises(RegistryError, match="is locked by another process"):
        promotion.run("a", "1")
    assert registry.connection.warming is not None
    registry.connection.warming.join(10)
    assert not registry.connection.warming.is_alive()
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out
    assert "Exception in thread" not in printed.err + printed.out
    assert servers.loads == 0


def test_a_locked_database_in_any_wrapping_is_the_locked_error(tmp_path: Path) -> None:
    """MLflow wraps sqlite's error in SQLAlchemy's: recognised along the chain, for the embedded
    registry (a server's database is the server's to report), without importing MLflow."""
    outer = RuntimeError("(sqlite3.OperationalError) database is locked [SQL: SELECT ...]")
    outer.__cause__ = sqlite3.OperationalError("database is locked")
    db = tmp_path / "mlflow.db"
    error = translated(f"sqlite:///{db}", tmp_path, "tag update", outer)
    assert error is not None
    assert (
        error.message
        == f"the embedded MLflow registry {db} is locked by another process: MLflow tag update failed"
    )
    assert error.context == {"path": str(db), "code": "DATABASE_LOCKED"}
    assert "stop it" in (error.fix or "")


# -- issue 38, item 5: what a failed ``mlreg sign`` wrote ---------------------------------------


class _SignRegistry:
    """The registry calls ``sign_registered`` makes (``registry.ports.Signatory``), on ``source``
    (a Triton model folder): its run's artifacts at ``artifacts`` (a local folder, or a remote
    URI), the tag update failing as on a full disk."""

    def __init__(self, source: Path, artifacts: str, signed_by: str) -> None:
        config = source / "config.pbtxt"
        config_meta = {"sha256": sha256_file(config), "size": config.stat().st_size}
        digest = digest_of_manifest({**manifest_of(source / "1"), CONFIG_ENTRY: config_meta})
        self.source, self.artifacts = source, artifacts
        self.tags = {"artifact_digest": digest, **({SIGNED_BY_TAG: signed_by} if signed_by else {})}

    @property
    def runs(self) -> _SignRegistry:
        """The version's run (``registry.ports.SignatoryRuns``): this fake holds its artifacts."""
        return self

    @property
    def models(self) -> _SignRegistry:
        """The version (``registry.ports.SignatoryVersions``): this fake holds it too."""
        return self

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        return dict(self.tags)

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        shutil.copytree(self.source, dest)
        return dict(self.tags)

    def version(self, name: str, version: str) -> SimpleNamespace:
        return SimpleNamespace(run_id="r1", description="")

    def artifact_uri(self, run_id: str) -> str:
        return self.artifacts

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        if self.artifacts.startswith("file://"):
            shutil.copytree(folder, self.artifacts.removeprefix("file://"), dirs_exist_ok=True)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        raise disk_full_error(
            OSError(errno.ENOSPC, "No space left on device"), self.source, "MLflow tag update"
        )

    def update_version_description(self, name: str, version: str, description: str) -> None:
        raise AssertionError("not reached: the tag's update failed first")


def _pem_key(folder: Path) -> Path:
    key = folder / "release.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key


def test_a_failed_sign_puts_the_previous_signature_back_or_says_that_its_own_stays(tmp_path: Path) -> None:
    """The tag's update fails after the signature was written into the version's run.  A local
    artifact folder gets back what it held (the earlier signer's file: the tag still names that
    signer) and the fix says it was removed; a remote store, whose files MLflow's client cannot
    delete, is named with the file that stays and the rerun that replaces it."""
    source, key = _model_folder(tmp_path / "source", "a"), _pem_key(tmp_path)
    run = tmp_path / "run-artifacts"
    run.mkdir()
    (run / SIGNATURE_ARTIFACT).write_bytes(b"the earlier signature")
    local = _SignRegistry(source, run.as_uri(), signed_by="key 0123")
    with pytest.raises(RegistryError, match="MLflow tag update failed") as info:
        sign_registered(local, "a", "1", SigningKey(key))
    assert (run / SIGNATURE_ARTIFACT).read_bytes() == b"the earlier signature"
    assert str(info.value.fix).endswith(
        "then run the command again (what the failed command wrote was removed)"
    )

    remote = _SignRegistry(source, "s3://bucket/1/r1/artifacts", signed_by="")
    with pytest.raises(RegistryError, match="MLflow tag update failed") as info:
        sign_registered(remote, "a", "1", SigningKey(key))
    assert "was removed" not in str(info.value.fix)
    assert str(info.value.fix).endswith(
        f"; the signature it wrote stays in run r1's artifacts ({SIGNATURE_ARTIFACT}) while a v1 is "
        "unsigned: 'mlreg sign' again replaces it"
    )
