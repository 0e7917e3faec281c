"""fit's checks of its `sequences` record: which fields apply to the examples and settings given.

Variable-length examples only (an input of shape (None,)); some fields not yet with adapt or a
tf.distribute strategy. Each check raises a one-line UsageError naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from edgebatch.errors import UsageError
from edgebatch.training.options import Sequences


def _refuse_unless_variable_length(option: str, element_spec: Any, strategy: Any, instead: str, *,
                                   adapt: Any = None) -> None:
    """UsageError when `option` meets fixed-length examples, a strategy, or `adapt` where the caller
    passes it (the options not supported with it yet)."""
    import tensorflow as tf

    from edgebatch.training.sequences import is_variable

    if not any(is_variable(leaf) for leaf in tf.nest.flatten(element_spec[0])):
        raise UsageError(f"{option} applies to examples of variable length (an input of shape (None,)); "
                         f"these examples have fixed shapes: {instead}")
    if adapt is not None or strategy is not None:
        which = "adapt" if adapt is not None else "a tf.distribute strategy"
        raise UsageError(f"{option} cannot be combined with {which} yet: {instead}")


def check_sequences(sequences: Sequences, effective_batch: int, element_spec: Any, adapt: Any,
                     strategy: Any) -> Sequences:
    """`sequences` with its length_ceilings as a LengthCeilings; UsageError where a field cannot apply."""
    ceilings = _check_length_ceilings(sequences.length_ceilings, element_spec, strategy)
    _check_batch_unit(sequences.batch_unit, element_spec, adapt, strategy)
    _check_length_window(sequences.length_window_examples, effective_batch, sequences.batch_unit, element_spec,
                         adapt, strategy)
    return dataclasses.replace(sequences, length_ceilings=ceilings)


def _check_length_ceilings(length_ceilings: Any, element_spec: Any, strategy: Any) -> Any:
    """fit's `length_ceilings` as a LengthCeilings (None stays None); UsageError where it cannot apply
    (fixed-length examples, a strategy; adapt is fine)."""
    if length_ceilings is None:
        return None
    from edgebatch.training.length_ceilings import LengthCeilings

    if isinstance(length_ceilings, dict):
        length_ceilings = LengthCeilings.from_mapping(length_ceilings)
    elif not isinstance(length_ceilings, LengthCeilings):
        if not hasattr(length_ceilings, "per_length"):
            raise UsageError(
                f"length_ceilings must be a LengthCeilings, a DeviceProfile of a probe per length, or "
                f"{{tokens: ceiling}}, got {type(length_ceilings).__name__}"
            )
        length_ceilings = LengthCeilings.from_profile(length_ceilings)
    _refuse_unless_variable_length("length_ceilings", element_spec, strategy, "leave length_ceilings out")
    return length_ceilings


BATCH_UNITS = ("examples", "tokens")


def _check_batch_unit(batch_unit: Any, element_spec: Any, adapt: Any, strategy: Any) -> None:
    """UsageError for a batch_unit fit cannot count in (module docstring of sequences.py)."""
    if batch_unit not in BATCH_UNITS:
        raise UsageError(f"batch_unit must be one of {', '.join(BATCH_UNITS)}, got {batch_unit!r}")
    if batch_unit == "tokens":
        _refuse_unless_variable_length("batch_unit='tokens'", element_spec, strategy, "count in examples", adapt=adapt)


def _check_length_window(window: Any, effective_batch: int, batch_unit: str, element_spec: Any, adapt: Any,
                         strategy: Any) -> None:
    """UsageError for a length_window_examples fit cannot use (length_window.py)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UsageError(f"length_window_examples must be an integer >= 1 (examples per window), got {window!r}")
    _refuse_unless_variable_length("length_window_examples", element_spec, strategy,
                                   "leave length_window_examples out", adapt=adapt)
    if batch_unit == "examples" and window % effective_batch:
        raise UsageError(
            f"length_window_examples {window} is not a multiple of effective_batch {effective_batch}: a window is cut "
            f"into whole updates, e.g. length_window_examples={effective_batch * max(2, window // effective_batch)}"
        )
