"""fit's adaptive batch (`fit(..., adapt=AdaptConfig(...))`): the glue between the training loop and
edgebatch.adapt's pure controller.

Per optimizer update the loop asks `AdaptiveBatch` for the effective batch (examples to take),
the micro-batch to split them with (the memory governor's, and small enough for at least
config.min_pieces_per_update pieces) and the learning-rate multiplier; after the pieces ran it
hands over what the steps measured (steps.OneDeviceSteps._update_statistics), and `observe`
turns them into one `UpdateMeasurement` for the controller, with one host read of a few scalars.

The effective batch is counted in examples. A piece's gradient in the accumulators is its share of
the update's objective, sum(piece losses) / update_examples (+ regularization x share), so its own
mean gradient's squared norm is scaled by (update_examples / piece_examples)^2. Regularization
losses are part of every gradient here (the controller sees the gradient the optimizer applies);
the per-example losses for drift and plateau leave them out, as UpdateRecord.loss does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgebatch.adapt.controller import AdaptController, AdaptReading, UpdateMeasurement
from edgebatch.adapt.policy import AdaptConfig, AdaptDecision
from edgebatch.errors import UsageError
from edgebatch.training.loop_parts import Measured

__all__ = ["AdaptiveBatch", "check_adapt"]


def check_adapt(adapt: Any, governor_config: Any, replicas: int, batch_norm: str = "allow") -> None:
    """UsageError for an adapt setting fit cannot run."""
    if not isinstance(adapt, AdaptConfig):
        raise UsageError(f"adapt must be an edgebatch.adapt.AdaptConfig, got {adapt!r}")
    if batch_norm == "fixed_micro_batch":
        raise UsageError(
            "adapt=... moves the effective batch, and with it the micro-batch: batch_norm='fixed_micro_batch' "
            "cannot hold; use batch_norm='allow' (or no adapt)"
        )
    if replicas > 1:
        raise UsageError("adapt=... is not supported under MirroredStrategy yet: train on one device, or drop adapt")
    if governor_config.mode != "fixed":
        raise UsageError(
            f"adapt=... sets the effective batch and its learning rate itself: give a governor in mode='fixed' "
            f"(got mode={governor_config.mode!r})"
        )


def scheduled_rate(optimizer: Any, schedule: Any) -> float | None:
    """The schedule's own (unscaled) rate at the optimizer's current step; None without a schedule."""
    from edgebatch.adapt.scaled_schedule import is_schedule

    if schedule is None:
        rate = getattr(optimizer, "_learning_rate", None)
        schedule = rate if is_schedule(rate) else None
    if schedule is None:
        return None
    return float(np.asarray(schedule(optimizer.iterations)))


class AdaptiveBatch:
    """One run's controller plus what the loop needs to drive it (module docstring)."""

    def __init__(self, config: AdaptConfig, start_effective_batch_samples: int) -> None:
        self.controller = AdaptController(config, start_effective_batch_samples)
        self.changes: list[dict[str, Any]] = []

    @property
    def effective_batch_samples(self) -> int:
        return self.controller.effective_batch_samples

    def split_micro_batch(self, memory_micro_batch_samples: int) -> int:
        return self.controller.split_micro_batch(memory_micro_batch_samples)

    def pieces_bound_samples(self) -> int:
        return self.controller.pieces_bound_samples()

    def lr_scale(self) -> float:
        return self.controller.lr_scale()

    def observe(
        self, *, update: int, examples: int, sizes: list[int], measured: Measured, loss_mean: float,
        schedule_rate: float | None, memory_micro_batch_samples: int,
        times: tuple[tuple[float, ...], float] | None = None,
    ) -> tuple[AdaptDecision, AdaptReading]:
        """Turn one update's tensors (`measured`: what the steps measured) into a measurement and let
        the controller decide. `times`: the pieces' seconds and the update's (None: not timed)."""
        import tensorflow as tf

        per_example = measured.per_example
        current_sq, dot, previous_sq = (float(v) for v in measured.update_statistics)
        raw = np.asarray([float(v) for v in measured.piece_sq_norms], dtype=np.float64)
        piece_sq = raw * (examples / np.asarray(sizes, dtype=np.float64)) ** 2
        cosine = None
        if current_sq > 0 and previous_sq > 0:
            cosine = max(-1.0, min(1.0, dot / math.sqrt(current_sq * previous_sq)))
        losses = tf.concat(per_example, axis=0).numpy() if per_example else None
        measurement = UpdateMeasurement(
            micro_batch_samples=tuple(sizes), micro_sq_norms=tuple(float(v) for v in piece_sq),
            update_sq_norm=current_sq, cosine_previous=cosine, loss=loss_mean,
            per_example_losses=losses, schedule_rate=schedule_rate,
            piece_seconds=None if times is None else tuple(times[0]), update_seconds=None if times is None else times[1],
        )
        decision, reading = self.controller.observe(measurement, memory_micro_batch_samples)
        if decision.changed:
            self.changes.append({"update": update, "effective_batch": decision.effective_batch_samples,
                                 "reason": decision.reason, "lr_scale": decision.lr_scale})
        return decision, reading

    @staticmethod
    def scheduled_rate(optimizer: Any, schedule: Any) -> float | None:
        return scheduled_rate(optimizer, schedule)

    @staticmethod
    def record(decision: AdaptDecision, reading: AdaptReading) -> dict[str, Any]:
        """UpdateRecord.adapt: the decision for the next update and the statistics behind it."""
        return {
            "next_effective_batch": decision.effective_batch_samples,
            "changed": decision.changed,
            "reason": decision.reason,
            "blocked": decision.blocked,
            "next_lr_scale": decision.lr_scale,
            **reading.to_dict(),
        }
