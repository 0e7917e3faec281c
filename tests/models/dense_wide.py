"""A dense-only model with large activations and few weights, for tests under address-space caps.

Dense (matmul) kernels raise a clean ResourceExhaustedError when an allocation fails under
RLIMIT_AS; oneDNN convolutions can segfault instead
(docs/tensorflow-memory.md#onednn-convolutions-can-crash). Each sample carries a 2048 x 64 float
tensor through two Dense layers, so memory grows about 2-3 MiB per sample while the weights stay
under 100 KiB.
"""

import keras
from keras import layers


def build():
    return keras.Sequential(
        [
            keras.Input((64,)),
            layers.Dense(64, activation="relu"),
            layers.RepeatVector(2048),
            layers.Dense(64, activation="relu"),
            layers.Dense(64, activation="relu"),
            layers.GlobalAveragePooling1D(),
            layers.Dense(10),
        ],
        name="dense_wide",
    )
