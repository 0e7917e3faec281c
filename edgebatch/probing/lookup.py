"""`edgebatch.cached_profile(model)`: the profile `edgebatch probe` cached for a model on this device.

Training code that already holds the model (and so has TensorFlow loaded) looks its profile up
without probing: the same device fingerprint and model key the probe computes, from the model
in this process. Returns None when no profile was cached, so a caller can fall back to a probe or
to a fixed batch.
"""

from __future__ import annotations

from pathlib import Path

from edgebatch.errors import UsageError
from edgebatch.probing.budget import default_device, device_facts
from edgebatch.profiles import DeviceProfile, find_profile, model_key, resolve_profiles_dir
from edgebatch.profiles.fingerprint import config_hash
from edgebatch.models.zoo import (
    OPTIMIZATIONS,
    OPTIMIZERS,
    PRECISIONS,
    SEQUENCE_MODEL_MAX_LENGTHS,
    build_base_model,
    parse_model_spec,
)


def cached_profile(
    model,
    *,
    device: str | None = None,
    precision: str = "float32",
    optimizer: str = "adam",
    optimize: str = "none",
    profiles_dir: str | Path | None = None,
    seq_lens: str | tuple[int, ...] | None = None,
) -> DeviceProfile | None:
    """The cached DeviceProfile for `model` on `device` (default: the probe's default), or None.

    `model` is a Keras model object (Keras 3 or tf_keras) or what `edgebatch probe` takes: a
    built-in name, "FILE.py:FUNCTION" or a ".keras" path (built here to compute its key).
    `precision`, `optimizer` and `optimize` must be the ones the profile was probed with. For
    `optimize` "qat" or "prune", give the model as the probe was given it, before TFMOT wrapped it
    (a tf_keras model; a name or file is built with tf_keras, as the probe builds it): the key
    names the model by its unwrapped architecture. This does not import TFMOT.
    A model with a variable sequence axis was probed per length: `seq_lens` are those lengths
    (default for transformer_tiny and lstm_small, by name or as built by the zoo: the probe's
    default ladder); for any other such model without `seq_lens` this is a UsageError.

    Args:
        model: a Keras model object, or what `edgebatch probe` takes (a name, FILE.py:FUNCTION, .keras).
        device: "CPU:0" or "GPU:N"; default: GPU:0 where NVML sees one, else CPU:0.
        precision, optimizer, optimize: the probe's settings of those names.
        profiles_dir: where to look (default $EDGEBATCH_PROFILES or ./device_profiles).
        seq_lens: the lengths a per-length probe used ("64,128,256" or ints).

    Returns:
        The cached DeviceProfile at its own budget, or None when none is cached.

    Raises:
        UsageError: an unknown precision, optimizer or optimize, or a variable-length model
            without `seq_lens`.
        ProfileError: the cached file is unreadable or invalid.
    """
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if optimize not in OPTIMIZATIONS:
        raise UsageError(f"unknown optimize {optimize!r}: choose one of {', '.join(OPTIMIZATIONS)}")
    import tensorflow as tf

    from edgebatch.probing import token_fit
    from edgebatch.probing.trial import architecture_description, input_specs

    lengths = token_fit.parse_seq_lens(seq_lens)
    if isinstance(model, str):
        spec = parse_model_spec(model)
        model = _build_keeping_dtype_policy(spec, precision, optimize)
        # The probe names built-ins by their name, everything else by the model's own name.
        name = spec.name if spec.kind == "builtin" else model.name
    else:
        name = model.name
    facts = device_facts((device or default_device()).upper())
    fingerprint = facts.fingerprint
    specs = input_specs(model, sequence_length=1)  # any length: only the declared shapes are read
    if not any(spec.variable for spec in specs):
        lengths = None
    elif lengths is None and name in SEQUENCE_MODEL_MAX_LENGTHS:
        lengths = token_fit.default_lengths(SEQUENCE_MODEL_MAX_LENGTHS[name])
    elif lengths is None:
        raise UsageError(
            f"model {name!r} has a variable sequence axis and was probed per length: pass seq_lens= (the --seq-lens it "
            "was probed with)"
        )
    inputs = [{"shape": list(spec.declared_shape or spec.shape), "dtype": spec.dtype} for spec in specs]
    key = model_key(name, config_hash(architecture_description(model)), inputs, precision, optimizer, tf.__version__,
                    optimize=optimize, seq_lens=lengths)
    return find_profile(resolve_profiles_dir(profiles_dir), fingerprint, key)


def _build_keeping_dtype_policy(spec, precision: str, optimize: str = "none"):
    """The model the probe keys (before any TFMOT wrapping). Building it sets the global dtype
    policy of Keras (and of tf_keras when optimising); the caller's training code keeps its own."""
    import keras

    policy = keras.mixed_precision.global_policy()
    legacy_policy = None
    if optimize != "none":
        import tf_keras

        legacy_policy = tf_keras.mixed_precision.global_policy()
    try:
        return build_base_model(spec, precision, optimize)
    finally:
        keras.mixed_precision.set_global_policy(policy)
        if legacy_policy is not None:
            tf_keras.mixed_precision.set_global_policy(legacy_policy)
