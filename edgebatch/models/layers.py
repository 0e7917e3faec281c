"""What a built Keras model holds, read the same way by the probe's trials and by training's checks.

Neither side owns it, so probing need not import training for it. TensorFlow is not imported here:
it reads the model it is given (Keras 3 or tf_keras).
"""

from __future__ import annotations

from typing import Any

__all__ = ["all_layers"]


def all_layers(model: Any) -> list:
    """The model and every layer inside it, nested models included (Keras 3 and tf_keras)."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model]
