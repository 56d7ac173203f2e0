"""registry/contracts/warmup.py: the peak-batch warmup mlreg writes, and Triton's rules for a declared one.

Triton's verdicts behind the messages were read from core r24.10 (2.51) and confirmed by loading each
kind on the local tritonserver 2.51 (see the module's docstring).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from registry.contracts.config import model_config_pb2, parse_config
from registry.contracts.findings import Finding
from registry.contracts.validate import validate_path
from registry.contracts.warmup import PEAK_NAME, check_warmup, peak_block, peak_warmup
from registry.errors import ContractError
from tests.cli import CliRunner
from tests.conftest import TEMPLATE

TEMPLATES = {p.parent.name: p.read_text() for p in sorted(TEMPLATE.glob("*/config.pbtxt"))}
WARMED = {"image_model", "image_preprocess", "multi_modal_model", "table_data_model", "table_data_preprocess"}
PYTHON_MODEL = (
    "class TritonPythonModel:\n    def execute(self, requests):\n        return [None for _ in requests]\n"
)


def config(inputs: str, mbs: int = 8, extra: str = "", name: str = "m") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {mbs}\ninput [ {inputs} ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + extra
    )


XY = '{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }'


def sample(inputs: str, batch: int = 8, name: str = "w") -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch} {inputs} }} ]\n'


def given(key: str, body: str) -> str:
    return f'inputs {{ key: "{key}" value: {{ {body} }} }} '


X_OK = given("X", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true")
Y_OK = given("Y", "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true")


def warmup_of(text: str) -> Any:
    """The one model_warmup of ``text``, parsed."""
    [warmup] = parse_config(text).model_warmup
    return warmup


def inputs_of(warmup: Any) -> dict[str, tuple[str, list[int], str | None]]:
    """name -> (data type, dims, which data) of each warmup input."""
    type_name = model_config_pb2().DataType.Name
    return {
        key: (type_name(v.data_type), list(v.dims), v.WhichOneof("input_data_type"))
        for key, v in warmup.inputs.items()
    }


def one(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.line() for f in findings]
    return findings[0]


# -- peak_warmup ------------------------------------------------------------------------------------


def test_the_batching_templates_get_a_peak_warmup_and_the_ensemble_none() -> None:
    changed = {name for name, text in TEMPLATES.items() if peak_warmup(text) != text}
    assert changed == WARMED
    ensemble = TEMPLATES["ensemble_multi_modal_model"]
    assert peak_warmup(ensemble) == ensemble
    assert len(parse_config(peak_warmup(ensemble)).model_warmup) == 0


@pytest.mark.parametrize("model", sorted(WARMED))
def test_a_template_warmup_is_its_inputs_at_max_batch_size_appended_below_the_text(model: str) -> None:
    text = TEMPLATES[model]
    out = peak_warmup(text)
    assert out.startswith(text)  # the registered text, byte for byte, above the block
    original = parse_config(text)
    warmup = warmup_of(out)
    assert warmup.name == PEAK_NAME
    assert warmup.batch_size == original.max_batch_size == 256
    assert warmup.count == 0
    type_name = model_config_pb2().DataType.Name
    assert inputs_of(warmup) == {
        t.name: (type_name(t.data_type), [1 if d == -1 else d for d in t.dims], "zero_data")
        for t in original.input
    }
    assert all(v.zero_data is True for v in warmup.inputs.values())
    assert check_warmup(parse_config(out), model=model) == []


def test_the_image_preprocess_warmup_in_full() -> None:
    """The exact bytes appended (a change here re-creates every serving version on its next swap)."""
    text = TEMPLATES["image_preprocess"]
    assert peak_warmup(text)[len(text) :] == (
        "# mlreg: a warmup at max_batch_size, zero data shaped as the inputs above (peak_warmup)\n"
        "model_warmup [\n"
        "  {\n"
        '    name: "mlreg_peak_batch"\n'
        "    batch_size: 256\n"
        "    inputs {\n"
        '      key: "image_preprocess_input"\n'
        "      value: { data_type: TYPE_UINT8 dims: [ 1 ] zero_data: true }\n"
        "    }\n"
        "  }\n"
        "]\n"
    )


def test_without_batching_nothing_is_added() -> None:
    text = TEMPLATES["table_data_preprocess"].replace("max_batch_size: 256", "max_batch_size: 0")
    assert peak_warmup(text) == text
    assert parse_config(peak_warmup(text)).max_batch_size == 0
    assert len(parse_config(peak_warmup(text)).model_warmup) == 0


def test_a_declared_warmup_is_kept_and_none_added() -> None:
    text = TEMPLATES["table_data_preprocess"] + sample(
        given("table_data_input_1", "data_type: TYPE_INT8 dims: [ 1 ] random_data: true")
        + given("table_data_input_2", "data_type: TYPE_INT8 dims: [ 1 ] random_data: true"),
        batch=4,
        name="mine",
    )
    assert peak_warmup(text) == text
    warmup = warmup_of(peak_warmup(text))
    assert (warmup.name, warmup.batch_size) == ("mine", 4)
    assert inputs_of(warmup)["table_data_input_1"] == ("TYPE_INT8", [1], "random_data")


def test_the_same_tensors_give_the_same_bytes_whatever_else_differs() -> None:
    a = config(XY, extra="instance_group [ { kind: KIND_CPU count: 1 } ]\n", name="first")
    b = config(
        '{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }, { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }',
        extra="# another comment\ndynamic_batching { max_queue_delay_microseconds: 100 }\n"
        "instance_group [ { kind: KIND_CPU count: 4 } ]\n"
        'parameters { key: "k" value: { string_value: "v" } }\n',
        name="second",
    )
    block_a, block_b = peak_warmup(a)[len(a) :], peak_warmup(b)[len(b) :]
    assert block_a == block_b
    assert block_a == peak_block(parse_config(a))
    assert inputs_of(warmup_of(peak_warmup(b))) == {
        "X": ("TYPE_FP32", [1], "zero_data"),
        "Y": ("TYPE_INT32", [2], "zero_data"),
    }
    assert peak_warmup(peak_warmup(a)) == peak_warmup(a)  # a warmup is there now: kept


def test_a_different_max_batch_size_gives_a_different_block() -> None:
    assert warmup_of(peak_warmup(config(XY, mbs=8))).batch_size == 8
    assert warmup_of(peak_warmup(config(XY, mbs=32))).batch_size == 32


def test_variable_dims_become_1_and_a_reshape_keeps_the_config_dims() -> None:
    text = config(
        '{ name: "A" data_type: TYPE_FP16 dims: [ -1, 3, -1 ] }, '
        '{ name: "R" data_type: TYPE_FP32 dims: [ 4, -1 ] reshape: { shape: [ 2, 2, -1 ] } }'
    )
    assert inputs_of(warmup_of(peak_warmup(text))) == {
        "A": ("TYPE_FP16", [1, 3, 1], "zero_data"),
        "R": ("TYPE_FP32", [4, 1], "zero_data"),  # Triton compares warmup dims with dims, then reshapes
    }


def test_optional_inputs_are_left_out_and_strings_get_zero_data() -> None:
    text = config(
        '{ name: "S" data_type: TYPE_STRING dims: [ -1 ] }, '
        '{ name: "O" data_type: TYPE_FP32 dims: [ 2 ] optional: true }'
    )
    out = peak_warmup(text)
    assert inputs_of(warmup_of(out)) == {"S": ("TYPE_STRING", [1], "zero_data")}
    assert check_warmup(parse_config(out)) == []


def test_sequence_control_tensors_are_sent_as_the_batcher_sends_them() -> None:
    text = config(
        '{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }',
        extra="sequence_batching { control_input [\n"
        '  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },\n'
        '  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },\n'
        '  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }\n'
        "] }\n",
    )
    out = peak_warmup(text)
    assert inputs_of(warmup_of(out)) == {
        "X": ("TYPE_FP32", [2], "zero_data"),
        "START": ("TYPE_INT32", [1], "zero_data"),
        "READY": ("TYPE_BOOL", [1], "zero_data"),
        "CORRID": ("TYPE_UINT64", [1], "zero_data"),
    }
    assert check_warmup(parse_config(out)) == []


@pytest.mark.parametrize(
    ("why", "inputs", "extra"),
    [
        ("shape tensor", '{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true }', ""),
        (
            "implicit state",
            '{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }',
            'sequence_batching { state [ { input_name: "IN_S" output_name: "OUT_S" '
            "data_type: TYPE_FP32 dims: [ 2 ] } ] }\n",
        ),
        ("only optional inputs", '{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] optional: true }', ""),
        ("no data type", '{ name: "X" dims: [ 2 ] }', ""),
    ],
)
def test_a_model_triton_cannot_warm_with_zeros_is_left_unchanged(why: str, inputs: str, extra: str) -> None:
    text = config(inputs, extra=extra)
    assert peak_warmup(text) == text, why
    assert len(parse_config(peak_warmup(text)).model_warmup) == 0


def test_a_text_without_a_final_newline_gets_one_before_the_block() -> None:
    text = config(XY).rstrip("\n") + "  # last line"
    out = peak_warmup(text)
    assert out.startswith(text + "\n# mlreg: ")
    assert warmup_of(out).batch_size == 8


def test_an_unreadable_config_is_refused_with_its_line() -> None:
    with pytest.raises(ContractError, match=r"config.pbtxt:1:\d+: cannot parse model configuration"):
        peak_warmup('name: "m" max_batch_size: eight')


def test_names_are_escaped_as_protobuf_text() -> None:
    text = config('{ name: "a\\"b" data_type: TYPE_FP32 dims: [ 1 ] }')
    assert list(warmup_of(peak_warmup(text)).inputs) == ['a"b']


# -- check_warmup -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("warmup", "rule", "message", "tensor", "origin"),
    [
        (
            sample(X_OK + Y_OK, batch=9),
            "warmup-batch-size",
            "model_warmup 'w': failed to run warmup sample 'w': batch size 9 for 'm', max allowed is 8",
            None,
            "triton",
        ),
        (
            sample(given("X", "data_type: TYPE_FP32 dims: [ -1 ] zero_data: true") + Y_OK),
            "warmup-dims",
            "model_warmup 'w': warmup setting expects all variable-size dimensions are specified "
            "for input 'X'",
            "X",
            "triton",
        ),
        (
            sample(given("X", "data_type: TYPE_FP32 dims: [ 3 ]") + Y_OK),
            "warmup-data",
            "model_warmup 'w': warmup setting expects input 'X' to have input_data_type set",
            "X",
            "triton",
        ),
        (
            sample(given("X", "data_type: TYPE_INT32 dims: [ 3 ] zero_data: true") + Y_OK),
            "warmup-data-type",
            "model_warmup 'w': inference input 'X' data-type is 'INT32', but model 'm' expects 'FP32'",
            "X",
            "triton",
        ),
        (
            sample(X_OK + given("Y", "data_type: TYPE_INT32 dims: [ 3 ] zero_data: true")),
            "warmup-shape",
            "model_warmup 'w': unexpected shape for input 'Y' for model 'm'. Expected [-1,2], got [1,3]",
            "Y",
            "triton",
        ),
        (
            sample(X_OK),
            "warmup-missing-input",
            "model_warmup 'w': expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['X'], "
            "but missing required input(s) ['Y']. Please provide all required input(s).",
            "Y",
            "triton",
        ),
        (
            sample(X_OK + Y_OK + given("Z", "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true")),
            "warmup-input",
            "model_warmup 'w': input 'Z' is not an input of model 'm' (nor a sequence control or state "
            "tensor): Triton hands it to the backend as an extra input, unchecked",
            "Z",
            "mlreg",
        ),
        (
            sample(given("X", 'data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "../../x.bin"') + Y_OK),
            "warmup-file",
            "model_warmup 'w': input_data_file '../../x.bin' leaves the model's warmup/ folder",
            "X",
            "mlreg",
        ),
    ],
    ids=["batch", "variable-dim", "no-data", "data-type", "shape", "missing", "unknown", "escapes"],
)
def test_a_broken_warmup_is_refused_with_tritons_words(
    warmup: str, rule: str, message: str, tensor: str | None, origin: str
) -> None:
    finding = one(check_warmup(parse_config(config(XY, extra=warmup))))
    assert (finding.severity, finding.rule, finding.origin) == ("error", rule, origin)
    assert finding.model == "m"
    assert finding.message == message
    assert finding.tensor == tensor
    assert finding.fix


def test_the_findings_carry_expected_actual_and_fix() -> None:
    text = config(XY, extra=sample(X_OK + given("Y", "data_type: TYPE_INT32 dims: [ 3 ] zero_data: true")))
    finding = one(check_warmup(parse_config(text), model="served"))
    assert (finding.model, finding.expected, finding.actual) == ("served", "[2]", "[3]")
    assert finding.fix.startswith("set dims: [ 2 ]")
    assert finding.line().startswith("served/Y: model_warmup 'w': unexpected shape for input 'Y'")
    batch = one(check_warmup(parse_config(config(XY, extra=sample(X_OK + Y_OK, batch=300)))))
    assert (batch.expected, batch.actual) == ("<= 8", "300")
    assert batch.fix.startswith("set batch_size: 8")
    missing = one(check_warmup(parse_config(config(XY, extra=sample(X_OK)))))
    assert (
        missing.fix == 'add inputs { key: "Y" value: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } }'
    )


def test_a_reshaped_input_is_warmed_with_its_config_dims_not_the_reshape() -> None:
    inputs = '{ name: "R" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } }'
    good = sample(given("R", "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true"))
    bad = sample(given("R", "data_type: TYPE_FP32 dims: [ 2, 2 ] zero_data: true"))
    assert check_warmup(parse_config(config(inputs, extra=good))) == []
    finding = one(check_warmup(parse_config(config(inputs, extra=bad))))
    assert finding.message.endswith(
        "unexpected shape for input 'R' for model 'm'. Expected [-1,4], got [1,2,2]"
    )


def test_without_batching_a_batch_of_two_is_refused_and_dims_are_whole() -> None:
    inputs = '{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }'
    two = sample(given("X", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true"), batch=2)
    finding = one(check_warmup(parse_config(config(inputs, mbs=0, extra=two))))
    assert finding.message.endswith("batch size 2 for 'm', max allowed is 0")
    assert finding.expected == "<= 1"
    wrong = sample(given("X", "data_type: TYPE_FP32 dims: [ 1, 3 ] zero_data: true"), batch=1)
    shape = one(check_warmup(parse_config(config(inputs, mbs=0, extra=wrong))))
    assert shape.message.endswith("Expected [3], got [1,3]")


def test_batch_size_0_is_skipped_by_triton_a_warning() -> None:
    finding = one(check_warmup(parse_config(config(XY, extra=sample(X_OK + Y_OK, batch=0)))))
    assert (finding.severity, finding.origin, finding.rule) == ("warning", "mlreg", "warmup-batch-size")
    assert "Triton skips the sample" in finding.message
    assert finding.fix == "set batch_size: 8 (1 to max_batch_size)"


def test_zero_data_false_still_sends_zeros_a_warning() -> None:
    text = config(XY, extra=sample(given("X", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: false") + Y_OK))
    warmup = warmup_of(text)
    assert warmup.inputs["X"].WhichOneof("input_data_type") == "zero_data"
    finding = one(check_warmup(parse_config(text)))
    assert (finding.severity, finding.tensor) == ("warning", "X")
    assert "zero_data: false still selects zero data" in finding.message


def test_random_data_for_strings_is_empty_strings_a_warning() -> None:
    inputs = '{ name: "S" data_type: TYPE_STRING dims: [ 2 ] }'
    text = config(inputs, extra=sample(given("S", "data_type: TYPE_STRING dims: [ 2 ] random_data: true")))
    finding = one(check_warmup(parse_config(text)))
    assert finding.severity == "warning"
    assert "sends empty strings" in finding.message


def test_two_kinds_of_data_in_one_input_do_not_parse() -> None:
    text = config(
        XY, extra=sample(given("X", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true random_data: true"))
    )
    with pytest.raises(ContractError, match='"random_data" is specified along with field "zero_data"'):
        parse_config(text)


def test_control_and_state_tensors_may_be_given() -> None:
    extra = (
        'sequence_batching { control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [ 0, 1 ] } ] } ]\n  state [ { input_name: "IN_S" output_name: "OUT_S" '
        "data_type: TYPE_FP32 dims: [ 2 ] } ] }\n"
    )
    warm = sample(
        X_OK
        + Y_OK
        + given("START", "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true")
        + given("IN_S", "data_type: TYPE_FP32 dims: [ 2 ] zero_data: true")
    )
    text = config(XY, extra=extra + warm)
    assert set(warmup_of(text).inputs) == {"X", "Y", "START", "IN_S"}
    assert check_warmup(parse_config(text)) == []


def test_an_ensemble_warmup_is_left_to_the_ensemble_check() -> None:
    text = TEMPLATES["ensemble_multi_modal_model"] + sample(
        given("x", "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true")
    )
    assert len(parse_config(text).model_warmup) == 1
    assert check_warmup(parse_config(text)) == []


# -- input_data_file ---------------------------------------------------------------------------------


def file_warmup(
    tmp_path: Path, name: str, data: bytes | None, inputs: str = XY, body: str = ""
) -> list[Finding]:
    folder = tmp_path / "m"
    (folder / "warmup").mkdir(parents=True)
    if data is not None:
        (folder / "warmup" / name.lstrip("/")).write_bytes(data)
    body = body or f'data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "{name}"'
    text = config(inputs, extra=sample(given("X", body) + Y_OK))
    return check_warmup(parse_config(text), model_dir=folder)


def test_a_missing_file_is_refused_as_triton_reads_it(tmp_path: Path) -> None:
    finding = one(file_warmup(tmp_path, "nope.bin", None))
    path = tmp_path / "m" / "warmup" / "nope.bin"
    assert finding.message == (
        f"model_warmup 'w': failed to open text file for read {path}: No such file or directory"
    )
    assert (finding.rule, finding.origin, finding.file, finding.tensor) == (
        "warmup-file",
        "triton",
        str(path),
        "X",
    )


def test_a_short_file_is_refused_and_a_long_one_warned(tmp_path: Path) -> None:
    short = one(file_warmup(tmp_path / "a", "x.bin", b"\0" * 8))
    assert short.message.endswith(
        "warmup setting expects 12 bytes, but the data provided from x.bin only has 8 bytes"
    )
    assert (short.severity, short.expected, short.actual) == ("error", "12", "8")
    long = one(file_warmup(tmp_path / "b", "x.bin", b"\0" * 20))
    assert (long.severity, long.origin) == ("warning", "mlreg")
    assert "Triton sends its first 12" in long.message
    assert file_warmup(tmp_path / "c", "x.bin", b"\0" * 12) == []


def test_an_absolute_file_name_is_read_below_the_warmup_folder(tmp_path: Path) -> None:
    assert file_warmup(tmp_path, "/x.bin", b"\0" * 12) == []
    assert (tmp_path / "m" / "warmup" / "x.bin").is_file()


def test_a_string_file_must_hold_the_element_count(tmp_path: Path) -> None:
    inputs = (
        '{ name: "X" data_type: TYPE_STRING dims: [ 2 ] }, { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }'
    )
    body = 'data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin"'

    def strings(*items: bytes) -> bytes:
        return b"".join(struct.pack("<I", len(s)) + s for s in items)

    assert file_warmup(tmp_path / "a", "s.bin", strings(b"ab", b"c"), inputs, body) == []
    few = one(file_warmup(tmp_path / "b", "s.bin", strings(b"ab"), inputs, body))
    assert few.message.endswith("expected 2 string elements for inference input 'X' for model 'm', got 1")
    many = one(file_warmup(tmp_path / "c", "s.bin", strings(b"a", b"b", b"c"), inputs, body))
    assert many.message.endswith(
        "unexpected number of string elements 3 for inference input 'X' for model 'm', expecting 2"
    )
    cut = one(file_warmup(tmp_path / "d", "s.bin", strings(b"ab") + b"\x01\0", inputs, body))
    assert "incomplete string length indicator for inference input 'X'" in cut.message


# -- mlreg validate runs it -------------------------------------------------------------------------


def model_folder(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    (folder / "config.pbtxt").write_text(text)
    return folder


def test_validate_reports_a_broken_warmup_and_passes_the_peak_one(tmp_path: Path) -> None:
    broken = model_folder(tmp_path / "a", config(XY, extra=sample(X_OK + Y_OK, batch=9)))
    report = validate_path(broken)
    assert [(f.rule, f.model) for f in report.errors] == [("warmup-batch-size", "m")]
    result = CliRunner().invoke(app, ["validate", str(broken)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == (
        "error: m: model_warmup 'w': failed to run warmup sample 'w': batch size 9 for 'm', max allowed "
        "is 8 — fix: set batch_size: 8 (Triton sends batch_size requests of batch 1 in one execution; "
        "the backend takes at most max_batch_size)"
    )
    peaked = model_folder(tmp_path / "b", peak_warmup(config(XY)))
    assert validate_path(peaked).findings == []
    assert warmup_of((peaked / "config.pbtxt").read_text()).batch_size == 8


def test_validate_looks_for_the_file_in_the_models_warmup_folder(tmp_path: Path) -> None:
    text = config(
        XY, extra=sample(given("X", 'data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin"') + Y_OK)
    )
    folder = model_folder(tmp_path, text)
    [finding] = validate_path(folder).errors
    assert finding.file == str(folder / "warmup" / "x.bin")
    (folder / "warmup").mkdir()
    (folder / "warmup" / "x.bin").write_bytes(b"\0" * 12)
    assert validate_path(folder).findings == []


# -- what a promotion writes (pipelines/core/plan.py peak_sample, recreating_fields) --------------


def test_a_promotion_derives_the_warmup_only_where_zeros_are_a_sample_and_says_why_not() -> None:
    from pipelines.core.warmup import PYTHON_WARMUP, WARMUP_BYTES, peak_sample

    outcome = {name: peak_sample(text) for name, text in TEMPLATES.items()}
    warmed = {name for name, (text, _) in outcome.items() if text != TEMPLATES[name]}
    assert warmed == {"table_data_model", "multi_modal_model"}  # ONNX and SavedModel: zeros are a sample
    assert outcome["table_data_preprocess"][1] == PYTHON_WARMUP  # python: mlreg's own peak request
    assert outcome["ensemble_multi_modal_model"] == (TEMPLATES["ensemble_multi_modal_model"], "")
    over = (
        f"a request at max_batch_size 256 moves 192 MiB, inputs and outputs (over {WARMUP_BYTES >> 20} MiB)"
    )
    assert peak_sample(TEMPLATES["image_model"]) == (TEMPLATES["image_model"], over)  # 256 x 3 x 256 x 256 in
    assert outcome["image_preprocess"][1] == over  # ... and out: neither a warmup nor a peak request
    payload = config('{ name: "B" data_type: TYPE_UINT8 dims: [ -1 ] }').replace(
        'backend: "python"', 'platform: "x"'
    )
    assert "encoded bytes" in peak_sample(payload)[1]
    text, why = peak_sample(TEMPLATES["table_data_model"])
    assert why == ""
    assert parse_config(text).model_warmup[0].batch_size == 256
    assert peak_sample(text) == (text, "")  # declared now: kept as it is


def test_a_re_creating_config_change_is_any_field_beyond_version_policy_and_instance_group() -> None:
    from pipelines.core.plan import desired_config
    from pipelines.core.warmup import peak_sample, recreating_fields

    base = TEMPLATES["table_data_model"]
    one, two = desired_config(base, ["1"], gpu=False), desired_config(base, ["1", "2"], gpu=False)
    assert recreating_fields(one, two) == []  # a swap: only version_policy differs
    regrouped = one.replace("count: 1", "count: 2") if "count: 1" in one else one
    assert recreating_fields(one, regrouped) == []
    warmed = desired_config(peak_sample(base)[0], ["2"], gpu=False)
    assert recreating_fields(one, warmed) == ["model_warmup"]  # the first promotion that adds it
    assert recreating_fields(None, warmed) == []
    tuned = one + 'parameters { key: "k" value { string_value: "v" } }\n'
    assert recreating_fields(one, tuned) == ["parameters"]
