"""What a governed training run reports: one record per optimizer update, per OOM, and the whole run.

Plain frozen dataclasses (no TensorFlow) with `to_dict()` for JSON, TensorBoard and tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FitReport", "OomEvent", "Progress", "UpdateRecord"]


@dataclass(frozen=True)
class Progress:
    """Where training stands, at an update boundary: what a checkpoint stores to resume exactly.

    `epoch` is 0-based and counts completed epochs; `examples_in_epoch` examples of that epoch have
    been consumed (so resuming skips that many); `updates` and `examples_seen` count the whole run.
    """

    epoch: int = 0
    examples_in_epoch: int = 0
    updates: int = 0
    examples_seen: int = 0


@dataclass(frozen=True)
class OomEvent:
    """One micro-batch that ran out of memory (really, or injected) and what the governor did.

    `example_offset` is where the failed piece started within its update; `next_micro_batch` is the
    governor's size after the OOM (the retry size); `gave_up` is True when the governor could not
    shrink any further and training stopped.
    """

    update: int
    epoch: int
    micro_batch: int
    example_offset: int
    next_micro_batch: int
    injected: bool
    gave_up: bool
    message: str


@dataclass(frozen=True)
class UpdateRecord:
    """One optimizer update.

    `micro_batches`: the sizes that ran successfully, in order (they sum to `examples`; an OOM'd
    attempt is in `oom_events`, not here). `effective_batch` is what the governor asked for (in
    tokens with fit's batch_unit="tokens"); the update consumed `examples` (fewer only at the end of
    an epoch; with tokens, as many as it took to reach them). `loss` is the mean per-example
    loss over the update (regularization losses excluded). `pressure` is the memory reading taken
    after the update (None when the reader was rate-limited or absent). `changed`/`reason`/
    `next_micro_batch`/`next_effective_batch`/`lr_scale` describe the governor's decision made on
    this update's observation, which applies from the next update. With an adaptive batch (fit's
    `adapt=`) `effective_batch` and `lr_scale` are the adaptive policy's, `next_effective_batch`
    is its next one and `adapt` holds its decision and the statistics behind it
    (training/adaptive.py `AdaptiveBatch.record`: next_effective_batch, changed, reason, blocked,
    next_lr_scale, noise_scale_samples, cosine, mean_cosine, loss_change, plateau, hard_share,
    drift, schedule_lr_ratio, checked); None without one.
    """

    update: int
    epoch: int
    examples: int
    micro_batches: tuple[int, ...]
    effective_batch: int
    loss: float
    pressure: float | None
    seconds: float
    samples_per_second: float
    oom_events: int
    changed: bool
    reason: str
    next_micro_batch: int
    next_effective_batch: int
    lr_scale: float
    step_seconds: float = 0.0
    input_seconds: float = 0.0
    adapt: dict[str, Any] | None = None
    # With fit's length_ceilings: the longest example (tokens) of each piece in micro_batches.
    piece_lengths: tuple[int, ...] | None = None
    # Variable-length examples: the update's real (unpadded) tokens; None for fixed-length ones.
    tokens: int | None = None
    # With fit's length_ceilings: the seconds of each piece in micro_batches.
    piece_seconds: tuple[float, ...] | None = None

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches that contributed to this update."""
        return len(self.micro_batches)

    @property
    def largest_micro_batch(self) -> int:
        """The real batch size the device ran (what memory depends on)."""
        return max(self.micro_batches, default=0)  # 0: a worker with no share of this update

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["micro_batches"] = list(self.micro_batches)
        data["piece_lengths"] = None if self.piece_lengths is None else list(self.piece_lengths)
        data["piece_seconds"] = None if self.piece_seconds is None else list(self.piece_seconds)
        data["adapt"] = None if self.adapt is None else dict(self.adapt)
        data["accumulation_steps"] = self.accumulation_steps
        return data


