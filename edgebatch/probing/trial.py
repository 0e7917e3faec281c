"""One probe trial: a few real training steps at batch B on synthetic data, with memory readings.

This is the TensorFlow side of the probe and runs inside a worker process (see worker.py). The
step is traced once with the batch dimension None (no retrace across batch sizes, see
docs/tensorflow-memory.md#tffunction-retracing), so a trial costs its steps, not a trace.
"""

from __future__ import annotations

import importlib
import statistics
import time
from dataclasses import dataclass

from edgebatch.errors import UsageError
from edgebatch.sensors import (
    process_peak_rss_bytes,
    process_swap_bytes,
    read_allocator,
    reset_allocator_peak,
    reset_process_peak_rss,
)

DEFAULT_VOCABULARY = 1000
# A process's resident peak climbs in 40-250 MiB jumps over the first 5-11 steps at a new size
# (docs/tensorflow-memory.md#peak-climbs-over-the-first-steps), so a 3-step trial reads 5-10% low
# (seen here too: small_cnn at 384 read 1.44 GiB in 4 steps, 1.59 GiB in a fresh 10-step process).
# Steps continue, within --trial-seconds, until the peak has not moved for SETTLE_STEPS steps, up to
# MAX_STEPS_PER_TRIAL.
MAX_STEPS_PER_TRIAL = 14
SETTLE_STEPS = 3
SETTLE_FRACTION = 0.002
# A peak still rising when --trial-seconds run out gets up to this many times --trial-seconds in
# all to settle, where SETTLE_STEPS steps fit in --trial-seconds: on a busy host the peak climbs
# 1-2% over 16 steps even with one inter-op thread, and settles by about step 11
# (docs/probe-rules.md, "trial.keep_stepping").
SETTLE_SECONDS_FACTOR = 3


def keep_stepping(step_seconds: list[float], peaks: list[int], steps: int, trial_seconds: float,
                  track_resident: bool) -> bool:
    """Whether a trial runs another timed step. Pure.

    Within `trial_seconds`: until `steps` ran and the resident peak settled (resident_peak_settled).
    Past it, only while the peak still rises and one step is short enough for SETTLE_STEPS of them
    to fit in `trial_seconds`, up to SETTLE_SECONDS_FACTOR x `trial_seconds`. Never past
    MAX_STEPS_PER_TRIAL; at least one timed step.
    """
    if not step_seconds:
        return True
    if len(step_seconds) >= MAX_STEPS_PER_TRIAL:
        return False
    rising = track_resident and not resident_peak_settled(peaks)
    spent = sum(step_seconds)
    if spent < trial_seconds:
        return len(step_seconds) < steps or rising
    short_steps = step_seconds[-1] * SETTLE_STEPS <= trial_seconds
    return rising and short_steps and spent < SETTLE_SECONDS_FACTOR * trial_seconds


def resident_peak_settled(peaks: list[int]) -> bool:
    """True when the last SETTLE_STEPS readings rose by at most SETTLE_FRACTION in all."""
    if len(peaks) <= SETTLE_STEPS:
        return False
    return peaks[-1] <= peaks[-1 - SETTLE_STEPS] * (1 + SETTLE_FRACTION)


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]  # without the batch dimension; a variable axis at the trial's sequence length
    dtype: str
    vocabulary: int | None = None  # integer inputs: token ids are drawn from [0, vocabulary)
    # The shape as the model declares it (None: a variable sequence axis); the step is traced with it.
    declared_shape: tuple[int | None, ...] | None = None

    @property
    def variable(self) -> bool:
        return self.declared_shape is not None and None in self.declared_shape


@dataclass(frozen=True)
class TargetSpec:
    kind: str  # "classification" | "binary" | "regression"
    shape: tuple[int, ...]
    classes: int | None
    from_logits: bool


# Allocation failures that TensorFlow's GPU kernels report as InternalError, not as
# ResourceExhaustedError: cuBLAS/cuDNN handles and workspaces are allocated by the libraries
# themselves ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "failed to allocate
# memory"), and a host-to-device copy whose destination could not be allocated says "Dst tensor is
# not initialized". Matched case-insensitively.
ALLOCATION_FAILURE_MARKERS = (
    "alloc_failed",
    "failed to allocate",
    "out of memory",
    "cuda_error_out_of_memory",
    "dst tensor is not initialized",
)


def is_oom(error_class_names: list[str] | tuple[str, ...], message: str) -> bool:
    """Whether an error that a training step raised means "this batch does not fit".

    `error_class_names` are the names in the error's class hierarchy (type(error).__mro__), so that
    this decision needs no TensorFlow. ResourceExhaustedError and MemoryError always count; an
    InternalError counts when its message names an allocation failure; nothing else does (a
    different InternalError is a bug or a broken device, and stops the probe).
    """
    names = set(error_class_names)
    if names & {"ResourceExhaustedError", "MemoryError"}:
        return True
    if "InternalError" in names:
        lowered = message.lower()
        return any(marker in lowered for marker in ALLOCATION_FAILURE_MARKERS)
    return False


