"""Exports image_model (the article's Keras model) as a SavedModel into VERSION_DIR/model.

Correction against the article: ``model.save``/``model.export`` name the
serving output ``output_0``; config.pbtxt (and the ensemble) use ``output``.  The
SavedModel is written with an explicit serving signature whose output key is the
Keras output layer's name.
"""

from pathlib import Path

IMAGE_SHAPE = (3, 256, 256)


def build_model(seed: int = 0):
    import keras
    from keras.layers import Conv2D, Dense, Flatten

    keras.utils.set_random_seed(seed)
    image_input = keras.layers.Input(shape=IMAGE_SHAPE, name="image")
    conved_img = Conv2D(filters=3, kernel_size=(3, 3), name="conv_1")(image_input)
    flatten_img = Flatten(name="flatten_image")(conved_img)
    densed_img = Dense(64, activation="relu", name="img_dense")(flatten_img)
    output = Dense(10, name="output")(densed_img)
    return keras.Model(inputs=[image_input], outputs=output, name="image_model")


def export(version_dir: Path, seed: int = 0) -> dict:
    import tensorflow as tf

    model = build_model(seed)

    @tf.function(input_signature=[tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32, name="image")])
    def serving_default(image):
        return {"output": model(image)}

    target = Path(version_dir) / "model"
    target.parent.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(model, str(target), signatures={"serving_default": serving_default})
    return {"framework": "tensorflow", "tensorflow": tf.__version__, "seed": seed}


if __name__ == "__main__":
    export(Path(__file__).parent / "1")
