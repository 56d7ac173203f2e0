"""The seed article's client: one request to ensemble_multi_modal_model.

    python model_repository_template/multi_modal_client.py --url 127.0.0.1:8001 [--image mug.jpg]

Without --image it sends the template's golden JPEG (generated, no download).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_inputs import ensemble_inputs

TRITON_DTYPES = {np.dtype(np.int8): "INT8", np.dtype(np.uint8): "UINT8"}


def load_image(img_path: str) -> bytes:
    """Loads an encoded image as bytes."""
    return Path(img_path).read_bytes()


def infer(url: str, model_name: str, image: bytes | None = None, timeout: float = 30.0):
    client = triton_client.InferenceServerClient(url=url)
    inputs = []
    for name, array in ensemble_inputs(image).items():
        tensor = triton_client.InferInput(name, array.shape, TRITON_DTYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [triton_client.InferRequestedOutput("multi_modal_output")]
    result = client.infer(model_name=model_name, inputs=inputs, outputs=outputs, client_timeout=timeout)
    return result.as_numpy("multi_modal_output")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_name", default="ensemble_multi_modal_model", help="Model name")
    parser.add_argument("--image", help="Path to an image (default: the golden JPEG)")
    parser.add_argument(
        "--url", default="localhost:8001", help="Inference server gRPC URL. Default is localhost:8001."
    )
    args = parser.parse_args()
    image = load_image(args.image) if args.image else None
    try:
        output = infer(args.url, args.model_name, image)
    except triton_client.InferenceServerException as exc:
        print(f"error: {args.url}: {exc.message()}", file=sys.stderr)
        return 1
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
