"""Shared test setup: keep Keras's home out of the user's, quiet TensorFlow's C++ logs."""

import os
import tempfile

# Keras writes ~/.keras/keras.json on first import (docs/tensorflow-memory.md#installing):
# point it at a throwaway folder before any test imports keras or tensorflow.
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="edgebatch-keras-home-"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
