"""The ONNX reader (a minimal protobuf schema, no ``import onnx``) against the onnx package itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from registry.contracts.repository import read_repository
from registry.contracts.signature import read_onnx
from registry.contracts.validate import validate_path
from registry.errors import ContractError
from tests.unit.onnx_signatures import read, reference


def model_with_weights(path: Path) -> Path:
    """Symbolic, unknown and fixed dims, an initializer also listed as an input, a sparse one."""
    weight = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.ones(1, np.float32), "s"),
        numpy_helper.from_array(np.array([0], np.int64), "s_indices"),
        [3],
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 3]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, None),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [None, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[weight],
        sparse_initializer=[sparse],
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_reads_what_the_onnx_package_reads(tmp_path: Path) -> None:
    path = model_with_weights(tmp_path / "model.onnx")
    assert read(path) == reference(path)
    assert read(path) == (
        [("x", "FP16", ("batch", 3)), ("ids", "INT64", None), ("mask", "BOOL", (-1, 4))],
        [("y", "FP32", (2, 3))],
        ["s", "w"],
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", r"the file is empty \(0 bytes\)"),
        (b"\xff\xfe garbled \x01\x02", r"its bytes do not parse as an ONNX ModelProto"),
        (b"\x08\x07", r"the file holds no ONNX graph"),  # an ir_version and nothing else
    ],
)
def test_an_unreadable_file_is_one_clear_error(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ContractError, match=f"model.onnx: not a readable ONNX model: {why}"):
        read_onnx(path)


def test_a_truncated_model_gives_one_finding_not_one_per_tensor(
    standin_repository: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    model = repo / "table_data_model"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        (standin_repository / "table_data_model" / "config.pbtxt").read_text()
    )
    source = standin_repository / "table_data_model" / "1" / "model" / "model.onnx"
    (model / "1" / "model").mkdir(parents=True)
    (model / "1" / "model" / "model.onnx").write_bytes(source.read_bytes()[: source.stat().st_size // 2])

    report = validate_path(repo)
    assert [f.line() for f in report.errors] == [
        f"table_data_model: {model / '1' / 'model' / 'model.onnx'}: not a readable ONNX model: its bytes do "
        "not parse as an ONNX ModelProto (truncated?) — fix: re-export the model (tf2onnx / "
        "torch.onnx.export) and check the file is complete"
    ]
    assert read_repository(repo).models  # the config itself still reads


def test_external_weights_are_not_opened(tmp_path: Path) -> None:
    weights = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weights.data_location = TensorProto.EXTERNAL
    weights.external_data.add(key="location", value="missing-weights.bin")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[weights],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    sig = read_onnx(path)  # the weights file does not exist: it is never opened
    assert [t.name for t in sig.inputs] == ["x"]
    assert sig.initializers == ("w",)