def is_oom_error(error: BaseException) -> bool:
    """A real out-of-memory raised by a training step (see is_oom)."""
    return is_oom([cls.__name__ for cls in type(error).__mro__], str(error))


def swap_grew(swap_before_bytes: int | None, swap_after_bytes: int | None) -> bool:
    """Whether a process's swap use rose between two VmSwap readings (None: unknown, not grown).

    The kernel swaps a process's pages out only when RAM runs short, so any rise during a trial
    means the trial did not fit in the RAM there was; and VmHWM counts resident pages only, so a
    swapping trial's peak reads low (it would pass as "fits").
    """
    return swap_before_bytes is not None and swap_after_bytes is not None and swap_after_bytes > swap_before_bytes




class TrialRunner:
    """Builds the training step for a model once and runs trials at any batch size."""

    def __init__(self, model, *, optimizer: str = "adam", device: str = "CPU:0", callbacks: list | tuple = (),
                 sequence_length: int | None = None):
        """`callbacks`: Keras callbacks the loop drives as `fit` would (set_model and on_train_begin
        now, on_train_batch_begin before each step), e.g. TFMOT's UpdatePruningStep (zoo.training_callbacks).
        `sequence_length`: the tokens per example of a model with a variable sequence axis (its
        input's None dimensions); the step is traced with the axis left open, as training traces it."""
        import tensorflow as tf

        from edgebatch.models.zoo import keras_flavor

        self.model = model
        self.device = device
        self.flavor = keras_flavor(model)
        self.keras = importlib.import_module("tf_keras" if self.flavor == "tf_keras" else "keras")
        self.sequence_length = sequence_length
        self.inputs = input_specs(model, sequence_length)
        self.target = target_spec(model)
        self.optimizer_name = optimizer
        self.optimizer = make_optimizer(self.keras, optimizer)
        # float16 compute trains with a loss-scale optimizer (as model.compile and edgebatch.fit
        # do): its scaled loss and finiteness checks are part of the step's memory.
        self.loss_scaled = computes_in_float16(model)
        if self.loss_scaled:
            self.optimizer = loss_scale_optimizer(self.keras, self.optimizer)
        self.loss = make_loss(self.keras, self.target)
        self.trace_count = 0
        self.callbacks = list(callbacks)
        self.steps_run = 0
        with tf.device(device):
            self.optimizer.build(model.trainable_variables)
            for callback in self.callbacks:
                callback.set_model(model)
                callback.on_train_begin()
        self._train_step = self._build_step()

    def _build_step(self):
        import tensorflow as tf

        model, optimizer, loss_fn = self.model, self.optimizer, self.loss
        scaled, tf_keras_scaling = self.loss_scaled, self.loss_scaled and self.flavor == "tf_keras"
        x_signature = tuple(tf.TensorSpec((None, *(spec.declared_shape or spec.shape)), spec.dtype) for spec in self.inputs)
        y_dtype = "int32" if self.target.kind == "classification" else "float32"
        y_signature = tf.TensorSpec((None, *self.target.shape), y_dtype)
        single_input = len(self.inputs) == 1

        @tf.function(input_signature=[x_signature, y_signature])
        def train_step(x, y):
            self.trace_count += 1  # runs only while tracing
            with tf.GradientTape() as tape:
                outputs = model(x[0] if single_input else list(x), training=True)
                loss = loss_fn(y, tf.cast(outputs, tf.float32))
                objective = loss
                if scaled:
                    objective = optimizer.get_scaled_loss(loss) if tf_keras_scaling else optimizer.scale_loss(loss)
            gradients = tape.gradient(objective, model.trainable_variables)
            if tf_keras_scaling:
                gradients = optimizer.get_unscaled_gradients(gradients)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        return train_step

    def _step(self, x, y):
        """One training step (the traced train_step), after the callbacks' on_train_batch_begin."""
        for callback in self.callbacks:
            callback.on_train_batch_begin(self.steps_run)
        self.steps_run += 1
        return self._train_step(x, y)

    def make_batch(self, batch: int):
        import tensorflow as tf

        x = []
        for spec in self.inputs:
            if spec.dtype.startswith("int") and spec.variable:
                # Every position a real token (ids from 1; 0 is padding): the full length is measured.
                x.append(tf.random.uniform((batch, *spec.shape), 1, max(2, spec.vocabulary or DEFAULT_VOCABULARY), dtype=spec.dtype))
            elif spec.dtype.startswith("int"):
                x.append(tf.random.uniform((batch, *spec.shape), 0, spec.vocabulary or DEFAULT_VOCABULARY, dtype=spec.dtype))
            else:
                x.append(tf.random.uniform((batch, *spec.shape), dtype=spec.dtype))
        target = self.target
        if target.kind == "classification":
            y = tf.random.uniform((batch, *target.shape), 0, target.classes, dtype="int32")
        elif target.kind == "binary":
            y = tf.cast(tf.random.uniform((batch, *target.shape)) > 0.5, "float32")
        else:
            y = tf.random.normal((batch, *target.shape))
        return tuple(x), y

    def run_steps(self, batch: int, steps: int) -> list[float]:
        """Run `steps` training steps at `batch`; return each step's seconds. OOM errors propagate."""
        import tensorflow as tf

        with tf.device(self.device):
            x, y = self.make_batch(batch)
            seconds = []
            for _ in range(steps):
                started = time.perf_counter()
                self._step(x, y).numpy()  # .numpy() waits for the step to finish
                seconds.append(time.perf_counter() - started)
        return seconds

    def run_trial(self, batch: int, steps: int, trial_seconds: float) -> dict:
        """One trial: a warm-up step, then up to `steps` timed steps, with peak memory readings.

        Timed steps stop as keep_stepping says: once they have taken `trial_seconds` (at least one
        runs), unless the resident peak is still rising and short steps can show it settle. When the
        warm-up step alone takes longer than `trial_seconds`, it is the timing: at such batches the
        first-call overhead (about a second on CPU) is small beside the step itself, and another
        step would double the cost of the probe's most expensive trials.
        """
        import tensorflow as tf

        reset_process_peak_rss()
        reset_allocator_peak(self.device)
        track_resident = self.device.upper().startswith("CPU")
        swap_before = process_swap_bytes() if track_resident else None
        swap_most = swap_before
        try:
            with tf.device(self.device):
                x, y = self.make_batch(batch)
                started = time.perf_counter()
                self._step(x, y).numpy()
                warmup_seconds = time.perf_counter() - started
                timings = [warmup_seconds] if warmup_seconds >= trial_seconds else []
                peaks = [process_peak_rss_bytes()] if track_resident else []
                if track_resident:
                    swap_most = _larger(swap_most, process_swap_bytes())
                while keep_stepping(timings, peaks, steps, trial_seconds, track_resident):
                    started = time.perf_counter()
                    self._step(x, y).numpy()
                    timings.append(time.perf_counter() - started)
                    if track_resident:
                        peaks.append(process_peak_rss_bytes())
                        # Read each step: pages swapped out and back in within the trial would
                        # leave no trace in a reading taken only at its end.
                        swap_most = _larger(swap_most, process_swap_bytes())
        except Exception as error:  # noqa: BLE001 - OOMs are outcomes; the caller re-raises others
            if is_oom_error(error):
                return {"batch": batch, "ok": False, "error": "oom", "detail": (str(error).splitlines() or [type(error).__name__])[0][:300]}
            raise
        if swap_grew(swap_before, swap_most):
            return {
                "batch": batch,
                "ok": False,
                "error": "swapped",
                "detail": f"swap use grew from {swap_before} to {swap_most} bytes: the trial did not fit in RAM",
            }
        allocator = read_allocator(self.device)
        step_seconds = statistics.median(timings)
        return {
            "batch": batch,
            "ok": True,
            "error": None,
            "allocator_peak_bytes": allocator.peak_bytes if allocator else None,
            "process_peak_bytes": process_peak_rss_bytes() if self.device.upper().startswith("CPU") else None,
            "step_seconds": step_seconds,
            "samples_per_second": batch / step_seconds,
            "timed_steps": len(timings),
            "resident_settled": resident_peak_settled(peaks) if track_resident else None,
            # False when the timing is the warm-up step's (see above): not steady-state samples/s.
            "steady": warmup_seconds < trial_seconds,
        }

    def model_facts(self) -> dict:
        from edgebatch.profiles.fingerprint import config_hash

        return {
            "name": self.model.name,
            "config_hash": config_hash(architecture_description(self.model)),
            # As declared: a variable sequence axis stays None (the lengths are the probe's, not the model's).
            "inputs": [{"shape": list(spec.declared_shape or spec.shape), "dtype": spec.dtype} for spec in self.inputs],
            "variable_sequence_axis": any(spec.variable for spec in self.inputs),
            "parameters": int(sum(int(_size(v.shape)) for v in self.model.trainable_variables)),
            "keras_flavor": self.flavor,
        }


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _size(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def architecture_description(model) -> object:
    """What identifies the architecture: Keras's config when it has one, else layer types and weight shapes.

    Layer and model names are replaced by their position: Keras numbers unnamed layers with a
    process-wide counter ("dense", then "dense_1" for the same layer in the next model built), so
    the same architecture built second in a process would otherwise hash differently from the
    probe worker's, and its cached profile would not be found.
    """
    try:
        config = model.get_config()
    except Exception:  # noqa: BLE001 - subclassed models often cannot give a config
        return [(type(layer).__name__, [list(w.shape) for w in layer.weights]) for layer in model.layers]
    names = [model.name, *_layer_names(config)]
    positions = {}
    for name in names:
        positions.setdefault(name, f"layer_{len(positions)}")
    return _renamed(config, positions)


def _layer_names(value):
    """Names of every layer entry ({"class_name", "config": {"name"}}) in a Keras config, in order."""
    if isinstance(value, dict):
        inner = value.get("config")
        if "class_name" in value and isinstance(inner, dict) and isinstance(inner.get("name"), str):
            yield inner["name"]
        for item in value.values():
            yield from _layer_names(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _layer_names(item)


def _renamed(value, names: dict[str, str]):
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, dict):
        return {key: _renamed(item, names) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_renamed(item, names) for item in value]
    return value


def _walk_layers(model):
    for layer in getattr(model, "layers", []):
        yield layer
        if hasattr(layer, "layers"):
            yield from _walk_layers(layer)


def input_specs(model, sequence_length: int | None = None) -> list[InputSpec]:
    """The model's inputs; dimensions it leaves open (a variable sequence axis) at `sequence_length`.

    Without a `sequence_length`, an open dimension is a UsageError naming --seq-lens.
    """
    vocabulary = next(
        (int(layer.input_dim) for layer in _walk_layers(model) if type(layer).__name__ == "Embedding"), None
    )
    specs = []
    for tensor in model.inputs:
        declared = tuple(None if dim is None else int(dim) for dim in tensor.shape[1:])
        if None in declared and sequence_length is None:
            raise UsageError(
                f"model input {getattr(tensor, 'name', '?')!r} has shape {tuple(tensor.shape)}: a variable sequence "
                "axis is probed per length (--seq-lens 64,128,256), or build the model with a concrete input shape"
            )
        shape = tuple(sequence_length if dim is None else dim for dim in declared)
        dtype = tensor.dtype if isinstance(tensor.dtype, str) else tensor.dtype.name
        specs.append(InputSpec(shape, dtype, vocabulary if dtype.startswith("int") else None,
                               declared if None in declared else None))
    return specs


def target_spec(model) -> TargetSpec:
    if len(model.outputs) != 1:
        raise UsageError(f"model has {len(model.outputs)} outputs: the probe supports single-output models")
    shape = tuple(int(d) for d in model.outputs[0].shape[1:])
    last = model.layers[-1]
    # TFMOT wraps layers (QuantizeWrapper, PruneLowMagnitude) and QAT wraps their activations
    # (QuantizeAwareActivation): the activation is the one inside.
    last = getattr(last, "layer", last)
    activation = getattr(last, "activation", None)
    activation = getattr(activation, "activation", activation)
    activation = getattr(activation, "__name__", "linear")
    width = shape[-1] if shape else 1
    if width > 1 and len(shape) == 1:
        return TargetSpec("classification", (), width, from_logits=activation != "softmax")
    if width == 1 and activation == "sigmoid":
        return TargetSpec("binary", shape, None, from_logits=False)
    return TargetSpec("regression", shape, None, from_logits=False)


def computes_in_float16(model) -> bool:
    """Whether any layer of `model` runs under the mixed_float16 policy."""
    from edgebatch.models.layers import all_layers

    return any(getattr(getattr(layer, "dtype_policy", None), "name", None) == "mixed_float16"
               for layer in all_layers(model))


def loss_scale_optimizer(keras_module, optimizer):
    """`optimizer` in its Keras world's dynamic loss-scale wrapper."""
    if keras_module.__name__ == "tf_keras":
        return keras_module.mixed_precision.LossScaleOptimizer(optimizer)
    return keras_module.optimizers.LossScaleOptimizer(optimizer)


def make_optimizer(keras_module, name: str):
    if name == "adam":
        return keras_module.optimizers.Adam(learning_rate=1e-3)
    if name == "sgd":
        return keras_module.optimizers.SGD(learning_rate=1e-2)
    raise UsageError(f"unknown optimizer {name!r}: choose adam or sgd")


def make_loss(keras_module, target: TargetSpec):
    losses = keras_module.losses
    if target.kind == "classification":
        return losses.SparseCategoricalCrossentropy(from_logits=target.from_logits)
    if target.kind == "binary":
        return losses.BinaryCrossentropy(from_logits=target.from_logits)
    return losses.MeanSquaredError()
