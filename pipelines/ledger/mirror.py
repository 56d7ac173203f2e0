"""A promotion's ledger events mirrored into its MLflow run: ``ledger.jsonl`` (the events exactly
as stored, one a line) and the params ``ledger_promotion`` (the operation's id every event carries)
and ``ledger`` (where the chain is).  Best effort: a run that cannot take them is a note, never the
promotion's error -- the store's ledger is the record, the run a second copy to compare it with."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from registry.settings import redact_uri

if TYPE_CHECKING:
    from pipelines.ledger.recorder import Recorder

log = logging.getLogger(__name__)
ARTIFACT = "ledger.jsonl"


class RunLog(Protocol):
    """What the mirror needs of the registry (``registry.mlflow.MlflowRegistry`` has it)."""

    def log(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None: ...

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None: ...


def mirror(registry: RunLog, run_id: str | None, recorder: Recorder | None) -> list[str]:
    """``recorder``'s events into the run ``run_id``; the notes to add to the promotion's result:
    every call the ledger could not record, and why the run did not take the copy (none: done)."""
    if recorder is None:
        return []
    recorder.flush()
    notes = list(recorder.problems)
    if not run_id:
        return notes
    try:
        data = recorder.jsonl()
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / ARTIFACT).write_bytes(data)
            registry.log_artifacts(run_id, Path(tmp))
        params = {"ledger_promotion": recorder.promotion, "ledger": redact_uri(recorder.ledger.uri)}
        registry.log(run_id, params, {})
    except Exception as exc:  # a run that cannot take the copy never fails what it records
        note = f"the ledger's events were not copied into the MLflow run: {redact_uri(str(exc))}"
        log.warning("%s", note)
        notes.append(note)
    return notes


__all__ = ["ARTIFACT", "mirror"]
