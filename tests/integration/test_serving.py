"""The seed's ensemble served by a real tritonserver, end to end."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest

from registry.errors import TritonError
from tests.conftest import TEMPLATE
from tests.integration.conftest import RunningTriton
from tests.integration.stacks import ENSEMBLE, MODELS, golden

pytestmark = pytest.mark.integration


def expected_prediction(repository: Path, table: tuple[int, int], image: np.ndarray) -> float:
    """The ensemble's answer computed in-process, straight from the artifacts."""
    import onnxruntime as ort
    import tensorflow as tf

    vocab = np.array([1, 2, 3])
    one_hot = [(np.array([[v]]) == vocab).astype(np.float32) for v in table]
    onnx_path = repository / "table_data_model/1/model/model.onnx"
    table_out = ort.InferenceSession(str(onnx_path)).run(
        ["table_model_output"], {"categorical_col_1": one_hot[0], "categorical_col_2": one_hot[1]}
    )[0]
    image_sig = tf.saved_model.load(str(repository / "image_model/1/model")).signatures
    image_out = image_sig["serving_default"](image=tf.constant(image))["output"].numpy()
    multi = tf.saved_model.load(str(repository / "multi_modal_model/1/model")).signatures
    out = multi["serving_default"](image=tf.constant(image_out), table_data=tf.constant(table_out))
    return float(out["output"].numpy()[0, 0])


def decoded_golden_image() -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(golden().golden_jpeg())) as img:
        pixels = np.asarray(img.convert("RGB").resize((256, 256)), dtype=np.float32)
    return np.transpose(pixels, (2, 0, 1))[np.newaxis]


def test_every_model_of_the_ensemble_is_ready(triton: RunningTriton) -> None:
    for model in MODELS:
        assert triton.control.is_ready(model), model


def test_seed_request_returns_the_models_prediction(triton: RunningTriton) -> None:
    out = triton.control.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    prediction = out["multi_modal_output"]
    assert prediction.shape == (1, 1)
    assert prediction.dtype == np.float32
    expected = expected_prediction(triton.repository, (1, 2), decoded_golden_image())
    assert prediction[0, 0] == pytest.approx(expected, rel=1e-4, abs=1e-3)


def test_the_article_client_prints_the_prediction(triton: RunningTriton) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, str(TEMPLATE / "multi_modal_client.py"), "--url", triton.info.grpc_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("[[")
    assert run.stdout.strip().endswith("]]")


def test_corrupt_jpeg_is_an_inference_error_and_the_server_keeps_serving(
    triton: RunningTriton,
) -> None:
    bad = golden().ensemble_inputs(b"this is not a jpeg at all")
    with pytest.raises(TritonError, match="image_preprocess: input is not a decodable image"):
        triton.control.infer(ENSEMBLE, bad, ["multi_modal_output"])
    truncated = golden().golden_jpeg()[:200]
    with pytest.raises(TritonError, match="not a decodable image"):
        triton.control.infer(ENSEMBLE, golden().ensemble_inputs(truncated), ["multi_modal_output"])
    good = triton.control.infer(ENSEMBLE, golden().ensemble_inputs(), ["multi_modal_output"])
    assert np.isfinite(good["multi_modal_output"]).all()


def test_table_preprocess_is_batched_and_out_of_vocabulary_is_all_zero(
    triton: RunningTriton,
) -> None:
    values = np.array([[1], [3], [7]], dtype=np.int8)  # 7 is outside the vocabulary [1, 2, 3]
    out = triton.control.infer(
        "table_data_preprocess",
        {"table_data_input_1": values, "table_data_input_2": values[::-1].copy()},
        ["table_data_output_1", "table_data_output_2"],
    )
    np.testing.assert_array_equal(out["table_data_output_1"], [[1, 0, 0], [0, 0, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out["table_data_output_2"], [[0, 0, 0], [0, 0, 1], [1, 0, 0]])


def test_image_preprocess_handles_a_batch_of_images(triton: RunningTriton) -> None:
    jpeg = np.frombuffer(golden().golden_jpeg(), dtype=np.uint8)
    batch = np.stack([jpeg, jpeg])
    out = triton.control.infer(
        "image_preprocess", {"image_preprocess_input": batch}, ["image_preprocess_output"]
    )["image_preprocess_output"]
    assert out.shape == (2, 3, 256, 256)
    np.testing.assert_allclose(out[0], decoded_golden_image()[0])
    np.testing.assert_array_equal(out[0], out[1])


def test_dynamic_batching_merges_concurrent_requests(triton: RunningTriton) -> None:
    def one(i: int) -> np.ndarray:
        feeds = {"image": np.full((1, 10), i, np.float32), "table_data": np.ones((1, 10), np.float32)}
        return triton.control.infer("multi_modal_model", feeds, ["output"])["output"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert all(r.shape == (1, 1) for r in results)
    stats = triton.control.statistics("multi_modal_model")[0]
    sizes = [int(b["batch_size"]) for b in stats.get("batch_stats", [])]
    assert max(sizes) > 1, f"executed batch sizes: {sizes}"
    # each request's answer is its own, not its neighbour's
    alone = one(3)
    np.testing.assert_allclose(results[3], alone, rtol=1e-5)
