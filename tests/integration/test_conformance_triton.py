"""Differential: each conformance case loaded on a real tritonserver 2.51 (the nvidia-pytriton wheel's
binary, explicit mode, python backend), Triton's verdict and reason against the corpus and mlreg's.

Config errors reach the client only as a failed load ("failed to poll from model repository" or the
status message); the reason is read from the repository index and the server log.  Cases that only
a backend decides (``decided-by: backend``) are not loaded: the local stack's onnxruntime and
tensorflow backends are stand-ins, not NVIDIA's C++ backends.

The verdicts are those of one Triton release (``corpus.TRITON_VERSION``): the server's own metadata
is checked against it, so a wheel that brings another tritonserver fails here, not as a changed
verdict.  Every case that Triton or mlreg rejects names its tensor or field (``names``, as Triton's
message writes it), so the "names the field" half of each check can never be vacuous.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.checks import runtime
from pipelines.devstack import local_triton
from pipelines.triton.control import TritonControl, TritonError
from registry.contracts.validate import validate_path
from registry.settings import Settings
from tests.conformance.corpus import TRITON_VERSION, Case, load_cases, materialize
from tests.integration.stacks import TEARDOWN_GRACE

CASES = [c for c in load_cases() if c.decided_by == "core"]
GPUS = 0  # this machine has no GPU: Triton's instance-group verdicts are those of a 0-GPU server

pytestmark = pytest.mark.integration


@dataclass
class Server:
    control: TritonControl
    log: Path
    repository: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One tritonserver over every core case (model names are unique across the corpus)."""
    repository = tmp_path_factory.mktemp("conformance") / "repository"
    repository.mkdir()
    for case in CASES:
        materialize(case, repository)
    state = tmp_path_factory.mktemp("conformance-state")
    info, process = local_triton.start_server(repository, state, Settings.from_env().backends_source)
    control = TritonControl(info.grpc_url, timeout=30.0, load_timeout=120.0)
    try:
        yield Server(control, Path(info.log_path), repository)
    finally:
        control.close()
        local_triton.stop_pid(info.pid, info.shm_prefix, grace=TEARDOWN_GRACE, process=process)


def triton_verdict(server: Server, case: Case) -> tuple[str, str]:
    """('accept' | 'reject', the server's reason: load error, index reason and new log lines)."""
    before = server.log.read_text(errors="replace")
    try:
        server.control.load(case.load)
    except TritonError as exc:
        new_log = server.log.read_text(errors="replace")[len(before) :]
        return "reject", f"{exc.message}\n{new_log}"
    return "accept", ""


def test_the_server_is_the_triton_release_the_verdicts_were_read_from(server: Server) -> None:
    metadata = server.control.server_metadata()
    assert (metadata["name"], metadata["version"]) == ("triton", TRITON_VERSION), metadata


def test_every_rejected_case_names_its_field_in_tritons_words() -> None:
    rejected = [c for c in load_cases() if "reject" in (c.verdict, c.mlreg)]
    assert len(rejected) >= 32  # the corpus as of Triton 2.51: 31 rejected by Triton, 1 by mlreg only
    unnamed = [c.name for c in rejected if not c.names.strip()]
    assert unnamed == [], "cases without names: (the tensor or field the message names)"
    astray = [c.name for c in rejected if c.names not in c.message]
    assert astray == [], "cases whose names are not in their message"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_triton_and_mlreg_agree(server: Server, case: Case, tmp_path: Path) -> None:
    verdict, reason = triton_verdict(server, case)
    assert verdict == case.verdict, f"Triton: {verdict} {reason}"
    if verdict == "reject":
        assert case.names, f"{case.name}: a rejected case must name its tensor or field (names:)"
        assert case.message in reason, reason
        assert case.names in reason, reason
    # mlreg on the same case: the same verdict (or, labelled [mlreg], a fault Triton leaves to inference)
    materialize(case, tmp_path)
    errors = validate_path(tmp_path, gpus=GPUS).errors
    triton_errors = [f for f in errors if f.origin == "triton"]
    assert ("reject" if triton_errors else "accept") == verdict, [f.line() for f in errors]
    if verdict == "reject":
        assert any(case.message in f.line() and case.names in f.line() for f in triton_errors)
    if case.mlreg != verdict:
        assert case.names, f"{case.name}: a case mlreg rejects must name its tensor or field (names:)"
        lines = [f.line() for f in errors if f.origin == "mlreg" and case.message in f.line()]
        assert any(case.names in text for text in lines), [f.line() for f in errors]


def test_the_runtime_gate_reads_this_servers_release_and_names_its_hazards(server: Server) -> None:
    """The runtime gate (pipelines/checks/runtime.py) on the real 2.51 server: its ServerMetadata
    read through the gate's reader, the version parsed, and the hazards named for an S3 store (the
    SIGPIPE row, fixed in 2.70.0) and a local one (not that row)."""
    replica = runtime.read_replica(server.control)
    assert replica.version == (2, 51, 0)
    assert replica.version_text == TRITON_VERSION
    assert "model_repository" in replica.extensions
    settings = runtime.RuntimeSettings(policy="refuse")
    on_s3 = {
        r.subject: r for r in runtime.hazard_records(replica, runtime.store_kind("s3://models/p"), settings)
    }
    local = {r.subject for r in runtime.hazard_records(replica, runtime.store_kind("/srv/models"), settings)}
    sigpipe = on_s3["hazard s3-sigpipe"]
    assert sigpipe.result == "fail"
    assert sigpipe.refuses()
    assert sigpipe.replica == server.control.url
    assert sigpipe.line.startswith(
        f"replica {server.control.url} runs Triton 2.51.0: a replica loading from S3"
    )
    assert sigpipe.threshold == "fixed in 2.70.0 (container 26.06)"
    assert "hazard s3-sigpipe" not in local
    assert set(on_s3) - local == {"hazard s3-sigpipe"}
    assert {"hazard psirt-5687-python-backend-chain", "hazard load-file-overflow"} <= local
