"""Turn on TensorFlow's GPU memory growth, the one setting edgebatch's GPU readings depend on.

Without memory growth TensorFlow reserves nearly all GPU memory at start-up, so NVML reports a
full GPU whatever the batch size, and other processes on the GPU are starved. Growth can only be
set before TensorFlow initialises the GPUs, which any op or model build does
(docs/tensorflow-memory.md#gpu-memory-growth).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["enable_memory_growth"]

# TensorFlow's RuntimeError text when the GPUs are already initialised (TF 2.x, context.py).
_ALREADY_INITIALISED = "cannot be modified after being initialized"

_FIX = (
    "Fix: call edgebatch.sensors.enable_memory_growth() right after importing TensorFlow, before "
    "building any model or running any TensorFlow op, or set TF_FORCE_GPU_ALLOW_GROWTH=true in the "
    "environment before Python starts."
)


def enable_memory_growth(*, tf_config: Any = None) -> list[str]:
    """set_memory_growth(True) on every physical GPU; returns the names configured ('GPU:0', ...).

    No GPUs: [] silently. GPUs already initialised by TensorFlow: a warning that names the fix, and
    [] (unless growth was already on for all of them, which is what was wanted). `tf_config` is
    `tf.config` by default; tests pass a fake.
    """
    if tf_config is None:
        import tensorflow as tf

        tf_config = tf.config
    gpus = list(tf_config.list_physical_devices("GPU"))
    names = [_short_name(gpu.name) for gpu in gpus]
    configured = []
    for gpu, name in zip(gpus, names):
        try:
            tf_config.experimental.set_memory_growth(gpu, True)
        except ValueError as exc:
            if "virtual devices" not in str(exc):
                raise
            # The user split this GPU into logical devices with fixed memory limits: those limits
            # already bound TensorFlow's reservation, and growth cannot be combined with them.
            warnings.warn(
                f"edgebatch: memory growth not set on {name}: {exc}; its logical devices' "
                f"memory_limit applies instead",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        except RuntimeError as exc:
            if _ALREADY_INITIALISED not in str(exc).lower():
                raise
            if _growth_already_on(tf_config, gpus):
                return names
            warnings.warn(
                f"edgebatch could not enable GPU memory growth on {', '.join(names)}: TensorFlow has "
                f"already initialised the GPUs ({exc}). TensorFlow will reserve nearly all GPU memory, "
                f"so GPU memory readings and probes see a full GPU. {_FIX}",
                RuntimeWarning,
                stacklevel=2,
            )
            return []
        configured.append(name)
    return configured


def _growth_already_on(tf_config: Any, gpus: list[Any]) -> bool:
    """Growth set by an earlier call, or forced for the whole process through the environment."""
    if os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").strip().lower() == "true":
        return True
    try:
        return all(tf_config.experimental.get_memory_growth(gpu) for gpu in gpus)
    except (RuntimeError, ValueError):
        return False


def _short_name(physical_name: str) -> str:
    """'/physical_device:GPU:0' -> 'GPU:0'."""
    return physical_name.rsplit("physical_device:", 1)[-1]
