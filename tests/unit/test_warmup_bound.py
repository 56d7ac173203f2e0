"""Issue 45 item 2: a declared ``model_warmup`` is bounded (registry/contracts/warmup.py ``WarmupBound``).

Triton runs every warmup sample ``count`` times at ``batch_size`` requests inside the load, before
READY, with no deadline of its own: a config whose own warmup has ``count: 1000000000`` was registered
as "passed" and its load never ended.  ``mlreg validate`` now refuses it, naming the bound, the
settings that move it and the sample to lower.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlreg.cli.main import app
from registry.contracts.config import parse_config
from registry.contracts.validate import validate_path
from registry.contracts.warmup import (
    MB_VARIABLE,
    REQUESTS_VARIABLE,
    WarmupBound,
    check_warmup,
    peak_warmup,
)
from registry.errors import SettingsError
from tests.cli import CliRunner
from tests.conftest import TEMPLATE

PYTHON_MODEL = (
    "class TritonPythonModel:\n    def execute(self, requests):\n        return [None for _ in requests]\n"
)
XY = '{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }'


def config(inputs: str, extra: str = "") -> str:
    return (
        f'name: "m"\nbackend: "python"\nmax_batch_size: 8\ninput [ {inputs} ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + extra
    )


def given(key: str, body: str) -> str:
    return f'inputs {{ key: "{key}" value: {{ {body} }} }} '


X_OK = given("X", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true")
Y_OK = given("Y", "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true")


def model_folder(folder: Path, text: str) -> Path:
    (folder / "m" / "1").mkdir(parents=True)
    (folder / "m" / "1" / "model.py").write_text(PYTHON_MODEL)
    (folder / "m" / "config.pbtxt").write_text(text)
    return folder / "m"


HOSTILE = 'model_warmup [ { name: "forever" batch_size: 1 count: 1000000000 ' + X_OK + Y_OK + "} ]\n"


def test_validate_refuses_a_warmup_of_a_billion_runs_naming_the_bound_and_the_fix(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, config(XY, extra=HOSTILE))
    [finding] = validate_path(folder).errors
    assert (finding.rule, finding.model) == ("warmup-bound", "m")
    assert finding.actual == "1000000000 requests, 18.6 GiB"  # 1e9 x (3 FP32 + 2 INT32) = 20 bytes
    assert finding.expected == "<= 4096 requests, <= 1.0 GiB"
    assert f"({REQUESTS_VARIABLE}, {MB_VARIABLE})" in finding.message
    assert (
        "lower count or batch_size of sample 'forever' (count 1000000000 x batch_size 1 x 20 B" in finding.fix
    )
    result = CliRunner().invoke(app, ["validate", str(folder)])
    assert result.exit_code == 1, result.output
    assert "model_warmup asks 1000000000 requests" in result.output
    assert MB_VARIABLE in result.output


def test_the_bound_counts_count_times_batch_times_bytes_over_every_sample() -> None:
    big = given("X", "data_type: TYPE_FP32 dims: [ 1024 ] zero_data: true") + Y_OK  # 4104 bytes a request
    text = config(
        '{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }',
        extra=f'model_warmup [ {{ name: "a" batch_size: 8 count: 10 {big} }}, '
        f'{{ name: "b" batch_size: 4 {big} }} ]\n',  # count 0: once
    )
    parsed = parse_config(text)
    work = (10 * 8 + 4) * 4104  # 344,736 bytes; 84 requests
    assert check_warmup(parsed, bound=WarmupBound(megabytes=work / 2**20, requests=84)) == []
    [over_bytes] = check_warmup(parsed, bound=WarmupBound(megabytes=(work - 1) / 2**20, requests=84))
    assert over_bytes.rule == "warmup-bound"
    assert "sample 'a' (count 10 x batch_size 8" in over_bytes.fix
    [over_requests] = check_warmup(parsed, bound=WarmupBound(megabytes=1, requests=83))
    assert over_requests.actual == "84 requests, 336.7 KiB"


def test_the_bound_comes_from_settings_and_a_bad_setting_is_named() -> None:
    assert WarmupBound.from_env({MB_VARIABLE: "2", REQUESTS_VARIABLE: "10"}) == WarmupBound(2.0, 10)
    assert WarmupBound.from_env({}) == WarmupBound()
    with pytest.raises(SettingsError, match=f"{MB_VARIABLE}='lots' is not a positive number"):
        WarmupBound.from_env({MB_VARIABLE: "lots"})
    with pytest.raises(SettingsError, match=REQUESTS_VARIABLE):
        WarmupBound.from_env({REQUESTS_VARIABLE: "-1"})


def test_the_template_and_every_derived_peak_warmup_stay_within_the_default_bound(tmp_path: Path) -> None:
    for path in sorted(TEMPLATE.glob("*/config.pbtxt")):
        text = peak_warmup(path.read_text())
        found = check_warmup(parse_config(text), model=path.parent.name, model_dir=path.parent)
        assert [f for f in found if f.rule == "warmup-bound"] == [], path
    folder = model_folder(tmp_path, config(XY, extra=HOSTILE.replace("count: 1000000000 ", "")))
    assert validate_path(folder).findings == []  # the same sample, once: fine
    assert PYTHON_MODEL in (folder / "1" / "model.py").read_text()


# -- issue 45 review, F3: every instance of every version loaded is warmed up ----------------------

ONE = (
    'model_warmup [ { name: "w" batch_size: 8 count: 100 ' + X_OK + Y_OK + "} ]\n"
)  # 800 requests, 20 B each


@pytest.mark.parametrize(
    ("extra", "copies"),
    [
        ("", 1),
        ("instance_group [ { count: 1000 kind: KIND_CPU } ]\n", 1000),
        ("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] }, { count: 0 kind: KIND_CPU } ]\n", 5),
        ("version_policy: { specific { versions: [ 1, 2, 3 ] } }\n", 3),
        ("version_policy: { all {} }\ninstance_group [ { count: 2 } ]\n", 4),  # 2 folders x 2 instances
        ("version_policy: { latest { num_versions: 5 } }\n", 2),  # at most the 2 folders there
    ],
    ids=["one", "a-thousand-instances", "gpus-times-count", "specific", "all", "latest"],
)
def test_the_bound_counts_every_instance_of_every_version_loaded(
    tmp_path: Path, extra: str, copies: int
) -> None:
    """Before: a thousand instances (4,000,000 warmup requests) passed like one."""
    folder = model_folder(tmp_path, config(XY, extra=extra + ONE))
    (folder / "2").mkdir()
    parsed = parse_config((folder / "config.pbtxt").read_text())
    found = check_warmup(parsed, model_dir=folder, bound=WarmupBound(megabytes=1024, requests=800 * copies))
    assert [f for f in found if f.rule == "warmup-bound"] == []
    [over] = [
        f
        for f in check_warmup(
            parsed, model_dir=folder, bound=WarmupBound(megabytes=1024, requests=800 * copies - 1)
        )
        if f.rule == "warmup-bound"
    ]
    assert over.actual.startswith(f"{800 * copies} requests")
    assert f"x {copies} model instance(s) of every version it loads" in over.message


def test_a_warmup_data_file_of_any_type_counts_its_size(tmp_path: Path) -> None:
    """Triton reads the whole input_data_file whatever the type: a 3 MiB file behind a 3-float
    input counts 3 MiB a request, not 12 bytes."""
    body = 'data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin"'
    sample = 'model_warmup [ { name: "f" batch_size: 1 count: 1 ' + given("X", body) + Y_OK + "} ]\n"
    folder = model_folder(tmp_path, config(XY, extra=sample))
    (folder / "warmup").mkdir()
    (folder / "warmup" / "x.bin").write_bytes(b"\0" * (3 * 2**20))
    parsed = parse_config((folder / "config.pbtxt").read_text())
    [over] = [
        f
        for f in check_warmup(parsed, model_dir=folder, bound=WarmupBound(megabytes=2, requests=10))
        if f.rule == "warmup-bound"
    ]
    assert over.actual == "1 requests, 3.0 MiB"
