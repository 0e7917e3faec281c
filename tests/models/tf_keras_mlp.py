"""A tf_keras (legacy Keras 2) model, the world TFMOT needs: the probe must handle it too."""

import tf_keras


def build():
    return tf_keras.Sequential(
        [
            tf_keras.Input((32,)),
            tf_keras.layers.Dense(64, activation="relu"),
            tf_keras.layers.Dense(3, activation="softmax"),
        ],
        name="tf_keras_mlp",
    )
