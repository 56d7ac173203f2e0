"""table_data_preprocess: one-hot encodes the two categorical table columns.

Batched: every request carries ``[batch, 1]`` INT8 values per input and gets
``[batch, 3]`` FP32 one-hot rows back.  A value outside the vocabulary
``VOCAB`` encodes as an all-zero row (an "unknown" category), the usual
``handle_unknown="ignore"`` behaviour of one-hot encoders; it is not an error.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

VOCAB = np.array([1, 2, 3], dtype=np.int8)
INPUTS = ("table_data_input_1", "table_data_input_2")
OUTPUTS = ("table_data_output_1", "table_data_output_2")


def one_hot(values: np.ndarray) -> np.ndarray:
    """[batch, 1] category ids -> [batch, len(VOCAB)] float32 one-hot rows."""
    flat = values.reshape(-1, 1)
    return (flat == VOCAB[np.newaxis, :]).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensors = []
                for in_name, out_name in zip(INPUTS, OUTPUTS):
                    values = pb_utils.get_input_tensor_by_name(request, in_name).as_numpy()
                    tensors.append(pb_utils.Tensor(out_name, one_hot(values)))
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # one bad request must not fail the batch
                error = pb_utils.TritonError(f"table_data_preprocess: {exc}")
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
