"""The pure parts of issue 26's items 1, 2 and 7: a full disk recognised, the record stage's
writes put back, the no-op's alias repair, status over what serves and what the alias names."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pipelines.promote.fanout import Fleet
from pipelines.promote.ports import Registry
from pipelines.promote.record import RecordWrites, failed_record, repair_record
from pipelines.promote.status import _missing_detail, served_models
from pipelines.promote.undo import UndoLog
from pipelines.storage import open_store
from registry.errors import RegistryError
from registry.mlflow.disk import disk_full_error, is_disk_full
from tests.fakes import FakeRegistry


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
