"""The peers' batch finders as pure strategies, so the benchmark runs them on edgebatch's own trials.

No TensorFlow here. Each is a `next_step(config, outcomes) -> Run | Done` like search.py's, chosen by
`SearchConfig.strategy` (search.next_step dispatches here; the records both use live in
outcomes.py), so a benchmark compares methods on the same worker processes, budget and
measurement, and only the decisions differ: `shrink_x0.9` / `shrink_x0.5` (Accelerate's
`find_executable_batch_size`, new and old: _shrink_step) and `one_shot_estimate` (DeepSpeed
autotuning's memory model, reduced to what a CPU process can see: _estimate_step).

A batch that failed (OOM, worker killed, or measured over budget) is never the answer. Every decision
depends only on which batches ran and whether they fitted, so outcomes may come in any order.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgebatch.errors import UsageError
from edgebatch.probing.outcomes import Done, Outcome, Run, SearchConfig, first_batch, round_down

SHRINK_FACTORS = {"shrink_x0.9": 0.9, "shrink_x0.5": 0.5}
ONE_SHOT = "one_shot_estimate"
BASELINE_STRATEGIES = (*SHRINK_FACTORS, ONE_SHOT)
# DeepSpeed autotuning's check around its max micro-batch estimate (docs/tensorflow-memory.md, "Peers").
ESTIMATE_FACTORS = (0.95, 1.0, 1.05)


def next_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Run | Done:
    """The next trial (or the answer) of the baseline named by `config.strategy`."""
    if config.strategy in SHRINK_FACTORS:
        return _shrink_step(config, outcomes, SHRINK_FACTORS[config.strategy])
    if config.strategy == ONE_SHOT:
        return _estimate_step(config, outcomes)
    raise UsageError(f"{config.strategy!r} is not a baseline strategy: choose one of {', '.join(BASELINE_STRATEGIES)}")


def shrink_sequence(start_batch: int, factor: float, multiple: int = 1) -> list[int]:
    """The batches a shrink-on-failure finder tries, in order: start, then x factor until below `multiple`.

    >>> shrink_sequence(128, 0.5)
    [128, 64, 32, 16, 8, 4, 2, 1]
    """
    if not 0 < factor < 1:
        raise UsageError(f"shrink factor must be in (0, 1), got {factor!r}")
    sequence = []
    batch = start_batch
    while batch >= multiple:
        sequence.append(batch)
        smaller = round_down(int(batch * factor), multiple)
        # int(b x 0.9) can equal b only for b = 0; rounding to the multiple can stall (b = m): stop.
        if smaller >= batch:
            break
        batch = smaller
    return sequence


def estimate_candidates(config: SearchConfig, calibration: Outcome) -> list[int]:
    """The batches the one-shot estimate checks, ascending and distinct; [] when nothing can fit.

    `calibration` is the trial at the smallest batch. Needs `config.baseline_bytes`.
    """
    if config.baseline_bytes is None:
        raise UsageError(
            f"strategy {ONE_SHOT!r} needs SearchConfig.baseline_bytes (the worker's memory before any "
            "trial batch), got None"
        )
    if calibration.peak_bytes is None:
        return []
    room_bytes = config.budget_bytes - config.baseline_bytes
    # A calibration step that added nothing measurable still costs something per sample: one byte
    # keeps the division defined and sends the estimate to max_batch_limit, which is what DeepSpeed's
    # formula does with a zero activation estimate.
    per_sample_bytes = max(1.0, (calibration.peak_bytes - config.baseline_bytes) / calibration.batch)
    estimate = room_bytes / per_sample_bytes
    cap = round_down(config.max_batch_limit, config.multiple)
    candidates = {min(round_down(estimate * factor, config.multiple), cap) for factor in ESTIMATE_FACTORS}
    return sorted(batch for batch in candidates if batch >= config.multiple)


def _shrink_step(config: SearchConfig, outcomes: Sequence[Outcome], factor: float) -> Run | Done:
    """Accelerate's shrink-on-failure: start at `config.start_batch` (Accelerate's default is 128:
    the benchmark passes it), and on every failure multiply by `factor` (`int(batch * factor)`, then
    down to the multiple); never grow. The first batch that fits is the answer; reaching zero is
    "nothing fits" (Accelerate raises there)."""
    tried = _results(config, outcomes)
    for batch in shrink_sequence(first_batch(config), factor, config.multiple):
        if batch not in tried:
            return Run(batch)
        if tried[batch]:
            return Done(batch)
    return Done(None)


def _estimate_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Run | Done:
    """DeepSpeed's one-shot estimate: one trial at the smallest batch (1, or `multiple`); per-sample
    memory = (its peak - `config.baseline_bytes`) / batch; estimate = (budget - baseline) /
    per-sample. Then 0.95, 1.0 and 1.05 x the estimate, smallest first, keeping the largest that
    fits (DeepSpeed runs each as its own experiment; stopping at the first failure assumes, as
    bisection does, that a larger batch would fail too, and saves a trial). When none fits, the
    answer is the calibration trial's batch, which the benchmark reports as a miss, not hidden."""
    calibration_batch = config.multiple
    tried = _results(config, outcomes)
    if calibration_batch not in tried:
        return Run(calibration_batch)
    if not tried[calibration_batch]:
        return Done(None)
    calibration = next(o for o in outcomes if o.batch == calibration_batch)
    for batch in estimate_candidates(config, calibration):
        if batch not in tried:
            return Run(batch)
        if not tried[batch]:
            break
    return Done(max(batch for batch, fits in tried.items() if fits))


def _results(config: SearchConfig, outcomes: Sequence[Outcome]) -> dict[int, bool]:
    """batch -> whether it fitted; a batch tried twice fits only if every try did."""
    results: dict[int, bool] = {}
    for outcome in outcomes:
        results[outcome.batch] = results.get(outcome.batch, True) and outcome.fits(config.budget_bytes)
    return results
