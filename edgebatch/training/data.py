"""Feeding governed training: consecutive unbatched examples, taken one update at a time.

The loop asks for `effective_batch` examples per update; the governor may change that number
(elastic mode) and the micro-batch split at any update, so the dataset cannot be batched once up
front. Instead it is read in fixed-size chunks (`dataset.batch(chunk)`, far cheaper than one
Python iteration per example) into a buffer, and each update takes exactly the next N examples
from the buffer as numpy arrays, which are then sliced into micro-batches. Example order is the
dataset's order, so a run is reproducible and resumable by skipping consumed examples.
"""

from __future__ import annotations

from typing import Any

from edgebatch.errors import UsageError

__all__ = ["ExampleBuffer", "check_element_spec", "slice_examples"]


def check_element_spec(dataset: Any) -> Any:
    """The dataset's (x, y) element spec; UsageError when it is not unbatched (x, y) dense examples."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(f"dataset must be a tf.data.Dataset of unbatched (x, y) examples, got {dataset!r}")
    spec = dataset.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise UsageError(f"dataset elements must be (x, y) pairs, got element_spec {spec!r}")
    leaves = tf.nest.flatten(spec)
    for leaf in leaves:
        if not isinstance(leaf, tf.TensorSpec):
            raise UsageError(f"dataset components must be dense tensors, got {leaf!r} in element_spec {spec!r}")
    # A batched dataset's components all start with an unknown (batch) dimension; examples that
    # share one size cannot all have an unknown first axis unless they are variable-length, which
    # cannot be stacked either.
    if all(leaf.shape.rank and leaf.shape[0] is None for leaf in leaves):
        raise UsageError(
            f"dataset looks batched (every component starts with an unknown dimension: {spec!r}); "
            "fit batches examples itself: pass dataset.unbatch() or unbatched examples"
        )
    return spec


def slice_examples(structure: Any, flat_arrays: list[Any], start: int, size: int) -> Any:
    """Examples [start, start + size) of `flat_arrays`, packed like the dataset's element spec."""
    import tensorflow as tf

    return tf.nest.pack_sequence_as(structure, [array[start : start + size] for array in flat_arrays])


class ExampleBuffer:
    """Reads one epoch of `dataset` (after skipping `skip_examples`) in chunks; `take(n)` returns
    the next n examples as flat numpy arrays (fewer at the end of the epoch, None when it is over)."""

    def __init__(self, dataset: Any, skip_examples: int, chunk_examples: int) -> None:
        import tensorflow as tf

        if skip_examples:
            dataset = dataset.skip(skip_examples)
        self._iterator = iter(dataset.batch(chunk_examples).prefetch(tf.data.AUTOTUNE))
        self._chunks: list[list[Any]] = []
        self._buffered = 0
        self._ended = False

    def _read_chunk(self) -> bool:
        if self._ended:
            return False
        try:
            chunk = next(self._iterator)
        except StopIteration:
            self._ended = True
            return False
        import tensorflow as tf

        arrays = [tensor.numpy() for tensor in tf.nest.flatten(chunk)]
        self._chunks.append(arrays)
        self._buffered += len(arrays[0])
        return True

    def at_end(self) -> bool:
        """True when no example is left in this epoch (reads ahead one chunk to find out)."""
        return self._buffered == 0 and not self._read_chunk()

    def take(self, count: int) -> tuple[list[Any], int] | None:
        """(flat arrays of the next `count` examples or fewer, their number); None at the epoch end."""
        import numpy as np

        while self._buffered < count and self._read_chunk():
            pass
        if self._buffered == 0:
            return None
        if len(self._chunks) == 1:
            joined = self._chunks[0]
        else:
            joined = [np.concatenate(parts) for parts in zip(*self._chunks)]
        taken = min(count, self._buffered)
        rest = [array[taken:] for array in joined]
        self._buffered -= taken
        self._chunks = [rest] if self._buffered else []
        return [array[:taken] for array in joined], taken
