"""The peers' batch finders as pure decisions, so the benchmark runs them on edgebatch's own trials.

No TensorFlow here. Each is an outcomes.Finder: `next_step(config, outcomes) -> Run | Done` like
edgebatch's search.next_step, passed to run_search.run_search (or api.run_probe) as `finder`, so a
benchmark compares methods on the same worker processes, budget, measurement and safety rules, and
only the decisions differ:
- Lightning's `binsearch` (double, then bisect at the arithmetic midpoint) and `power` (double,
  answer the last fit): the last fit and the first failure above it, as Lightning reads them.
- `binsearch_checked`: binsearch held to edgebatch's rule for the answer (outcomes.edge_of under
  the budget lowered by the spread of repeated readings, and the answer read in fresh workers:
  search._repeat_answer), so the benchmark prices that rule apart from the search.
- `shrink_x0.9` / `shrink_x0.5`: Accelerate's `find_executable_batch_size`, new and old (_shrink_step).
- `one_shot_estimate`: DeepSpeed autotuning's memory model, reduced to what a CPU process can see
  (_estimate_step).

A batch that failed (OOM, worker killed, or measured over budget) is never the answer. Every decision
depends only on which batches ran and whether they fitted, so outcomes may come in any order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from edgebatch.errors import UsageError
from edgebatch.probing.outcomes import (
    Done,
    Finder,
    Outcome,
    Run,
    SearchConfig,
    edge_of,
    first_batch,
    round_down,
    with_effective_budget,
)
from edgebatch.probing.search import SLOW_START, _repeat_answer

SHRINK_FACTORS = {"shrink_x0.9": 0.9, "shrink_x0.5": 0.5}
ONE_SHOT = "one_shot_estimate"
# DeepSpeed autotuning's check around its max micro-batch estimate (docs/tensorflow-memory.md, "Peers").
ESTIMATE_FACTORS = (0.95, 1.0, 1.05)


def binsearch_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Run | Done:
    """Lightning's binsearch: double from the start batch until a failure, then bisect between the
    last fit and the first failure above it at the arithmetic midpoint."""
    if not outcomes:
        return Run(first_batch(config))
    lo, hi = _lightning_bracket(config, outcomes)
    return _double(config, lo) if hi is None else _bisect(config, lo, hi)


def power_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Run | Done:
    """Lightning's power: double until the first failure and answer the last fit (halving while
    nothing fits yet)."""
    if not outcomes:
        return Run(first_batch(config))
    lo, hi = _lightning_bracket(config, outcomes)
    if hi is None:
        return _double(config, lo)
    return Done(lo) if lo > 0 else _bisect(config, lo, hi)


def checked_binsearch_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Run | Done:
    """binsearch's doubling and midpoints, with fits and failures counted by outcomes.edge_of under
    the budget lowered by the spread of repeated fresh readings, and its answer read in fresh workers
    until answer_readings_wanted agree (search._repeat_answer), as edgebatch's search reads its own."""
    if not outcomes:
        return Run(first_batch(config))
    config = with_effective_budget(config, outcomes)
    edge = edge_of(outcomes, config.budget_bytes)
    step = _double(config, edge.lo) if edge.hi is None else _bisect(config, edge.lo, edge.hi)
    return _repeat_answer(config, outcomes, step) if isinstance(step, Done) else step


def midpoint(lo: int, hi: int) -> int:
    """Lightning's bisection point between the last fit `lo` and the first failure `hi`: arithmetic."""
    return (lo + hi) // 2


def _lightning_bracket(config: SearchConfig, outcomes: Sequence[Outcome]) -> tuple[int, int | None]:
    """Lightning's finders as they are: the last fit (0 when none), and the first failure above it."""
    lo = max((o.batch for o in outcomes if o.fits(config.budget_bytes)), default=0)
    hi = min((o.batch for o in outcomes if not o.fits(config.budget_bytes) and o.batch > lo), default=None)
    return lo, hi


def _double(config: SearchConfig, lo: int) -> Run | Done:
    """Twice the last fit (at least one `multiple` more), capped by max_batch_limit; at the cap, the answer."""
    cap = round_down(config.max_batch_limit, config.multiple)
    if lo >= cap:
        return Done(lo)
    return Run(min(max(2 * lo, lo + config.multiple), cap))


def _bisect(config: SearchConfig, lo: int, hi: int) -> Run | Done:
    """Between the last fit `lo` and the first failure `hi`: halve while nothing fits, else the
    midpoint, until they lie within the tolerance (or one `multiple`) of each other."""
    step = config.multiple
    if lo == 0:
        return Done(None) if hi <= step else Run(max(round_down(hi // 2, step), step))
    if hi - lo <= max(step, config.tolerance * lo):
        return Done(lo)
    candidate = min(max(round_down(midpoint(lo, hi), step), lo + step), hi - step)
    return Done(lo) if candidate <= lo else Run(candidate)


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
            f"finder {ONE_SHOT!r} needs SearchConfig.baseline_bytes (the worker's memory before any "
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


BINSEARCH = Finder(name="binsearch", next_step=binsearch_step)
BINSEARCH_CHECKED = Finder(name="binsearch_checked", next_step=checked_binsearch_step, checks_answer=True)
POWER = Finder(name="power", next_step=power_step)
ONE_SHOT_ESTIMATE = Finder(name=ONE_SHOT, next_step=_estimate_step)
SHRINK = {name: Finder(name=name, next_step=functools.partial(_shrink_step, factor=factor))
          for name, factor in SHRINK_FACTORS.items()}
# Every method the probe benchmark runs, by name: edgebatch's own search and the peers'.
FINDERS = {finder.name: finder
           for finder in (SLOW_START, BINSEARCH, BINSEARCH_CHECKED, POWER, ONE_SHOT_ESTIMATE, *SHRINK.values())}
