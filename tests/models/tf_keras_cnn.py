"""A tiny tf_keras CNN (conv, batch norm, dense) for TFMOT probes: QAT folds and quantizes each kind."""

import tf_keras
from tf_keras import layers


def build():
    return tf_keras.Sequential(
        [
            tf_keras.Input((16, 16, 3)),
            layers.Conv2D(8, 3, padding="same"),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.Conv2D(8, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(4),
        ],
        name="tf_keras_cnn",
    )
