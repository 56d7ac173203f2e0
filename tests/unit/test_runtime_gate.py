"""The runtime gate (pipelines/checks/runtime.py): its hazard table case by case (version x store x
frontend), the environment's policy, an ONNX model beyond a replica's ONNX Runtime refused before
any load naming both versions, and SavedModels on a release with no TensorFlow backend.

The replica is a stand-in that answers ServerMetadata as tritonserver does (``{"name": "triton",
"version": "2.51.0", "extensions": [...]}``) and records any load: the real server's metadata is
read in tests/integration/test_triton.py.  Models are built with onnx.helper here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipelines.checks import runtime
from pipelines.checks.runtime import RuntimeSettings, parse_runtime
from pipelines.checks.runtime_tables import CONTAINERS, HAZARDS, ORT_LIMITS
from registry.errors import PromotionError, UsageError

URL = "127.0.0.1:8001"
REFUSE = RuntimeSettings(policy="refuse")  # production's policy (the default notes)

# the spec: each row's fixing release (a change to the table shows here first)
FIXED = {
    "s3-sigpipe": "2.70.0",
    "sagemaker-restricted-api": "2.67.0",
    "vertex-restricted-api": "2.67.0",
    "sagemaker-mme-invoke": "2.71.0",
    "load-file-overflow": "2.53.0",
    "psirt-5687-python-backend-chain": "2.59.1",
    "psirt-5687-critical": "2.59.1",
    "psirt-5691": "2.60.0",
    "psirt-5723": "2.61.0",
    "psirt-5734": "2.62.0",
    "psirt-5790": "2.65.0",
    "psirt-5816": "2.66.0",
    "psirt-5828": "2.67.0",
    "psirt-5848": "2.68.0",
    "psirt-5875-authorization": "2.68.0",
    "psirt-5853": "2.69.0",
    "psirt-5865": "2.70.0",
    "psirt-5875-iteration": "2.71.0",
}
CONDITIONAL = {"s3-sigpipe", "sagemaker-restricted-api", "vertex-restricted-api", "sagemaker-mme-invoke"}
CONDITIONAL |= {"load-file-overflow"}


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def any_store_any_frontend(version: str) -> set[str]:
    """The rows with no condition that a release before their fix has."""
    return {h for h, fixed in FIXED.items() if h not in CONDITIONAL and _v(version) < _v(fixed)}


class StandIn:
    """A replica's ServerMetadata as tritonserver answers it; a load is recorded (never expected)."""

    def __init__(self, version: Any, url: str = URL) -> None:
        self.url = url
        self.version = version
        self.loads: list[str] = []

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": "triton",
            "version": self.version,
            "extensions": ["classification", "model_repository"],
        }

    def load(self, model: str, config: str | None = None, files: Any = None) -> None:
        self.loads.append(model)


def test_the_table_holds_every_row_of_the_spec_with_a_source() -> None:
    assert {h.id: ".".join(map(str, h.fixed_in)) for h in HAZARDS} == FIXED
    assert all(h.sources and h.what and h.severity in runtime.SEVERITIES for h in HAZARDS)


