"""Model specs: built-in names, `path/to/file.py:function`, or a saved `.keras` file.

`parse_model_spec` is pure and checks what can be checked without TensorFlow (so a typo fails in
milliseconds, before a worker process spends seconds importing TensorFlow). `build_model` imports
TensorFlow and builds the model; it runs inside probe workers and benchmarks.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from edgebatch.errors import UsageError

# Built-in models (weights=None: nothing is downloaded). Shapes are small enough to probe on a
# laptop CPU in minutes; mobilenet_v2 at 96x96x3 with 10 classes is the default probe's model.
BUILTIN_MODELS: dict[str, str] = {
    "mobilenet_v2": "MobileNetV2, 96x96x3 input, 10 classes",
    "resnet50": "ResNet50, 96x96x3 input, 10 classes",
    "efficientnet_b0": "EfficientNetB0, 96x96x3 input, 10 classes",
    "mlp": "3-layer MLP, 784 inputs, 10 classes",
    "small_cnn": "3-conv CNN, 64x64x3 input, 10 classes",
    "text_cnn": "Embedding(20000, 128) + Conv1D text classifier, 256 tokens, 2 classes",
}
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "builtin" | "function" | "keras_file"
    text: str  # the spec as given, normalised
    name: str  # builtin name, function name or file stem
    path: str | None = None
    function: str | None = None


def parse_model_spec(spec: str) -> ModelSpec:
    """Check a model spec without importing TensorFlow; raise UsageError naming the fix."""
    text = str(spec).strip()
    if not text:
        raise UsageError("empty model spec: give a built-in name (e.g. mobilenet_v2), FILE.py:FUNCTION or FILE.keras")
    if text in BUILTIN_MODELS:
        return ModelSpec("builtin", text, text)
    if text.endswith(".keras"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise UsageError(f"model file {text!r} does not exist")
        return ModelSpec("keras_file", str(path.resolve()), path.stem, path=str(path.resolve()))
    if ":" in text:
        file_part, _, function = text.rpartition(":")
        path = Path(file_part).expanduser()
        if not file_part.endswith(".py"):
            raise UsageError(f"model spec {text!r}: expected FILE.py:FUNCTION, and {file_part!r} is not a .py file")
        if not path.is_file():
            raise UsageError(f"model spec {text!r}: file {file_part!r} does not exist")
        if not function.isidentifier():
            raise UsageError(f"model spec {text!r}: {function!r} is not a Python function name")
        return ModelSpec("function", f"{path.resolve()}:{function}", function, path=str(path.resolve()), function=function)
    names = ", ".join(sorted(BUILTIN_MODELS))
    raise UsageError(f"unknown model {text!r}: use one of {names}, FILE.py:FUNCTION or FILE.keras")


def build_model(spec: ModelSpec, precision: str = "float32"):
    """Build the model for `spec` under `precision` (a Keras 3 or a tf_keras model)."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    import keras

    keras.mixed_precision.set_global_policy(precision)
    if spec.kind == "builtin":
        return _build_builtin(spec.name)
    if spec.kind == "keras_file":
        return _load_keras_file(spec.path)
    return _call_model_function(spec)


def keras_flavor(model) -> str:
    """'tf_keras' for models from the tf_keras package (TFMOT's world), else 'keras3'."""
    module = type(model).__module__
    return "tf_keras" if module.startswith("tf_keras") or ".legacy." in module else "keras3"


def _build_builtin(name: str):
    import keras
    from keras import layers

    image_shape = (96, 96, 3)
    if name == "mobilenet_v2":
        return keras.applications.MobileNetV2(input_shape=image_shape, classes=10, weights=None)
    if name == "resnet50":
        return keras.applications.ResNet50(input_shape=image_shape, classes=10, weights=None)
    if name == "efficientnet_b0":
        return keras.applications.EfficientNetB0(input_shape=image_shape, classes=10, weights=None)
    if name == "mlp":
        return keras.Sequential(
            [
                keras.Input((784,)),
                layers.Dense(512, activation="relu"),
                layers.Dense(512, activation="relu"),
                layers.Dense(10),
            ],
            name="mlp",
        )
    if name == "small_cnn":
        return keras.Sequential(
            [
                keras.Input((64, 64, 3)),
                layers.Conv2D(32, 3, padding="same", activation="relu"),
                layers.Conv2D(32, 3, padding="same", activation="relu"),
                layers.MaxPooling2D(),
                layers.Conv2D(64, 3, padding="same", activation="relu"),
                layers.GlobalAveragePooling2D(),
                layers.Dense(10),
            ],
            name="small_cnn",
        )
    if name == "text_cnn":
        return keras.Sequential(
            [
                keras.Input((256,), dtype="int32"),
                layers.Embedding(20000, 128),
                layers.Conv1D(128, 5, activation="relu"),
                layers.GlobalMaxPooling1D(),
                layers.Dense(64, activation="relu"),
                layers.Dense(2),
            ],
            name="text_cnn",
        )
    raise UsageError(f"unknown built-in model {name!r}")


def _load_keras_file(path: str):
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any load failure is the user's file
        raise UsageError(f"cannot load model file {path!r}: {error}") from error


def _call_model_function(spec: ModelSpec):
    module_spec = importlib.util.spec_from_file_location(f"edgebatch_user_model_{abs(hash(spec.path))}", spec.path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"cannot import {spec.path!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, spec.function, None)
    if not callable(factory):
        raise UsageError(f"{spec.path!r} has no function {spec.function!r}")
    model = factory()
    if not hasattr(model, "trainable_variables") or not hasattr(model, "inputs"):
        raise UsageError(f"{spec.text!r} returned {type(model).__name__}, not a Keras model")
    return model
