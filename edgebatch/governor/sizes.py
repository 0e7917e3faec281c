"""Micro-batch size arithmetic shared by the governor policy: legal sizes, accumulation, splitting.

Pure integer arithmetic, no imports beyond the standard library. A size is *legal* for a
`multiple` m when it is below m (any size) or a whole multiple of m: with m replicas a global batch
must divide evenly across them (MirroredStrategy refuses 33 over 2 replicas, see
docs/tensorflow-memory.md#tfdistribute-on-cpu), while sizes below m are left to the caller (usually
min_batch is set to m so they never occur).
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "accumulation_steps_for",
    "is_legal_size",
    "legal_above",
    "legal_at_least",
    "legal_at_most",
    "legal_below",
    "split_micro_batches",
]


def is_legal_size(size: int, multiple: int) -> bool:
    """True when `size` is below `multiple` or a whole multiple of it."""
    return size < multiple or size % multiple == 0


def legal_at_most(size: int, multiple: int) -> int:
    """The largest legal size <= `size` (rounds down to a multiple once `size` >= `multiple`)."""
    return size if size < multiple else size - size % multiple


def legal_at_least(size: int, multiple: int) -> int:
    """The smallest legal size >= `size` (rounds up to a multiple once `size` > `multiple`)."""
    return size if size <= multiple else math.ceil(size / multiple) * multiple


def legal_above(size: int, multiple: int) -> int:
    """The next legal size strictly above `size`."""
    return legal_at_least(size + 1, multiple)


def legal_below(size: int, multiple: int) -> int:
    """The next legal size strictly below `size` (may be 0 when `size` is 1)."""
    return legal_at_most(size - 1, multiple)


def accumulation_steps_for(total_examples: int, micro_batch: int) -> int:
    """Micro-batches needed to cover `total_examples`: ceil(total / micro_batch)."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch!r}")
    return -(-total_examples // micro_batch)


def split_micro_batches(total_examples: int, micro_batch: int) -> list[int]:
    """Sizes of the micro-batches that make one update of `total_examples` examples.

    `[micro_batch] * k + [rest]`: full micro-batches first, then the remainder (if any), so the
    sizes sum exactly to `total_examples`, each is <= `micro_batch`, and there are
    ceil(total / micro_batch) of them (= Decision.accumulation_steps). Not balanced on purpose:
    every micro-batch but the last has the size the governor chose (and the tf.function traced),
    and only the last may differ. Weight each micro-batch's mean loss by its size / total so the
    update equals one over the whole batch. With replicas, the remainder is a multiple of the
    replica count only when `total_examples` is.

    >>> split_micro_batches(100, 32)
    [32, 32, 32, 4]
    """
    for name, value, minimum in (("total_examples", total_examples, 0), ("micro_batch", micro_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    full, rest = divmod(int(total_examples), int(micro_batch))
    micro_batch = int(micro_batch)
    return [micro_batch] * full + ([rest] if rest else [])