CASES = [
    # (server version, store, frontends, the conditional hazards expected)
    ("2.51.0", "local", "grpc", set()),
    ("2.51.0", "local", "grpc,http", {"load-file-overflow"}),
    ("2.51.0", "s3", "grpc,http", {"s3-sigpipe", "load-file-overflow"}),
    ("2.51.0", "s3", "grpc,http,sagemaker", {"s3-sigpipe", "load-file-overflow", "sagemaker-restricted-api"}),
    ("2.51.0", "local", "grpc,vertex", {"vertex-restricted-api"}),
    ("2.45.0", "local", "http", {"load-file-overflow"}),
    ("2.52.0", "local", "http", {"load-file-overflow"}),
    ("2.53.0", "local", "http", set()),  # the overflow's fixing release itself
    ("2.55.0", "s3", "grpc,http", {"s3-sigpipe"}),
    ("2.59.0", "local", "grpc", set()),
    ("2.59.1", "local", "grpc", set()),  # past the 2025-08 bulletin
    ("2.59.1", "s3", "http", {"s3-sigpipe"}),
    ("2.62.0", "local", "grpc", set()),
    ("2.66.0", "local", "sagemaker", {"sagemaker-restricted-api"}),
    ("2.67.0", "local", "sagemaker", set()),  # #8686 reached 2.67.0 through #8693
    ("2.66.0", "local", "vertex", {"vertex-restricted-api"}),
    ("2.67.0", "local", "vertex", set()),
    ("2.68.0", "local", "grpc", set()),
    ("2.69.0", "s3", "grpc", {"s3-sigpipe"}),
    ("2.69.0", "local", "sagemaker", set()),
    ("2.70.0", "s3", "grpc", set()),  # #8768's release: the S3 row is gone
    ("2.70.0", "local", "grpc", set()),
    ("2.70.0", "s3", "sagemaker", set()),
    ("2.71.0", "s3", "grpc,http,sagemaker,vertex", set()),
    ("2.72.0", "local", "grpc,http", set()),
]
# the SageMaker MME /invoke row (fixed in 2.71.0) joins every sagemaker case before 2.71
for i, (version, store, frontends, expected) in enumerate(CASES):
    if "sagemaker" in frontends and _v(version) < (2, 71, 0):
        CASES[i] = (version, store, frontends, expected | {"sagemaker-mme-invoke"})


@pytest.mark.parametrize(("version", "store", "frontends", "conditional"), CASES)
def test_hazard_table_case(version: str, store: str, frontends: str, conditional: set[str]) -> None:
    settings = RuntimeSettings(frontends=frozenset(frontends.split(",")))
    replica = runtime.read_replica(StandIn(version))
    records = runtime.hazard_records(replica, store, settings)
    expected = conditional | any_store_any_frontend(version)
    failed = {r.subject.removeprefix("hazard ") for r in records if r.result == "fail"}
    assert failed == expected
    if not expected:
        assert [r.result for r in records] == ["pass"]
        assert "matches no known hazard" in records[0].line
    for r in records:
        assert r.replica == URL
        assert r.name == "runtime"
        assert r.measured.startswith(f"Triton {version} (store {store}, frontends ")
        if r.result == "fail":
            fixed = FIXED[r.subject.removeprefix("hazard ")]
            container = next(c for c, (v, _) in CONTAINERS.items() if v >= _v(fixed))
            assert r.threshold.startswith(f"fixed in {fixed}")
            assert f"fixed in {fixed}" in r.line
            assert f"runs Triton {version}" in r.line
            assert r.fix.startswith(f"upgrade the replicas to Triton >= {fixed} (container {container}")


def test_the_s3_sigpipe_row_names_its_sources_and_the_release_that_fixes_it() -> None:
    replica = runtime.read_replica(StandIn("2.51.0"))
    (s3,) = [r for r in runtime.hazard_records(replica, "s3", REFUSE) if "s3-sigpipe" in r.subject]
    assert "server#8767" in s3.line
    assert "server#8768" in s3.line
    assert s3.threshold == "fixed in 2.70.0 (container 26.06)"
    assert (
        s3.fix
        == "upgrade the replicas to Triton >= 2.70.0 (container 26.06, nvcr.io/nvidia/tritonserver:26.06-py3)"
    )
    assert s3.refuses()  # high, under the default policy


def test_policy_refuses_at_its_severity_and_notes_below_it_or_when_accepted() -> None:
    replica = runtime.read_replica(StandIn("2.66.0"))
    by_id = {
        r.subject.removeprefix("hazard "): r
        for r in runtime.hazard_records(
            replica, "s3", RuntimeSettings("refuse", frontends=frozenset({"grpc", "sagemaker"}))
        )
    }
    assert by_id["sagemaker-restricted-api"].enforced  # high
    assert by_id["psirt-5828"].enforced  # critical
    assert not by_id["sagemaker-mme-invoke"].enforced  # medium: noted, never refuses
    assert by_id["sagemaker-mme-invoke"].result == "fail"  # ... but recorded as the failure it is
    noted = RuntimeSettings(policy="note")
    assert not any(r.enforced for r in runtime.hazard_records(replica, "s3", noted))
    accepted = RuntimeSettings("refuse", accept=frozenset({"s3-sigpipe"}))
    kept = {r.subject: r.enforced for r in runtime.hazard_records(replica, "s3", accepted)}
    assert kept["hazard s3-sigpipe"] is False
    assert kept["hazard psirt-5828"] is True
    only_critical = RuntimeSettings("refuse", refuse_at="critical")
    enforced = {r.subject for r in runtime.hazard_records(replica, "s3", only_critical) if r.enforced}
    assert enforced == {"hazard psirt-5828", "hazard psirt-5865"}


