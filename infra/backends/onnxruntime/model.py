"""Local CPU stand-in for NVIDIA's onnxruntime backend (Python-based Triton backend).

Triton maps ``platform: "onnxruntime_onnx"`` to the backend named ``onnxruntime``;
placed at ``<backend-dir>/onnxruntime/model.py`` this file serves such configs
unchanged on the ``tritonserver`` shipped in the nvidia-pytriton wheel, which has
no C++ backends.  Production uses NVIDIA's C++ onnxruntime backend.

The model file is ``<model>/<version>/<default_model_filename>`` (``model.onnx``
by default); when that path is a folder (the seed's ``1/model/model.onnx``), the
``model.onnx`` inside it is used, as NVIDIA's backend does.
"""

import os

import triton_python_backend_utils as pb_utils
from standin_base import StandinModel, threads


class TritonPythonModel(StandinModel):
    backend = "onnxruntime"
    default_filename = "model.onnx"

    def load(self, path, config):
        import onnxruntime as ort

        if os.path.isdir(path):
            path = os.path.join(path, "model.onnx")
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(f"unable to find '{path}' for model '{config['name']}'")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return (
            {i.name for i in self.session.get_inputs()},
            {o.name for o in self.session.get_outputs()},
        )

    def run(self, feeds):
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds), strict=False))
