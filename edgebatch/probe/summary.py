"""What a finished search means: max, safe and knee batches. Pure: trials in, numbers out."""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgebatch.probe.memory_fit import fit_memory_model
from edgebatch.profiles.model import MemoryModel, Trial

# Throughput within 5% of the best counts as the plateau (the definition of the knee).
KNEE_FRACTION = 0.95


def fitting_trials(trials: Sequence[Trial], budget_bytes: float) -> list[Trial]:
    return [t for t in trials if t.ok and t.measured and t.peak_bytes is not None and t.peak_bytes <= budget_bytes]


def memory_model_of(trials: Sequence[Trial]) -> MemoryModel | None:
    """The line through every trial that ran (over-budget ones are real measurements too)."""
    return fit_memory_model([(t.batch, t.peak_bytes) for t in trials if t.ok and t.measured and t.peak_bytes is not None])


def max_batch_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    fits = fitting_trials(trials, budget_bytes)
    return max((t.batch for t in fits), default=None)


def safe_batch_of(
    trials: Sequence[Trial], budget_bytes: float, headroom: float, multiple: int, model: MemoryModel | None
) -> int | None:
    """Largest batch whose peak fits budget x (1 - headroom).

    A measured trial under the reduced budget is the first answer. When the memory model is known,
    the answer is also predicted from the largest measured fit, stepping down per_sample bytes per
    sample (anchored on a real reading rather than on the line's intercept); the larger of the two
    wins, and it never exceeds max_batch.
    """
    safe_budget = budget_bytes * (1 - headroom)
    measured = max_batch_of(trials, safe_budget)
    largest = max(fitting_trials(trials, budget_bytes), key=lambda t: t.batch, default=None)
    if largest is None:
        return None
    predicted = None
    if model is not None and model.per_sample_bytes > 0:
        excess = max(0.0, largest.peak_bytes - safe_budget)
        steps_down = math.ceil(excess / model.per_sample_bytes)
        predicted = (largest.batch - steps_down) // multiple * multiple
        predicted = predicted if predicted >= multiple else None
    candidates = [b for b in (measured, predicted) if b is not None]
    return min(max(candidates), largest.batch) if candidates else None


def throughput_knee_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    """Smallest batch within 5% of the best samples/s seen among trials that fit."""
    fits = [t for t in fitting_trials(trials, budget_bytes) if t.samples_per_second]
    if not fits:
        return None
    best = max(t.samples_per_second for t in fits)
    return min(t.batch for t in fits if t.samples_per_second >= KNEE_FRACTION * best)
