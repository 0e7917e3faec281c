"""Sequence classifiers over integer tokens with a variable sequence axis: the zoo's text models.

Both take token ids of shape (batch, None), 0 being padding (docstrings.PAD_ID), and ignore the
padding: the Embedding's `mask_zero=True` mask flows through the layers (the LSTM skips padded
steps, attention never attends to padded keys, pooling averages real tokens only), so a sequence
gives the same logits however much padding follows it (tests/test_text_models.py checks it).
Sized for the docstrings corpus (docstrings.py): a 4,096-id vocabulary (the corpus has 2,714 ids at
the default `Vocabulary.build` settings), one class per package in LABEL_PACKAGES (8), and at most
MAX_SEQUENCE_LENGTH tokens (6 of its 1,934 docstrings are longer on 3.11.7; encode them with
`max_tokens=MAX_SEQUENCE_LENGTH`).

Each builder takes the Keras module to build with (`keras`, or `tf_keras` for TFMOT, as
zoo._build_builtin does), so both worlds get the same architecture. The position embedding is the
one custom layer; it is made per Keras module (`_position_embedding_class`) and uses TensorFlow ops,
which both run on. Importing this module imports no TensorFlow; building a model does.
"""

from __future__ import annotations

import functools

from edgebatch.text.docstrings import LABEL_PACKAGES

VOCABULARY_SIZE = 4096
CLASSES = len(LABEL_PACKAGES)
MAX_SEQUENCE_LENGTH = 512

# transformer_tiny: 2 post-norm encoder blocks of width 64, 4 heads of 16, feed-forward 128.
TRANSFORMER_WIDTH = 64
TRANSFORMER_HEADS = 4
TRANSFORMER_FEED_FORWARD = 128
TRANSFORMER_BLOCKS = 2
# lstm_small: one LSTM of 128 units over 64-wide embeddings.
LSTM_EMBEDDING = 64
LSTM_UNITS = 128
DROPOUT = 0.1


@functools.cache
def _position_embedding_class(keras):
    """A learned position embedding added to the token embedding, for sequences up to `max_length`.

    Made once per Keras module (Keras 3 and tf_keras have different Layer classes); it passes the
    padding mask through unchanged.
    """

    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, max_length: int, width: int, **kwargs):
            super().__init__(**kwargs)
            self.max_length = int(max_length)
            self.width = int(width)
            self.supports_masking = True

        def build(self, input_shape):
            self.positions = self.add_weight(
                name="positions", shape=(self.max_length, self.width), initializer="uniform", trainable=True
            )
            super().build(input_shape)

        def call(self, inputs, mask=None):
            import tensorflow as tf

            length = tf.shape(inputs)[1]
            return inputs + tf.cast(self.positions[tf.newaxis, :length, :], inputs.dtype)

        def compute_mask(self, inputs, mask=None):
            return mask

        def compute_output_shape(self, input_shape):
            return input_shape

        def get_config(self):
            return {**super().get_config(), "max_length": self.max_length, "width": self.width}

    return PositionEmbedding


@functools.cache
def _padding_mask_class(keras):
    """Where the tokens are real (id != 0): (batch, length) booleans, or (batch, 1, length) for attention."""

    class PaddingMask(keras.layers.Layer):
        def __init__(self, for_attention: bool = False, **kwargs):
            super().__init__(**kwargs)
            self.for_attention = bool(for_attention)

        def call(self, tokens):
            import tensorflow as tf

            real = tf.not_equal(tokens, 0)
            return real[:, tf.newaxis, :] if self.for_attention else real

        def compute_output_shape(self, input_shape):
            return (input_shape[0], 1, input_shape[1]) if self.for_attention else tuple(input_shape)

        def get_config(self):
            return {**super().get_config(), "for_attention": self.for_attention}

    return PaddingMask


def transformer_tiny(keras, name: str = "transformer_tiny"):
    """Token + position embedding, TRANSFORMER_BLOCKS encoder blocks, masked mean pooling, CLASSES logits."""
    layers = keras.layers
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = layers.Embedding(VOCABULARY_SIZE, TRANSFORMER_WIDTH, mask_zero=True)(tokens)
    x = _position_embedding_class(keras)(MAX_SEQUENCE_LENGTH, TRANSFORMER_WIDTH)(x)
    # The padding masks are given explicitly: Keras 3.15's implicit mask did not reach the second
    # block's attention (its logits then moved with the amount of padding).
    padding = _padding_mask_class(keras)()(tokens)
    attention_mask = _padding_mask_class(keras)(for_attention=True)(tokens)
    for _ in range(TRANSFORMER_BLOCKS):
        attended = layers.MultiHeadAttention(
            TRANSFORMER_HEADS, TRANSFORMER_WIDTH // TRANSFORMER_HEADS, dropout=DROPOUT
        )(x, x, attention_mask=attention_mask)
        x = layers.LayerNormalization(epsilon=1e-6)(layers.Add()([x, layers.Dropout(DROPOUT)(attended)]))
        fed = layers.Dense(TRANSFORMER_FEED_FORWARD, activation="relu")(x)
        fed = layers.Dense(TRANSFORMER_WIDTH)(fed)
        x = layers.LayerNormalization(epsilon=1e-6)(layers.Add()([x, layers.Dropout(DROPOUT)(fed)]))
    x = layers.GlobalAveragePooling1D()(x, mask=padding)  # the mean over real tokens only
    outputs = layers.Dense(CLASSES)(x)
    return keras.Model(tokens, outputs, name=name)


def lstm_small(keras, name: str = "lstm_small"):
    """Embedding (masked), one LSTM of LSTM_UNITS (its last real step's state), CLASSES logits."""
    layers = keras.layers
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = layers.Embedding(VOCABULARY_SIZE, LSTM_EMBEDDING, mask_zero=True)(tokens)
    x = layers.LSTM(LSTM_UNITS)(x)
    outputs = layers.Dense(CLASSES)(x)
    return keras.Model(tokens, outputs, name=name)
