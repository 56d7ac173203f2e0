"""Local CPU stand-in for NVIDIA's TensorFlow backend (Python-based Triton backend).

Triton maps ``platform: "tensorflow_savedmodel"`` to the backend named
``tensorflow``; placed at ``<backend-dir>/tensorflow/model.py`` this file serves
such configs unchanged on the ``tritonserver`` of the nvidia-pytriton wheel.
Production uses NVIDIA's C++ TensorFlow backend (last shipped in the 25.02
containers; later releases serve a SavedModel converted to ONNX).

It serves the SavedModel's ``serving_default`` signature (override with the
config parameter ``signature_key``) from
``<model>/<version>/<default_model_filename>`` (``model.savedmodel`` by default,
the seed's ``model`` folder too).
"""

import importlib.util
import os

import triton_python_backend_utils as pb_utils
from standin_base import StandinModel, threads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# ``import tensorflow`` eagerly imports Keras 3 (and through it scikit-learn) so that a Keras
# optimizer saved in a SavedModel can be rebuilt; ``tf.saved_model.load`` of a serving signature
# needs neither.  TF_USE_LEGACY_KERAS points that eager import at tf_keras, which is not installed
# here, and TensorFlow skips it: 2.3 s of CPU instead of 4.4 s per model instance on this machine,
# the same outputs (TensorFlow 2.21; measured on the template's image_model).  Where tf_keras is
# installed, or the operator chose, TensorFlow's own default stays.
if importlib.util.find_spec("tf_keras") is None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


class TritonPythonModel(StandinModel):
    backend = "tensorflow"
    default_filename = "model.savedmodel"

    def load(self, path, config):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads())
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.tf = tf
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise pb_utils.TritonModelException(
                f"unable to find a SavedModel (saved_model.pb) in '{path}' for model '{config['name']}'"
            )
        key = config.get("parameters", {}).get("signature_key", {}).get("string_value")
        key = key or "serving_default"
        self.saved_model = tf.saved_model.load(path)
        if key not in self.saved_model.signatures:
            raise pb_utils.TritonModelException(
                f"unable to load model '{config['name']}': the SavedModel has no signature '{key}'"
            )
        self.signature = self.saved_model.signatures[key]
        return set(self.signature.structured_input_signature[1]), set(self.signature.structured_outputs)

    def run(self, feeds):
        results = self.signature(**{n: self.tf.constant(v) for n, v in feeds.items()})
        return {n: results[n].numpy() for n in self.outputs}
