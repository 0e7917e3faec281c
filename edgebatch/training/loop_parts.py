"""The records a governed loop (governed_loop.py) is built from, and those that carry one optimizer
update through its steps: take -> accumulate -> observe -> record. Plain dataclasses; no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Control", "Measured", "Observed", "Ran", "Schedule", "Taken", "Trainee"]


@dataclass(frozen=True)
class Trainee:
    """What the loop trains: the model, its examples (an unbatched tf.data.Dataset and its element
    spec), the loss and optimizer, and the tf.distribute strategy (None on one device)."""

    model: Any
    dataset: Any
    element_spec: Any
    loss: Any
    optimizer: Any
    strategy: Any = None


@dataclass(frozen=True)
class Control:
    """Who sizes the updates: the governor and the pressure reader it is fed from; with
    `fixed_micro_batch` (batch_norm="fixed_micro_batch") only an OOM moves its micro-batch;
    `adaptive`: the adaptive batch (adaptive.AdaptiveBatch) or None."""

    governor: Any
    pressure_reader: Any = None
    fixed_micro_batch: bool = False
    adaptive: Any = None


@dataclass(frozen=True)
class Schedule:
    """How long the loop runs and whom it tells: `epochs`, `max_updates` (None: no limit), the
    observability.RunLog, `on_update(record)` and Keras callbacks (a CallbackList or None)."""

    epochs: int
    run_log: Any
    max_updates: int | None = None
    on_update: Callable[[Any], None] | None = None
    callbacks: Any = None


@dataclass(frozen=True)
class Taken:
    """Step 1, take: the update's examples (flat arrays, by length), how many, how many were wanted
    (examples, or tokens), the learning-rate scale, real tokens (variable length) and input wait."""

    flat_examples: list
    examples: int
    wanted: int
    lr_scale: float
    tokens: int | None
    input_seconds: float


@dataclass(frozen=True)
class Measured:
    """What the steps measured with gradient statistics on (fit's adapt): each piece's squared
    gradient norm and per-example losses, and update_statistics()'s three scalars."""

    piece_sq_norms: list
    per_example: list
    update_statistics: Any


@dataclass(frozen=True)
class Ran:
    """Step 2, accumulate: the sizes of the pieces that ran, the OOM events, what workers exchanged
    (None on one process), the update's mean loss, its step seconds and, with adapt, Measured."""

    sizes: list[int]
    ooms: list
    shared: Any
    loss_mean: float
    step_seconds: float
    measured: Measured | None


@dataclass(frozen=True)
class Observed:
    """Step 3, observe: the pressure read, the governor's decision after the update, and adapt's
    record for UpdateRecord.adapt (None without adapt)."""

    pressure: float | None
    after: Any
    adapt: dict[str, Any] | None
