"""Variable-length examples in fit: kept unpadded, sorted by length within an update, padded per piece.

A dataset whose examples have a variable axis (element spec TensorSpec([None], ...) for a token
sequence) is read with `ragged_batch` into per-example arrays (`ragged_rows`). Before an update is
split its examples are put in order of length (`length_order`, stable), and each piece is padded
with zeros only to its own longest example (`pad_rows`). The update's gradient is unchanged as long
as the model ignores padded positions (pad_rows says why). Numpy only.

With fit's `length_ceilings` the pieces follow the lengths (length_ceilings.py), and with
`batch_unit="tokens"` an update takes examples until their lengths (`example_lengths`) reach the
effective batch (data.ExampleBuffer.take_tokens). With `length_window_examples` updates are cut from
length-sorted windows of the stream, so whole updates hold examples of similar length (length_window.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["example_lengths", "is_variable", "length_order", "pad_rows", "ragged_rows"]


def is_variable(spec: Any) -> bool:
    """Whether an (unbatched) example component has an axis of unknown length."""
    return spec.shape.rank is None or any(dim is None for dim in spec.shape)


def ragged_rows(flat_values: np.ndarray, row_splits: np.ndarray) -> np.ndarray:
    """A ragged batch (values and row splits) as an object array of one array per example."""
    rows = np.empty(len(row_splits) - 1, dtype=object)
    for i, (start, end) in enumerate(zip(row_splits[:-1], row_splits[1:])):
        rows[i] = flat_values[start:end]
    return rows


def pad_rows(rows: np.ndarray) -> np.ndarray:
    """Examples of different lengths (axis 0) stacked, zero-padded to the longest of them.

    The update's gradient is a sum over its examples, so sorting it does not change it (beyond
    float rounding), and neither does this padding as long as the model ignores padded positions:
    token id 0 masked, as in the zoo's transformer_tiny and lstm_small, whose logits move by under
    1e-5 with padding (tests/test_text_models.py). A model that reads its padding is the caller's to
    fix. The loss is the mean over examples, each example's loss the model's over its real tokens.
    """
    longest = max((len(row) for row in rows), default=0)
    first = rows[0] if len(rows) else np.zeros(0)
    padded = np.zeros((len(rows), longest, *np.shape(first)[1:]), dtype=np.asarray(first).dtype)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    return padded


def example_lengths(flat_arrays: list[np.ndarray]) -> list[int] | None:
    """Each example's length (of the first variable component, as `length_order` sorts by), or None
    when no component is variable-length."""
    for array in flat_arrays:
        if array.dtype == object:
            return [len(row) for row in array]
    return None


def length_order(flat_arrays: list[np.ndarray]) -> np.ndarray | None:
    """A stable permutation putting the examples in order of length (of the first variable
    component), or None when no component is variable-length."""
    for array in flat_arrays:
        if array.dtype == object:
            return np.argsort(np.fromiter((len(row) for row in array), dtype=np.int64, count=len(array)),
                              kind="stable")
    return None