@dataclass
class FitReport:
    """The history of one `fit` call (a resumed call reports only its own updates).

    `resumed_from` is the Progress restored from a checkpoint (None for a fresh start);
    `examples_seen` counts the examples this call trained on; `decisions` are the governor's
    history entries (changes, OOM shrinks) made during this call; `traces` counts how often each
    tf.function was traced (1 each when changing the micro-batch did not retrace); `checkpoints`
    lists the checkpoint paths written; `stopped_by_max_updates` is True when `max_updates` ended
    the run before `epochs` did; `stopped_by_callback` is True when a callback set
    `model.stop_training`.

    Exactness. `exactness` is "exact" when every update's gradient equals one over the whole
    effective batch whatever the micro-batch split; "micro_batch_statistics" when the model has
    BatchNormalization layers (`batch_norm_layers`, their names): those normalize each micro-batch
    by its own statistics, so an update then equals the plain loop only when the micro-batch is the
    whole effective batch; "random_draws_per_micro_batch" when it has no BatchNormalization but
    layers that draw random numbers in training (`random_layers`: Dropout, random augmentation):
    each micro-step draws its own masks, so an update is an equally distributed draw, not the plain
    loop's bit for bit. `batch_norm` is the fit option that applied ("allow" or
    "fixed_micro_batch"). `unbatched_input` is True when fit unbatched a batched dataset.
    `replicas` is the MirroredStrategy's replica count (1 without a strategy); with more than one,
    micro-batch sizes (UpdateRecord.micro_batches, OomEvent.micro_batch) are global: each replica
    ran an even share of them, except under MultiWorkerMirroredStrategy, where `replicas` counts
    the workers and the sizes are this worker's own pieces of its share (`examples` and `loss`
    stay the whole update's). `adapt_changes` lists the adaptive policy's changes of the effective
    batch during this call ({"update", "effective_batch", "reason", "lr_scale"}; empty without adapt).
    `pruning_step` is a TFMOT-pruned model's pruning step when fit returned (None for other
    models): it advances once per optimizer update (training/pruning.py). `piece_cost` is the
    PieceCost fit cut updates by when it returned, with length ceilings that had one: refitted from
    the pieces' own times once enough were timed (piece_cost.PieceTimes); None otherwise.
    """

    updates: list[UpdateRecord] = field(default_factory=list)
    examples_seen: int = 0
    oom_events: list[OomEvent] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    traces: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    epochs_completed: int = 0
    resumed_from: Progress | None = None
    final_progress: Progress = field(default_factory=Progress)
    checkpoints: list[str] = field(default_factory=list)
    stopped_by_max_updates: bool = False
    stopped_by_callback: bool = False
    exactness: str = "exact"
    batch_norm_layers: list[str] = field(default_factory=list)
    random_layers: list[str] = field(default_factory=list)
    batch_norm: str = "allow"
    unbatched_input: bool = False
    replicas: int = 1
    adapt_changes: list[dict[str, Any]] = field(default_factory=list)
    pruning_step: int | None = None
    piece_cost: Any = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy of the report."""
        return {
            "updates": [record.to_dict() for record in self.updates],
            "examples_seen": self.examples_seen,
            "oom_events": [asdict(event) for event in self.oom_events],
            "decisions": [dict(entry) for entry in self.decisions],
            "traces": dict(self.traces),
            "seconds": self.seconds,
            "epochs_completed": self.epochs_completed,
            "resumed_from": None if self.resumed_from is None else asdict(self.resumed_from),
            "final_progress": asdict(self.final_progress),
            "checkpoints": list(self.checkpoints),
            "stopped_by_max_updates": self.stopped_by_max_updates,
            "stopped_by_callback": self.stopped_by_callback,
            "exactness": self.exactness,
            "batch_norm_layers": list(self.batch_norm_layers),
            "random_layers": list(self.random_layers),
            "batch_norm": self.batch_norm,
            "unbatched_input": self.unbatched_input,
            "replicas": self.replicas,
            "adapt_changes": [dict(change) for change in self.adapt_changes],
            "pruning_step": self.pruning_step,
            "piece_cost": None if self.piece_cost is None else asdict(self.piece_cost),
        }
