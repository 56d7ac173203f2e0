"""Exports table_data_model (the article's Keras model) as ONNX into VERSION_DIR/model/model.onnx.

Corrections against the article: ``Input(shape=(vocab_num,))`` (a tuple, Keras 3
refuses a bare int), and conversion with ``tf2onnx.convert.from_keras`` so the
ONNX graph keeps the Keras tensor names (the tf2onnx CLI on a SavedModel renames
the output to ``output_0``).  The batch dimension stays symbolic, which is what
``max_batch_size: 256`` in config.pbtxt declares.
"""

from pathlib import Path

OPSET = 13
TABLE_DATA_COLS = {"categorical_col_1": 3, "categorical_col_2": 3}


def build_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = [keras.layers.Input(shape=(n,), name=name) for name, n in TABLE_DATA_COLS.items()]
    concatenate = keras.layers.Concatenate(name="concatenate_layer")(inputs)
    x = keras.layers.Dense(64, activation="relu", name="dense")(concatenate)
    output = keras.layers.Dense(10, name="table_model_output")(x)
    return keras.Model(inputs=inputs, outputs=output, name="table_data_model")


def export(version_dir: Path, seed: int = 0) -> dict:
    """Write the ONNX artifact; return what the registry records about the export."""
    import tensorflow as tf
    import tf2onnx

    model = build_model(seed)
    signature = [tf.TensorSpec((None, n), tf.float32, name=name) for name, n in TABLE_DATA_COLS.items()]
    target = Path(version_dir) / "model" / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    tf2onnx.convert.from_keras(model, input_signature=signature, opset=OPSET, output_path=str(target))
    return {"framework": "onnx", "tf2onnx": tf2onnx.__version__, "opset": OPSET, "seed": seed}


if __name__ == "__main__":
    export(Path(__file__).parent / "1")
