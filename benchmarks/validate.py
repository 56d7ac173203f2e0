"""How fast `mlreg validate` is, side by side with the baselines (issue: contracts).

(a) `mlreg validate` on the built template as a whole CLI process (median of N), with a check
    that TensorFlow is never imported; baseline: a process reading the two SavedModel
    signatures through TensorFlow.  Target: median < 1.0 s.
(b) a synthetic repository of 500 ONNX models plus a 50-step ensemble.  Target: < 3 s.
(c) signature read of an ONNX model with 2 GB of external weights vs a 1 MB one.  Target: ratio <= 1.5.

    .venv/bin/python benchmarks/validate.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import template  # noqa: E402
from registry.settings import Settings  # noqa: E402

CLI_NO_TF = (
    "import sys\n"
    "from mlreg.cli.main import app\n"
    "try:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
    "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    "sys.exit(code)\n"
)
TF_BASELINE = (
    "import os, sys\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\nimport tensorflow as tf\n"
    "for p in sys.argv[1:]:\n"
    "    sig = tf.saved_model.load(p).signatures['serving_default']\n"
    "    sig.structured_input_signature, sig.structured_outputs\n"
)


def timed(command: list[str], runs: int, ok_codes: tuple[int, ...] = (0,)) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - began)
        if proc.returncode not in ok_codes:
            raise SystemExit(f"{command[:3]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return times


def synthetic_repository(root: Path, models: int = 500, steps: int = 50) -> Path:
    import onnx
    from onnx import TensorProto, helper

    def identity_model(path: Path) -> None:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        )
        onnx.save(helper.make_model(graph), str(path))

    root.mkdir(parents=True, exist_ok=True)
    source = root / "_model.onnx"
    identity_model(source)
    data = source.read_bytes()
    config = (
        'name: "{n}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{{ name: "x" data_type: TYPE_FP32 dims: [4] }}]\n'
        'output [{{ name: "y" data_type: TYPE_FP32 dims: [4] }}]\n'
    )
    repo = root / "repo"
    for i in range(models):
        name = f"m{i:03d}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(data)
        (repo / name / "config.pbtxt").write_text(config.format(n=name))
    step_text = "".join(
        f'{{ model_name: "m{i:03d}" model_version: 1 input_map {{ key: "x" value: "t{i}" }} '
        f'output_map {{ key: "y" value: "t{i + 1}" }} }},'
        for i in range(steps)
    ).rstrip(",")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(
        'name: "chain"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [{ name: "t0" data_type: TYPE_FP32 dims: [4] }]\n'
        f'output [{{ name: "t{steps}" data_type: TYPE_FP32 dims: [4] }}]\n'
        f"ensemble_scheduling {{ step [ {step_text} ] }}\n"
    )
    return repo


def onnx_with_external_weights(folder: Path, size: int) -> Path:
    """A model whose one initializer of ``size`` bytes lives in an external (sparse) file."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True)
    count = size // 4
    weights = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[count])
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(count * 4))):
        weights.external_data.add(key=key, value=value)
    with (folder / "weights.bin").open("wb") as f:
        f.truncate(count * 4)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])],
        initializer=[weights],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def read_time(path: Path, runs: int) -> float:
    from registry.contracts.signature import read_onnx

    times = []
    for _ in range(runs):
        began = time.perf_counter()
        read_onnx(path)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-validate-"))
    settings = Settings.from_env()
    built = work / "template"
    template.build(settings.template_dir, built, device="cpu", force=True)
    py = sys.executable

    cli = timed([py, "-c", CLI_NO_TF, "validate", str(built)], args.runs)
    cli_source = timed([py, "-c", CLI_NO_TF, "validate", str(settings.template_dir)], args.runs)
    saved_models = [str(built / m / "1" / "model") for m in ("image_model", "multi_modal_model")]
    baseline = timed([py, "-c", TF_BASELINE, *saved_models], args.runs)
    print("(a) whole CLI process, median of", args.runs, "(TensorFlow never imported: checked)")
    print(f"    mlreg validate <built template>         {statistics.median(cli):6.3f} s  (target < 1.0)")
    print(f"    mlreg validate model_repository_template {statistics.median(cli_source):6.3f} s")
    print(f"    baseline: SavedModel signatures via TF   {statistics.median(baseline):6.3f} s")

    synthetic = synthetic_repository(work / "synthetic")
    big = timed([py, "-c", CLI_NO_TF, "validate", str(synthetic)], max(1, args.runs // 2))
    print(f"(b) 500 models + 50-step ensemble           {statistics.median(big):6.3f} s  (target < 3)")

    small = onnx_with_external_weights(work / "small", 1 << 20)
    large = onnx_with_external_weights(work / "large", 2 << 30)
    t_small, t_large = read_time(small, 20), read_time(large, 20)
    print(
        f"(c) ONNX signature read: 1 MB {1000 * t_small:.2f} ms, 2 GB {1000 * t_large:.2f} ms, "
        f"ratio {t_large / t_small:.2f}  (target <= 1.5)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