def test_a_refusal_names_the_hazard_its_source_and_the_fixing_release() -> None:
    replica = runtime.read_replica(StandIn("2.69.0"))
    records = runtime.hazard_records(replica, "s3", REFUSE)
    with pytest.raises(PromotionError) as info:
        runtime.enforce(records)
    assert info.value.message.startswith(
        f"runtime gate: replica {URL} runs Triton 2.69.0: a replica loading from S3"
    )
    assert "server#8768" in info.value.message
    assert "fixed in 2.70.0 (container 26.06)" in info.value.message
    assert "(and 2 more runtime finding(s))" in info.value.message  # psirt-5865, psirt-5875-iteration
    assert info.value.fix is not None
    assert info.value.fix.startswith("upgrade the replicas to Triton >= 2.70.0")
    recorded = info.value.context["records"]
    assert isinstance(recorded, list)
    assert [r["subject"] for r in recorded] == [r.subject for r in records]
    runtime.enforce(runtime.hazard_records(replica, "s3", RuntimeSettings(policy="note")))  # noted: no raise


@pytest.mark.parametrize("version", ["", "2.51", "banana", "2.51.0; rm -rf /", "9" * 70, None, 251])
def test_a_version_the_tables_cannot_read_is_inconclusive_and_refuses(version: object) -> None:
    replica = runtime.read_replica(StandIn(version))
    assert replica.version is None
    assert len(replica.version_text) <= runtime.MAX_VERSION_CHARS
    (record,) = runtime.hazard_records(replica, "local", REFUSE)
    assert record.result == "inconclusive"
    assert record.refuses()
    (noted,) = runtime.hazard_records(replica, "local", RuntimeSettings(policy="note"))
    assert noted.result == "inconclusive"
    assert not noted.refuses()


def test_read_replica_takes_version_and_extensions_from_server_metadata() -> None:
    replica = runtime.read_replica(StandIn("2.73.0dev"))
    assert replica.version == (2, 73, 0)
    assert replica.version_text == "2.73.0dev"
    assert replica.extensions == ("classification", "model_repository")


def test_parse_runtime_defaults_values_and_refusals() -> None:
    where = "mlreg.toml [environments.prod.runtime]"
    assert parse_runtime({}, where) == RuntimeSettings()
    assert RuntimeSettings().frontends == {"grpc", "http"}
    assert RuntimeSettings().policy == "note"
    parsed = parse_runtime(
        {
            "policy": "note",
            "refuse_at": "critical",
            "frontends": ["grpc", "sagemaker"],
            "accept": ["s3-sigpipe"],
        },
        where,
    )
    assert parsed == RuntimeSettings(
        policy="note",
        refuse_at="critical",
        frontends=frozenset({"grpc", "sagemaker"}),
        accept=frozenset({"s3-sigpipe"}),
    )
    bad: list[tuple[dict[str, object], str]] = [
        ({"polcy": "note"}, "unknown runtime key(s) polcy"),
        ({"policy": "warn"}, "runtime.policy = 'warn' is not one of note, refuse"),
        ({"refuse_at": "severe"}, "runtime.refuse_at = 'severe'"),
        ({"frontends": ["grpc", "kserve"]}, "runtime.frontends names kserve"),
        ({"frontends": "grpc"}, "runtime.frontends must be a list of strings"),
        ({"accept": ["no-such-hazard"]}, "runtime.accept names no-such-hazard"),
    ]
    for table, message in bad:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
            parse_runtime(table, where)
        assert info.value.message.startswith(where)
        assert info.value.fix


