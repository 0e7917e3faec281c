"""Model specs: built-in names, `path/to/file.py:function`, or a saved `.keras` file.

`parse_model_spec` is pure and checks what can be checked without TensorFlow (so a typo fails in
milliseconds, before a worker process spends seconds importing TensorFlow). `build_model` imports
TensorFlow and builds the model; it runs inside probe workers and benchmarks.

`optimize` ("qat", "prune") wraps the built model with TensorFlow Model Optimization
(`build_model(..., optimize=...)`). TFMOT handles tf_keras models only, so built-ins are then built
with tf_keras, a FILE.py:FUNCTION must return a tf_keras model (tests/models/tf_keras_mlp.py) and a
.keras file must load with tf_keras. Importing tensorflow_model_optimization sets
TF_USE_LEGACY_KERAS=1, which makes `tf.keras` tf_keras for the rest of the process
(docs/tensorflow-memory.md#tfmot), so it is imported here, lazily, only when asked: in a probe
that is the worker process, never the caller's.
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
    "transformer_tiny": "2-block Transformer encoder (width 64, 4 heads), tokens of any length up to 512 "
                        "(0 = padding), 4096-id vocabulary, 8 classes",
    "lstm_small": "Embedding(4096, 64) + LSTM(128), tokens of any length (0 = padding), 8 classes",
}
# Built-ins whose input has a variable sequence axis (shape (None,)), with the longest sequence
# each is meant for (the position embedding's size; the docstrings corpus encoded to 512 tokens
# for the LSTM): the top of the default `--seq-lens` ladder (probing/token_fit.py).
SEQUENCE_MODEL_MAX_LENGTHS: dict[str, int] = {"transformer_tiny": 512, "lstm_small": 512}
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
OPTIMIZERS = ("adam", "sgd")
# TFMOT wrappers the probe can apply: quantization-aware training, magnitude pruning.
OPTIMIZATIONS = ("none", "qat", "prune")
_TF_KERAS_HOWTO = (
    "return a tf_keras model (`import tf_keras`, as in tests/models/tf_keras_mlp.py) or use a built-in model"
)


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


def build_model(spec: ModelSpec, precision: str = "float32", optimize: str = "none"):
    """Build the model for `spec` under `precision` (a Keras 3 or a tf_keras model).

    With `optimize` "qat" or "prune" the model is a tf_keras model wrapped by TFMOT (see
    `build_base_model` for the model before wrapping); a Keras 3 model is a UsageError.
    """
    return optimize_model(build_base_model(spec, precision, optimize), optimize)


def build_base_model(spec: ModelSpec, precision: str = "float32", optimize: str = "none"):
    """The model for `spec` before any TFMOT wrapping: a tf_keras model when `optimize` asks for one."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    _check_optimize(optimize)
    import keras

    keras.mixed_precision.set_global_policy(precision)
    if optimize != "none":
        import tf_keras

        tf_keras.mixed_precision.set_global_policy(precision)
        if spec.kind == "builtin":
            return _build_builtin(spec.name, tf_keras)
        if spec.kind == "keras_file":
            return _load_tf_keras_file(spec.path, optimize)
        model = _call_model_function(spec)
        if keras_flavor(model) != "tf_keras":
            raise UsageError(
                f"--optimize {optimize} needs a tf_keras model (TFMOT does not handle Keras 3) and {spec.text!r} "
                f"returned a Keras 3 {type(model).__name__}: {_TF_KERAS_HOWTO}"
            )
        return model
    if spec.kind == "builtin":
        return _build_builtin(spec.name)
    if spec.kind == "keras_file":
        return _load_keras_file(spec.path)
    return _call_model_function(spec)


def optimize_model(model, optimize: str):
    """`model` wrapped by TFMOT: quantize_model for "qat", prune_low_magnitude for "prune", as is for "none".

    Imports tensorflow_model_optimization (only here, only when asked: see the module docstring).
    """
    _check_optimize(optimize)
    if optimize == "none":
        return model
    if keras_flavor(model) != "tf_keras":
        raise UsageError(f"--optimize {optimize} needs a tf_keras model (TFMOT does not handle Keras 3): {_TF_KERAS_HOWTO}")
    import tensorflow_model_optimization as tfmot

    try:
        if optimize == "qat":
            return tfmot.quantization.keras.quantize_model(model)
        return tfmot.sparsity.keras.prune_low_magnitude(model)
    except (ValueError, TypeError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UsageError(f"TFMOT cannot apply --optimize {optimize} to model {model.name!r}: {first}") from error


def training_callbacks(model, optimize: str) -> list:
    """Keras callbacks a custom training loop must drive for `optimize` (TFMOT's UpdatePruningStep for "prune").

    Without UpdatePruningStep's hooks a pruned model's step fails with "Prune() wrapper requires the
    UpdatePruningStep callback" (docs/tensorflow-memory.md#tfmot); the trial calls `set_model`,
    `on_train_begin` once and `on_train_batch_begin` before each step, as `fit` would.
    """
    if optimize != "prune":
        return []
    import tensorflow_model_optimization as tfmot

    return [tfmot.sparsity.keras.UpdatePruningStep()]


def _check_optimize(optimize: str) -> None:
    if optimize not in OPTIMIZATIONS:
        raise UsageError(f"unknown optimization {optimize!r}: choose one of {', '.join(OPTIMIZATIONS)}")


def keras_flavor(model) -> str:
    """'tf_keras' for models from the tf_keras package (TFMOT's world), else 'keras3'."""
    module = type(model).__module__
    return "tf_keras" if module.startswith("tf_keras") or ".legacy." in module else "keras3"


def _build_builtin(name: str, keras=None):
    """A built-in model, built with `keras` (the keras module by default; tf_keras for TFMOT)."""
    if keras is None:
        import keras
    layers = keras.layers

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
    if name in SEQUENCE_MODEL_MAX_LENGTHS:
        from edgebatch.models import text as text_models

        return getattr(text_models, name)(keras)
    raise UsageError(f"unknown built-in model {name!r}")


def _load_keras_file(path: str):
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any load failure is the user's file
        raise UsageError(f"cannot load model file {path!r}: {error}") from error


def _load_tf_keras_file(path: str, optimize: str):
    import tf_keras

    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as error:  # any load failure is the user's file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UsageError(
            f"--optimize {optimize} needs a tf_keras model (TFMOT does not handle Keras 3) and tf_keras cannot load "
            f"{path!r} ({first}): give FILE.py:FUNCTION that returns a tf_keras model (`import tf_keras`, as in "
            "tests/models/tf_keras_mlp.py)"
        ) from error


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
