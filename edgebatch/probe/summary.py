"""What a finished search means: max, safe and knee batches. Pure: trials in, numbers out."""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgebatch.probe.memory_fit import fit_memory_model, split_fresh, turn_to_fresh
from edgebatch.profiles.model import MemoryModel, Trial

# Throughput within 5% of the best counts as the plateau (the definition of the knee).
KNEE_FRACTION = 0.95
# Failures that are the device's (a raised OOM, a killed worker), not the budget's verdict.
DEVICE_FAILURES = ("oom", "worker_killed")


def fitting_trials(trials: Sequence[Trial], budget_bytes: float) -> list[Trial]:
    return [t for t in trials if t.ok and t.measured and t.peak_bytes is not None and t.peak_bytes <= budget_bytes]


def memory_model_of(trials: Sequence[Trial]) -> MemoryModel | None:
    """The line through the trials that fitted, turned toward the fresh ones (memory_fit.turn_to_fresh)."""
    readings = [(t.batch, t.peak_bytes, t.fresh) for t in trials if t.ok and t.measured and t.peak_bytes is not None]
    rest, fresh = split_fresh(readings)
    model = fit_memory_model(rest) or fit_memory_model([(b, p) for b, p, _ in readings])
    return None if model is None or model.per_sample_bytes <= 0 else turn_to_fresh(model, fresh)


def max_batch_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    fits = fitting_trials(trials, budget_bytes)
    return max((t.batch for t in fits), default=None)


def safe_batch_of(
    trials: Sequence[Trial], budget_bytes: float, headroom: float, multiple: int, model: MemoryModel | None
) -> int | None:
    """Largest batch whose peak fits budget x (1 - headroom), never above max_batch.

    With a memory model, every measured fit is an anchor: from its own reading, stepping
    per_sample_bytes per sample, it says how far the batch can go before the reduced budget; the
    smallest answer wins. Readings are not monotone in batch (a scout worker's history inflates
    its peaks, a fresh worker reads lower; FACTS.md: +-40 MiB steps), and the safe batch must
    respect the worst of them. Without a model, the largest measured trial under the reduced
    budget.

    When the ceiling is a limit the budget does not see (hidden_limit_edge_of), the headroom is
    also kept below that edge, in samples: its exact place moves by a few percent between
    processes (an address-space cap: 256 ran in the probe's worker and failed in the next fresh
    process), so max_batch is the edge and the safe batch stays clear of it.
    """
    safe_budget = budget_bytes * (1 - headroom)
    fits = fitting_trials(trials, budget_bytes)
    if not fits:
        return None
    largest = max(t.batch for t in fits)
    if model is None or model.per_sample_bytes <= 0:
        safe = max_batch_of(trials, safe_budget)
    else:
        reach = min(t.batch + math.floor((safe_budget - t.peak_bytes) / model.per_sample_bytes) for t in fits)
        safe = min(reach, largest)
    edge = hidden_limit_edge_of(trials, budget_bytes, model)
    if safe is not None and edge is not None:
        safe = min(safe, math.floor(edge * (1 - headroom)))
    safe = None if safe is None else safe // multiple * multiple
    return safe if safe is not None and safe >= multiple else None


def hidden_limit_edge_of(trials: Sequence[Trial], budget_bytes: float, model: MemoryModel | None) -> int | None:
    """The largest fit below a device failure the budget does not explain, or None.

    A failure (OOM raised, worker killed) at a batch the memory model puts within the budget means
    something else binds: an address-space or cgroup limit, another process. Without a model
    every device failure counts. The edge is the largest fit below the smallest such failure.
    """
    fits = fitting_trials(trials, budget_bytes)
    failed = [
        t.batch for t in trials
        if not t.ok and t.measured and t.error in DEVICE_FAILURES
        and (model is None or model.per_sample_bytes <= 0 or model.predict_bytes(t.batch) <= budget_bytes)
    ]
    if not fits or not failed:
        return None
    first_failure = min(failed)
    below = [t.batch for t in fits if t.batch < first_failure]
    return max(below) if below else None


def throughput_knee_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    """Smallest batch within 5% of the best samples/s seen among trials that fit."""
    fits = [t for t in fitting_trials(trials, budget_bytes) if t.samples_per_second]
    if not fits:
        return None
    best = max(t.samples_per_second for t in fits)
    return min(t.batch for t in fits if t.samples_per_second >= KNEE_FRACTION * best)