def test_store_kind_reads_the_store_uri() -> None:
    assert runtime.store_kind("s3://models/production") == "s3"
    assert runtime.store_kind("S3://127.0.0.1:9000/b/p") == "s3"
    assert runtime.store_kind("/srv/models") == "local"
    assert runtime.store_kind("file:///srv/s3://x") == "local"


# -- ONNX ------------------------------------------------------------------------------------


def onnx_model(path: Path, opset: int, ir: int, ml: int | None = None, weights: int = 0) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    w = numpy_helper.from_array(np.zeros((max(weights, 1), 4), np.float32)[:1], "w")
    inits = [w] + ([numpy_helper.from_array(np.ones(weights, np.float32), "big")] if weights else [])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml)] if ml else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir
    onnx.save(model, path)
    return path


def test_the_reader_agrees_with_onnx_and_skips_the_weights(tmp_path: Path) -> None:
    path = onnx_model(tmp_path / "model.onnx", opset=19, ir=9, ml=3, weights=2_000_000)  # 8 MB of weights
    found = runtime.read_onnx_versions(path)
    loaded = onnx.load(str(path), load_external_data=False)
    assert found.ir == loaded.ir_version == 9
    assert found.opsets == {
        (i.domain if i.domain != "ai.onnx" else ""): i.version for i in loaded.opset_import
    }
    assert found.opsets == {"": 19, "ai.onnx.ml": 3}


def test_an_onnx_opset_beyond_the_replicas_onnx_runtime_is_refused_before_any_load(tmp_path: Path) -> None:
    path = onnx_model(tmp_path / "model.onnx", opset=23, ir=10)
    server = StandIn("2.55.0")  # container 25.02, ONNX Runtime 1.20.1: IR <= 10, opset <= 21
    record = runtime.onnx_record(runtime.read_replica(server), "net", path, REFUSE)
    assert record.result == "fail"
    assert record.refuses()
    assert record.line == (
        "net: model opset 23 > 21: ONNX Runtime 1.20.1 of Triton 2.55.0 (container 25.02) supports up to "
        "IR <= 10, opset <= 21, ai.onnx.ml <= 5"
    )
    assert record.measured == "IR 10, opsets ai.onnx 23"
    assert record.fix.endswith(
        "upgrade the replicas to Triton >= 2.60.0 (container 25.08, ONNX Runtime 1.23.0)"
    )
    with pytest.raises(
        PromotionError, match="runtime gate: net: model opset 23 > 21: ONNX Runtime 1.20.1 of Triton"
    ):
        runtime.enforce([record])
    assert server.loads == []  # judged from metadata and the file alone


@pytest.mark.parametrize(
    ("version", "opset", "ir", "ml", "over"),
    [
        ("2.45.0", 20, 9, None, ""),  # ONNX Runtime 1.17.3
        ("2.45.0", 21, 9, None, "opset 21 > 20"),
        ("2.51.0", 21, 10, None, ""),  # ONNX Runtime 1.19.2: this machine's tritonserver's release
        ("2.51.0", 22, 10, None, "opset 22 > 21"),
        ("2.55.0", 21, 10, None, ""),
        ("2.55.0", 21, 11, None, "IR version 11 > 10"),
        ("2.55.0", 17, 8, 6, "ai.onnx.ml opset 6 > 5"),
        ("2.60.0", 23, 11, None, ""),
        ("2.60.0", 24, 11, None, "opset 24 > 23"),
        ("2.71.0", 26, 13, None, ""),
    ],
)
def test_onnx_limits_by_release(
    tmp_path: Path, version: str, opset: int, ir: int, ml: int | None, over: str
) -> None:
    record = runtime.onnx_record(
        runtime.read_replica(StandIn(version)),
        "net",
        onnx_model(tmp_path / "m.onnx", opset, ir, ml),
        RuntimeSettings(),
    )
    _, ort = next(v for v in CONTAINERS.values() if v[0] == _v(version))
    assert record.result == ("fail" if over else "pass")
    assert (over in record.line) if over else record.line.startswith("net (IR ")
    assert f"ONNX Runtime {ort} of Triton {version}" in record.line


