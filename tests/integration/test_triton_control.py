"""Triton control against real servers: load failures, unreachable servers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines.devstack import local_triton
from pipelines.triton.control import TritonControl
from registry.errors import TritonError
from registry.settings import Settings
from tests.conftest import failing_python_model
from tests.integration.stacks import TEARDOWN_GRACE

pytestmark = pytest.mark.integration

FAILING_MODEL = failing_python_model("weights checksum mismatch in initialize")


# Triton loading the whole template from S3 and answering the seed request: the first promotion of
# tests/integration/test_promote.py::test_a_promotion_to_an_s3_store (one full-ensemble S3 load).


def test_a_failed_reload_reports_the_reason_and_the_old_version_keeps_serving(
    built_repository: Path,
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(built_repository / "table_data_preprocess", repo / "table_data_preprocess")
    info, process = local_triton.start_server(repo, tmp_path / "state", Settings.from_env().backends_source)
    try:
        with TritonControl(info.grpc_url, load_timeout=120) as triton:
            triton.load("table_data_preprocess")
            (repo / "table_data_preprocess" / "2").mkdir()
            (repo / "table_data_preprocess" / "2" / "model.py").write_text(FAILING_MODEL)
            with pytest.raises(TritonError, match="weights checksum mismatch in initialize"):
                triton.load("table_data_preprocess")
            assert triton.is_ready("table_data_preprocess", "1")
            ones = np.ones((1, 1), np.int8)
            out = triton.infer(
                "table_data_preprocess",
                {"table_data_input_1": ones, "table_data_input_2": ones},
                ["table_data_output_1"],
                version="1",
            )
            np.testing.assert_array_equal(out["table_data_output_1"], [[1, 0, 0]])
    finally:
        local_triton.stop_pid(info.pid, info.shm_prefix, grace=TEARDOWN_GRACE, process=process)


def test_an_unreachable_server_fails_fast_with_what_to_check() -> None:
    url = f"127.0.0.1:{local_triton.free_port()}"
    with (
        TritonControl(url, timeout=2) as triton,
        pytest.raises(TritonError, match=rf"live check failed on {url}"),
    ):
        triton.is_live()
