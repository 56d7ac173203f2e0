"""Shared part of mlreg's local stand-in backends (copied next to each backend's model.py).

A stand-in subclass implements ``load(path, config)`` returning the model's input
and output names, and ``run(feeds)`` mapping input arrays to output arrays.  This
class checks the config against the model with Triton's wording, batches the
requests of one execution when the model batches, and reports every failure on
the request it concerns.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class StandinModel:
    backend = "standin"
    default_filename = "model"

    def load(self, path, config):  # pragma: no cover - overridden
        raise NotImplementedError

    def run(self, feeds):  # pragma: no cover - overridden
        raise NotImplementedError

    def initialize(self, args):
        config = json.loads(args["model_config"])
        name = config.get("default_model_filename") or self.default_filename
        path = os.path.join(args["model_repository"], args["model_version"], name)
        model_inputs, model_outputs = self.load(path, config)
        for kind, declared, allowed in (
            ("input", config["input"], model_inputs),
            ("output", config["output"], model_outputs),
        ):
            for tensor in declared:
                if tensor["name"] not in allowed:
                    raise pb_utils.TritonModelException(
                        f"unexpected inference {kind} '{tensor['name']}', allowed {kind}s are: "
                        + ", ".join(sorted(allowed))
                    )
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.batching = int(config.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        feeds = [
            {n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests
        ]
        if self.batching and len(feeds) > 1:
            try:
                return self.execute_batched(feeds)
            except Exception:
                pass
        return [self.respond(feed) for feed in feeds]

    def execute_batched(self, feeds):
        sizes = [len(feed[self.inputs[0]]) for feed in feeds]
        merged = {n: np.concatenate([feed[n] for feed in feeds]) for n in self.inputs}
        results = self.run(merged)
        bounds = np.cumsum([0, *sizes])
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(n, results[n][lo:hi]) for n in self.outputs]
            )
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
        ]

    def respond(self, feed):
        try:
            results = self.run(feed)
        except Exception as exc:
            error = pb_utils.TritonError(f"{self.backend}: {exc}")
            return pb_utils.InferenceResponse(error=error)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(n, results[n]) for n in self.outputs]
        )


def threads():
    return int(os.environ.get("MLREG_STANDIN_THREADS", "1"))
