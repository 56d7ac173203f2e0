"""Exports multi_modal_model (the article's Keras model) as a SavedModel into VERSION_DIR/model.

Correction against the article: the serving signature is written explicitly so
its output key is ``output`` (Keras' own export calls it ``output_0``) and its
input keys are ``image`` and ``table_data``, as in config.pbtxt.
"""

from pathlib import Path


def build_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    image_input = keras.layers.Input(shape=(10,), name="image")
    table_data_input = keras.layers.Input(shape=(10,), name="table_data")
    concatenated = keras.layers.Concatenate(name="concatenate_layer")([image_input, table_data_input])
    x = keras.layers.Dense(3, activation="relu", name="dense")(concatenated)
    output = keras.layers.Dense(1, name="output")(x)
    return keras.Model(inputs=[table_data_input, image_input], outputs=output, name="multi_modal_model")


def export(version_dir: Path, seed: int = 0) -> dict:
    import tensorflow as tf

    model = build_model(seed)
    spec = tf.TensorSpec((None, 10), tf.float32)

    @tf.function(input_signature=[spec, spec])
    def serving_default(table_data, image):
        return {"output": model([table_data, image])}

    target = Path(version_dir) / "model"
    target.parent.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(model, str(target), signatures={"serving_default": serving_default})
    return {"framework": "tensorflow", "tensorflow": tf.__version__, "seed": seed}


if __name__ == "__main__":
    export(Path(__file__).parent / "1")
