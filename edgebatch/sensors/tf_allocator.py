"""TensorFlow's own allocator statistics for one device (CPU:0 works too).

See docs/tensorflow-memory.md#allocator-statistics.

TensorFlow is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AllocatorMemory", "read_allocator", "reset_allocator_peak"]


@dataclass(frozen=True)
class AllocatorMemory:
    """Bytes TensorFlow's allocator on `device` holds now, and the most it held since the last reset."""

    device: str
    current_bytes: int
    peak_bytes: int


def read_allocator(device: str = "CPU:0") -> AllocatorMemory | None:
    """The allocator's current and peak bytes on `device` ('CPU:0', 'GPU:1', '/device:GPU:0').

    None when TensorFlow refuses: no such device, or CPU with oneDNN off (TF_ENABLE_ONEDNN_OPTS=0
    makes get_memory_info('CPU:0') raise ValueError: docs/tensorflow-memory.md#allocator-statistics).
    """
    import tensorflow as tf

    try:
        info = tf.config.experimental.get_memory_info(device)
    except ValueError:
        return None
    return AllocatorMemory(device=device, current_bytes=int(info["current"]), peak_bytes=int(info["peak"]))


def reset_allocator_peak(device: str = "CPU:0") -> bool:
    """Set the allocator's peak on `device` back to its current bytes; False when TensorFlow refuses."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
    except ValueError:
        return False
    return True
