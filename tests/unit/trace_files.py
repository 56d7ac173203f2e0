"""Triton trace files as Triton 2.51 writes them (one sampled HTTP request per file, its request
id unescaped), for the shadow replay's tests: a model ``m`` whose serving version answers sum(x)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

CONFIG = """name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _values(array: np.ndarray) -> str:
    return ",".join(f"{v:g}" for v in array.ravel())


def triton_file(trace_id: int, request_id: str, x: np.ndarray, y: np.ndarray, version: int = 1) -> bytes:
    """One sampled HTTP request as Triton 2.51 writes its file: ``request_id`` unescaped."""
    t = 1_000_000 * trace_id

    def stamp(name: str, ns: int) -> str:
        return f'{{"id":{trace_id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}'

    def tensor(activity: str, name: str, a: np.ndarray) -> str:
        return (
            f'{{"id":{trace_id},"activity":"{activity}","tensor":{{"name":"{name}","data":"{_values(a)}",'
            f'"shape":"{",".join(map(str, a.shape))}","dtype":"FP32"}}}}'
        )

    opened = f'{{"id":{trace_id},"model_name":"m","model_version":{version}'
    opened += f',"request_id":"{request_id}"}}' if request_id else "}"
    records = [
        stamp("HTTP_RECV_START", t),
        stamp("HTTP_RECV_END", t + 10),
        opened,
        stamp("REQUEST_START", t + 20),
        stamp("QUEUE_START", t + 30),
        tensor("TENSOR_QUEUE_INPUT", "X", x),
        tensor("TENSOR_BACKEND_OUTPUT", "Y", y),
        stamp("INFER_RESPONSE_COMPLETE", t + 900),
        stamp("HTTP_SEND_START", t + 910),
        stamp("HTTP_SEND_END", t + 920),
        stamp("COMPUTE_START", t + 40),
        stamp("COMPUTE_INPUT_END", t + 50),
        stamp("COMPUTE_OUTPUT_START", t + 800),
        stamp("COMPUTE_END", t + 850),
        stamp("REQUEST_END", t + 1000),
    ]
    return ("[" + ",".join(records) + "]").encode()


def write_honest(
    folder: Path, count: int, start: int = 0, prefix: str = "c", seed: int = 3
) -> dict[str, bytes]:
    """``count`` honest captures of a model answering ``sum(x)``; their files' bytes by name."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for n in range(start, start + count):
        x = rng.random((1, 4), dtype=np.float32)
        data = triton_file(n + 1, f"{prefix}{n}", x, x.sum(axis=1, keepdims=True))
        path = folder / f"trace.json.{n}"
        path.write_bytes(data)
        os.utime(path, (1000 + n, 1000 + n))
        written[path.name] = data
    return written