def test_an_unreadable_onnx_file_fails_naming_it(tmp_path: Path) -> None:
    good = onnx_model(tmp_path / "good.onnx", opset=17, ir=8).read_bytes()
    bad = tmp_path / "model.onnx"
    bad.write_bytes(good[: len(good) // 2])
    record = runtime.onnx_record(runtime.read_replica(StandIn("2.55.0")), "net", bad, RuntimeSettings())
    assert record.result == "fail"
    assert str(bad) in record.line
    assert "not a readable ONNX model" in record.line
    (tmp_path / "text.onnx").write_text("not protobuf at all")
    other = runtime.onnx_record(
        runtime.read_replica(StandIn("2.55.0")), "n", tmp_path / "text.onnx", RuntimeSettings()
    )
    assert other.result == "fail"


def test_every_container_has_its_onnx_runtimes_limits_with_a_source() -> None:
    assert all(runtime.ort_limits(ort) is not None for _, ort in CONTAINERS.values())
    assert all(limits.source for limits in ORT_LIMITS.values())


def test_a_release_whose_onnx_runtime_is_not_in_the_tables_is_inconclusive(tmp_path: Path) -> None:
    path = onnx_model(tmp_path / "m.onnx", opset=17, ir=8)
    record = runtime.onnx_record(runtime.read_replica(StandIn("2.99.0")), "net", path, REFUSE)
    assert record.result == "inconclusive"
    assert record.refuses()
    assert record.line == "the ONNX Runtime of Triton 2.99.0 is not in the tables: net unjudged"


# -- SavedModel --------------------------------------------------------------------------------


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (lengths < 128 here)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def saved_model(folder: Path, tf_version: str) -> Path:
    """saved_model.pb with one meta graph whose MetaInfoDef says ``tf_version`` (field numbers of
    tensorflow's saved_model.proto and meta_graph.proto), and a signature map after it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = _ld(4, b"serve") + _ld(5, tf_version.encode()) + _ld(6, b"v2.17.0-rc1-2-gabc")
    meta = _ld(1, info) + _ld(5, _ld(1, b"serving_default"))
    (folder / "saved_model.pb").write_bytes(b"\x08\x01" + _ld(2, meta))
    return folder


def test_a_saved_model_on_a_release_without_the_tensorflow_backend_is_refused(tmp_path: Path) -> None:
    folder = saved_model(tmp_path / "1" / "model.savedmodel", "2.17.0")
    assert runtime.read_tf_versions(folder) == ["2.17.0"]
    record = runtime.saved_model_record(
        runtime.read_replica(StandIn("2.56.0")), "image_model", folder, REFUSE
    )
    assert record.result == "fail"
    assert record.refuses()
    assert record.line == (
        "image_model is a SavedModel (TensorFlow 2.17.0); Triton 2.56.0 has no TensorFlow backend "
        "(the last is in 2.55.0 (container 25.02))"
    )
    assert "--serve-as onnx" in record.fix
    kept = runtime.saved_model_record(
        runtime.read_replica(StandIn("2.55.0")), "image_model", folder, RuntimeSettings()
    )
    assert kept.result == "skipped"
    assert not kept.refuses()
    assert kept.measured == "TensorFlow 2.17.0"


def test_judge_reads_each_replica_once_and_judges_every_model_on_each(tmp_path: Path) -> None:
    old, new = StandIn("2.55.0", "10.0.0.1:8001"), StandIn("2.71.0", "10.0.0.2:8001")
    net = onnx_model(tmp_path / "net.onnx", opset=23, ir=10)
    image = saved_model(tmp_path / "image" / "model.savedmodel", "2.17.0")
    models = [
        runtime.ModelFile("net", "onnx", net),
        runtime.ModelFile("image", "savedmodel", image),
        runtime.ModelFile("pre", "python", tmp_path / "pre"),
    ]
    records = runtime.judge([old, new], "s3://models/production", RuntimeSettings(), models)
    by = {(r.replica, r.subject): r.result for r in records}
    assert by[("10.0.0.1:8001", "hazard s3-sigpipe")] == "fail"
    assert by[("10.0.0.1:8001", "model net ONNX")] == "fail"  # opset 23 > ONNX Runtime 1.20's 21
    assert by[("10.0.0.1:8001", "model image SavedModel")] == "skipped"  # 2.55 still has the TF backend
    assert by[("10.0.0.2:8001", "hazards")] == "pass"
    assert by[("10.0.0.2:8001", "model net ONNX")] == "pass"  # ONNX Runtime 1.27
    assert by[("10.0.0.2:8001", "model image SavedModel")] == "fail"  # no TF backend past 2.55
    assert not any("pre" in subject for _, subject in by)
    assert old.loads == new.loads == []


def test_the_default_policy_records_every_finding_and_refuses_none(
    tmp_path: Path,
) -> None:
    replica = runtime.read_replica(StandIn("2.51.0"))
    records = runtime.hazard_records(replica, "s3", RuntimeSettings())
    assert {r.result for r in records} == {"fail"}
    # the 13 rows of any store and frontend, S3's SIGPIPE and the HTTP load overflow (< 2.53)
    assert len(records) == 15
    assert not any(r.refuses() for r in records)
    runtime.enforce(records)  # noted: recorded, nothing raised
    beyond = runtime.onnx_record(
        replica, "net", onnx_model(tmp_path / "m.onnx", opset=22, ir=10), RuntimeSettings()
    )
    assert beyond.result == "fail"
    assert not beyond.refuses()  # noted; the same file refuses under policy = "refuse":
    assert runtime.onnx_record(replica, "net", tmp_path / "m.onnx", REFUSE).refuses()
    assert beyond.line.startswith(
        "net: model opset 22 > 21: ONNX Runtime 1.19.2 of Triton 2.51.0 (container 24.10)"
    )


def test_model_files_are_the_onnx_and_savedmodels_of_the_steps(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def step(model: str, config: str, folder: Path | None = tmp_path) -> SimpleNamespace:
        return SimpleNamespace(model=model, version="3", folder=folder, config_text=config)

    steps = [
        step("net", 'name: "net"\nplatform: "onnxruntime_onnx"'),
        step("net2", 'name: "net2"\nbackend: "onnxruntime"\ndefault_model_filename: "m.onnx"'),
        step("image", 'name: "image"\nplatform: "tensorflow_savedmodel"'),
        step("pre", 'name: "pre"\nbackend: "python"'),
        step("ens", 'name: "ens"\nplatform: "ensemble"', folder=None),
    ]
    assert runtime.model_files(steps) == [
        runtime.ModelFile("net/3", "onnx", tmp_path / "3" / "model.onnx"),
        runtime.ModelFile("net2/3", "onnx", tmp_path / "3" / "m.onnx"),
        runtime.ModelFile("image/3", "savedmodel", tmp_path / "3" / "model.savedmodel"),
    ]


# -- through issue 47's seam ------------------------------------------------------------------------


def test_the_check_is_registered_first_and_parses_its_table_through_the_seam(tmp_path: Path) -> None:
    from pipelines.core.check import Place
    from pipelines.promote.registered import CHECKS, gate_checks, owned_keys, parse_settings, preflight_checks
    from registry.settings import Settings

    assert CHECKS[0] is runtime.CHECK
    assert preflight_checks() == [runtime.CHECK]  # once per promotion, before any load
    assert runtime.CHECK not in gate_checks("canary") + gate_checks("scratch")  # one judgement
    assert "runtime" in owned_keys()
    place = Place("mlreg.toml [environments.prod]", tmp_path, Settings.from_env(), "s3://models/prod")
    parsed = parse_settings(place, {"runtime": {"policy": "refuse", "frontends": ["grpc"]}})["runtime"]
    assert parsed == RuntimeSettings(policy="refuse", store="s3", frontends=frozenset({"grpc"}))
    assert parse_settings(place, {})["runtime"] == RuntimeSettings(store="s3")
    with pytest.raises(UsageError, match=r"mlreg.toml \[environments.prod\] runtime: unknown runtime key"):
        parse_settings(place, {"runtime": {"polcy": "refuse"}})


def _trial(tmp_path: Path, server: StandIn, setting: object, report: object, version: str = "3") -> Any:
    from types import SimpleNamespace

    from pipelines.core.check import Trial
    from registry.settings import Settings

    onnx_model(tmp_path / version / "model.onnx", opset=22, ir=10)  # past ONNX Runtime 1.19.2 (2.51)
    step = SimpleNamespace(
        model="net", version=version, folder=tmp_path, config_text='name: "net"\nplatform: "onnxruntime_onnx"'
    )
    return Trial(
        step,
        Settings.from_env(),
        report,
        candidate=server,
        where="canary",
        replica=server.url,
        setting=setting,
    )  # type: ignore[arg-type]


def test_the_check_judges_the_canarys_release_once_and_each_candidate(tmp_path: Path) -> None:
    from types import SimpleNamespace

    (tmp_path / "3").mkdir()
    (tmp_path / "4").mkdir()
    server = StandIn("2.51.0")
    report = SimpleNamespace(verdicts=[], failures=[], observed=[])
    first = runtime.CHECK.judge(_trial(tmp_path, server, RuntimeSettings(store="s3"), report))
    report.verdicts.extend(first)
    second = runtime.CHECK.judge(_trial(tmp_path, server, RuntimeSettings(store="s3"), report, version="4"))
    assert [v.subject for v in second] == ["model net/4 ONNX"]  # the release judged once per replica
    by = {v.subject: v for v in first}
    hazards = by["hazards"]  # one verdict for the replica's 15 hazards, each line in its findings
    assert hazards.result == "fail"
    assert hazards.observed  # the default policy notes: "observed: would have refused"
    assert not hazards.refuses
    assert hazards.replicas == (URL,)
    assert len(hazards.findings) == 15
    assert any(
        f.startswith(f"replica {URL} runs Triton 2.51.0: a replica loading from S3") for f in hazards.findings
    )
    assert hazards.why.startswith(f"replica {URL} runs Triton 2.51.0: 15 known hazard(s) (s3-sigpipe, ")
    assert hazards.why.endswith("the last fixed in 2.71.0 (container 26.07)")
    assert hazards.fix.startswith("upgrade the replicas to Triton >= 2.71.0 (container 26.07")
    assert "observed: would have refused" in hazards.line()
    onnx_verdict = by["model net/3 ONNX"]
    assert onnx_verdict.result == "fail"
    assert "opset 22 > 21: ONNX Runtime 1.19.2 of Triton 2.51.0" in onnx_verdict.why
    refused = runtime.CHECK.judge(
        _trial(tmp_path, server, RuntimeSettings("refuse", store="s3"), SimpleNamespace(verdicts=[]))
    )
    refusing = {v.subject: v for v in refused if v.refuses}
    assert set(refusing) == {"hazards", "model net/3 ONNX"}
    assert len(refusing["hazards"].findings) == 14  # high and critical; the medium HTTP overflow noted:
    (noted,) = [v for v in refused if v.subject == "hazards" and v.observed]
    assert noted.findings[0].startswith(f"replica {URL} runs Triton 2.51.0: an HTTP load whose base64")
    assert refusing["model net/3 ONNX"].findings == (refusing["model net/3 ONNX"].why,)
    assert server.loads == []


def test_a_skipped_check_is_recorded_skipped(tmp_path: Path) -> None:
    from types import SimpleNamespace

    (tmp_path / "3").mkdir()
    trial = _trial(tmp_path, StandIn("2.51.0"), RuntimeSettings(), SimpleNamespace(verdicts=[]))
    trial.skip = "--skip runtime"
    (verdict,) = runtime.CHECK.judge(trial)
    assert (verdict.result, verdict.why) == ("skipped", "skipped (--skip runtime)")
