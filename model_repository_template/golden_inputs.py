"""Golden inputs for the template: the seed's table values and a JPEG made here.

The JPEG is drawn deterministically (a colour gradient with a few shapes, a
"mug-like" test card) so no download is needed and every run sends the same bytes.
"""

from __future__ import annotations

import io

import numpy as np

TABLE_DATA_INPUT_1 = 1
TABLE_DATA_INPUT_2 = 2
IMAGE_SIZE = (320, 240)


def golden_jpeg(size: tuple[int, int] = IMAGE_SIZE, quality: int = 90) -> bytes:
    """Return the bytes of the golden JPEG (same bytes on every call)."""
    from PIL import Image, ImageDraw

    width, height = size
    x = np.linspace(0, 255, width, dtype=np.float32)[np.newaxis, :]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, np.newaxis]
    pixels = np.stack(
        [
            np.broadcast_to(x, (height, width)),
            np.broadcast_to(y, (height, width)),
            np.broadcast_to((x + y) / 2, (height, width)),
        ],
        axis=-1,
    ).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    draw.ellipse((width // 4, height // 4, width // 2, height // 2), fill=(250, 250, 250))
    draw.rectangle((width // 2, height // 3, 3 * width // 4, 3 * height // 4), fill=(20, 40, 160))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def ensemble_inputs(image: bytes | None = None) -> dict[str, np.ndarray]:
    """The seed's request to ensemble_multi_modal_model, as name -> array."""
    data = golden_jpeg() if image is None else image
    return {
        "table_data_input_1": np.array([[TABLE_DATA_INPUT_1]], dtype=np.int8),
        "table_data_input_2": np.array([[TABLE_DATA_INPUT_2]], dtype=np.int8),
        "image_preprocess_input": np.frombuffer(data, dtype=np.uint8)[np.newaxis, :],
    }


if __name__ == "__main__":
    import sys

    out = sys.argv[1] if len(sys.argv) > 1 else "golden.jpg"
    with open(out, "wb") as f:
        f.write(golden_jpeg())


def decoded_golden_image() -> np.ndarray:
    """The golden JPEG as image_preprocess outputs it: [1, 3, 256, 256] float32."""
    from PIL import Image

    with Image.open(io.BytesIO(golden_jpeg())) as image:
        pixels = np.asarray(image.convert("RGB").resize((256, 256)), dtype=np.float32)
    return np.transpose(pixels, (2, 0, 1))[np.newaxis]


def model_inputs(model: str) -> dict[str, np.ndarray] | None:
    """Golden inputs of each template model (None for a model the template does not know)."""
    one_hot = {1: [[1, 0, 0]], 2: [[0, 1, 0]]}
    rng = np.random.default_rng(0)
    inputs = {
        "ensemble_multi_modal_model": ensemble_inputs,
        "table_data_preprocess": lambda: {
            k: v for k, v in ensemble_inputs().items() if k.startswith("table")
        },
        "table_data_model": lambda: {
            "categorical_col_1": np.array(one_hot[TABLE_DATA_INPUT_1], np.float32),
            "categorical_col_2": np.array(one_hot[TABLE_DATA_INPUT_2], np.float32),
        },
        "image_preprocess": lambda: {"image_preprocess_input": ensemble_inputs()["image_preprocess_input"]},
        "image_model": lambda: {"image": decoded_golden_image()},
        "multi_modal_model": lambda: {
            "image": rng.normal(size=(2, 10)).astype(np.float32),
            "table_data": rng.normal(size=(2, 10)).astype(np.float32),
        },
    }
    make = inputs.get(model)
    return None if make is None else make()


# What the quality gate expects of each model's outputs on the golden inputs, beyond "finite, the
# configured shape": a declared value range, and the largest change against the serving version
# that is still a pass (no tolerance declared: the change is reported, not judged).
QUALITY = {
    "table_data_preprocess": {
        "table_data_output_1": {"min": 0.0, "max": 1.0, "tolerance": 0.0},
        "table_data_output_2": {"min": 0.0, "max": 1.0, "tolerance": 0.0},
    },
    "image_preprocess": {"image_preprocess_output": {"min": 0.0, "max": 255.0, "tolerance": 0.0}},
}


def quality_spec(model: str) -> dict[str, dict[str, float]]:
    return QUALITY.get(model, {})
