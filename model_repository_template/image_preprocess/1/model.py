"""image_preprocess: encoded image bytes -> channel-first float32 pixels.

Batched: a request carries ``[batch, n]`` UINT8 rows, each one encoded image
(JPEG, PNG, ... anything Pillow reads; trailing zero padding is tolerated), and
gets ``[batch, 3, 256, 256]`` FP32 back.  Images are converted to RGB first, so
grayscale or RGBA files work too.  Bytes that are not an image give an error
response for that request only; the model keeps serving.
"""

import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, UnidentifiedImageError

SIZE = (256, 256)


def decode(row: np.ndarray) -> np.ndarray:
    """One encoded image -> [3, 256, 256] float32 (pixel values 0..255)."""
    with Image.open(io.BytesIO(row.tobytes())) as image:
        rgb = image.convert("RGB").resize(SIZE)
        pixels = np.asarray(rgb, dtype=np.float32)
    return np.transpose(pixels, (2, 0, 1))


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(
            self.model_config, "image_preprocess_output"
        )
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "image_preprocess_input").as_numpy()
            try:
                batch = np.stack([decode(row) for row in rows.reshape(rows.shape[0], -1)])
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                message = f"image_preprocess: input is not a decodable image ({exc})"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            tensor = pb_utils.Tensor("image_preprocess_output", batch.astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
