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

import warnings
from dataclasses import dataclass
from typing import Any

from edgebatch.errors import UsageError

__all__ = ["Checkpointing", "Logs", "Sequences", "moved_keywords"]


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


# fit's keywords that moved into a record: old keyword -> (fit's record keyword, the record's field).
MOVED_KEYWORDS = {
    "checkpoint_dir": ("checkpointing", "dir"),
    "checkpoint_every_updates": ("checkpointing", "every_updates"),
    "max_checkpoints_to_keep": ("checkpointing", "max_to_keep"),
    "length_ceilings": ("sequences", "length_ceilings"),
    "batch_unit": ("sequences", "batch_unit"),
    "length_window_examples": ("sequences", "length_window_examples"),
    "log_dir": ("logs", "log_dir"),
    "decision_log": ("logs", "decision_log"),
}
_RECORDS = {"checkpointing": Checkpointing, "sequences": Sequences, "logs": Logs}

# The old keywords already warned about in this process (each warns once).
_warned: set[str] = set()


def moved_keywords(old: dict[str, Any], checkpointing: Any, sequences: Any, logs: Any,
                   calls_below_fit: int = 0) -> tuple[Any, Any, Any]:
    """(checkpointing, sequences, logs) with fit's old keywords in `old` moved into them.

    Each old keyword warns once per process (DeprecationWarning, at fit's caller: `calls_below_fit`
    says how many calls lie between fit and this one). TypeError for a
    keyword fit never took (as Python raises it); UsageError for a record given both ways, and for
    checkpoint_every_updates without a checkpoint_dir. max_checkpoints_to_keep without a
    checkpoint_dir is ignored, as it was.
    """
    records = {"checkpointing": checkpointing, "sequences": sequences, "logs": logs}
    fields: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        if name not in MOVED_KEYWORDS:
            raise TypeError(f"fit() got an unexpected keyword argument {name!r}")
        record, field = MOVED_KEYWORDS[name]
        if records[record] is not None:
            raise UsageError(f"give {record}={_RECORDS[record].__name__}(...) or {name}=..., not both")
        if name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"fit's {name}= is deprecated: pass {record}={_RECORDS[record].__name__}({field}=...) "
                "(edgebatch.training.options)", DeprecationWarning, stacklevel=3 + calls_below_fit,
            )
        fields.setdefault(record, {})[field] = value
    for record, given in fields.items():
        if record == "checkpointing" and given.get("dir") is None:
            if given.get("every_updates") is not None:
                raise UsageError(f"checkpoint_every_updates={given['every_updates']!r} needs a checkpoint_dir")
            continue  # no directory: no checkpoints, as before
        records[record] = _RECORDS[record](**given)
    return records["checkpointing"], records["sequences"], records["logs"]
