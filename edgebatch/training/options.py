"""fit's option records: the rarely used settings, grouped by what they are about.

    fit(model, dataset, effective_batch=64,
        checkpointing=Checkpointing(dir="ckpt", every_updates=100),
        sequences=Sequences(length_ceilings=profile, batch_unit="tokens"),
        logs=Logs(log_dir="tb", decision_log="decisions.jsonl"))

Each field is the keyword fit took before (checkpoint_dir, checkpoint_every_updates,
max_checkpoints_to_keep; length_ceilings, batch_unit, length_window_examples; log_dir,
decision_log): those keywords still work and warn once (DeprecationWarning). fit checks the values.
Plain frozen dataclasses; no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Checkpointing", "Logs", "Sequences"]


@dataclass(frozen=True)
class Checkpointing:
    """Resume from and save to `dir`: every `every_updates` updates (None: only at the end) and when
    training stops; `max_to_keep` checkpoints stay. The dataset must then yield the same order every
    epoch and in every process (a reshuffling or unseeded shuffle, or an unseeded random op in the
    pipeline, is refused). Not under MultiWorkerMirroredStrategy yet."""

    dir: str
    every_updates: int | None = None
    max_to_keep: int = 3


@dataclass(frozen=True)
class Sequences:
    """How fit cuts updates of variable-length examples (a token axis of unknown size); none of it
    applies to fixed-length examples or under a strategy (fit's docstring says what each does).

    `length_ceilings`: the micro-batch ceiling at each length (a LengthCeilings, a probe per length's
    DeviceProfile, or {tokens: ceiling}); `batch_unit`: "examples" or "tokens" (what fit's
    effective_batch counts); `length_window_examples`: read the epoch in length-sorted windows of
    this many examples."""

    length_ceilings: Any = None
    batch_unit: str = "examples"
    length_window_examples: int | None = None


@dataclass(frozen=True)
class Logs:
    """Where fit writes: TensorBoard scalars to `log_dir`, one JSON line per update to
    `decision_log` (observability.py)."""

    log_dir: str | None = None
    decision_log: str | None = None
