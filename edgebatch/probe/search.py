"""The batch-size search as a pure strategy: outcomes in, the next step out.

No TensorFlow here. `next_step(config, outcomes)` looks at every trial so far and returns one of

- `Run(batch, fresh)`: run a trial at this batch (`fresh`: in a new worker process that has run
  no other trial batch);
- `Skip(batch, predicted_peak_bytes)`: the memory model predicts this batch is over budget, so it is
  recorded as a failure without running it (on CPU a real host OOM hurts other processes too);
- `Done(max_batch)`: the search has converged (`max_batch` is None when not even the smallest
  batch fits).

Because the state is just the outcome list, the search can be replayed, tested with tables of
numbers and resumed from a saved profile.

Strategies:
- `slow_start` (the default): TCP-style slow start. Start small, double while trials fit; once the
  memory model (fixed + per_sample x batch, fitted on the measured trials) is good, jump straight
  to just under its predicted ceiling instead of doubling blindly, and never propose a batch the
  model predicts over budget. At the first failure bisect between the last fit and the first
  failure, guided by the model's ceiling when it falls inside the interval.
  The endgame is measured fresh: a worker that ran earlier trials reads 5-6% high (memory it kept
  from them is only partly reused: dense_wide at 300 read 1410 MiB after trials at 8..276 and
  1327 MiB in a new process, where an independent fresh step read 1334 MiB). So once the model is
  trusted every trial runs in a fresh worker, the model's line is moved down to the fresh
  readings (memory_fit.turn_to_fresh), and the search does not stop on a failure a
  reused worker measured or the model predicted: it runs that batch fresh first.
- `binsearch`: plain doubling, then midpoint bisection (Lightning's binsearch). The baseline the
  slow start is measured against.
- `power`: plain doubling until the first failure; answer the last fit (Lightning's power).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgebatch.errors import UsageError
from edgebatch.probe.memory_fit import fit_memory_model, split_fresh, turn_to_fresh
from edgebatch.profiles.model import MemoryModel

# The last three are the peers' finders, for benchmarks (baselines.py): Accelerate's shrink-on-OOM
# (x0.9 now, x0.5 before) and a DeepSpeed-style one-shot estimate.
STRATEGIES = ("slow_start", "binsearch", "power", "shrink_x0.9", "shrink_x0.5", "one_shot_estimate")


@dataclass(frozen=True)
class SearchConfig:
    budget_bytes: int
    start_batch: int = 8
    max_batch: int = 4096
    multiple: int = 1
    # Stop bisecting when the interval is within 2% of the answer (or one `multiple`).
    tolerance: float = 0.02
    strategy: str = "slow_start"
    # The first jump lands this far under the predicted ceiling: the fit from a few small batches
    # can be off by a few percent (FACTS.md: +-40 MiB steps), and a jump that overshoots costs a
    # failed trial at the most expensive batch of the probe.
    jump_margin: float = 0.04
    # The model is trusted after this many measured trials with at least this r2.
    min_fit_points: int = 3
    min_fit_r2: float = 0.98
    refuse_predicted_over_budget: bool = True
    # slow_start only: trials after the model is trusted, and the check of the failure above the
    # answer, run in fresh workers (see the module docstring).
    fresh_endgame: bool = True
    # The worker's memory before any trial batch (same measure as the peaks); only the
    # one_shot_estimate baseline reads it.
    baseline_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise UsageError(f"memory budget must be positive, got {self.budget_bytes!r} bytes")
        if self.multiple < 1:
            raise UsageError(f"--multiple must be >= 1, got {self.multiple!r}")
        if self.start_batch < 1:
            raise UsageError(f"--start must be >= 1, got {self.start_batch!r}")
        if self.max_batch < self.multiple:
            raise UsageError(
                f"--max-batch {self.max_batch!r} is below --multiple {self.multiple!r}: no batch is allowed"
            )
        if not 0 < self.tolerance < 1:
            raise UsageError(f"tolerance must be in (0, 1), got {self.tolerance!r}")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"unknown search strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class Outcome:
    """What one trial showed. `ran` is False for an OOM (or a worker killed) and for a skip.

    `fresh`: the trial was the first trial batch of its worker process, so nothing kept from
    earlier trials lifted its reading.
    """

    batch: int
    ran: bool
    peak_bytes: int | None = None
    measured: bool = True
    fresh: bool = False

    def fits(self, budget_bytes: int) -> bool:
        return self.ran and self.peak_bytes is not None and self.peak_bytes <= budget_bytes


@dataclass(frozen=True)
class Run:
    batch: int
    fresh: bool = False


@dataclass(frozen=True)
class Skip:
    batch: int
    predicted_peak_bytes: int


@dataclass(frozen=True)
class Done:
    max_batch: int | None


Step = Run | Skip | Done


def round_down(batch: float, multiple: int) -> int:
    return int(batch // multiple) * multiple


def first_batch(config: SearchConfig) -> int:
    """The start batch, rounded up to the multiple and capped by max_batch."""
    start = -(-config.start_batch // config.multiple) * config.multiple
    return min(start, round_down(config.max_batch, config.multiple))


def usable_model(config: SearchConfig, outcomes: Sequence[Outcome]) -> MemoryModel | None:
    """The memory model of the measured trials that ran, if it is good enough to trust.

    Fresh trials at large batches are kept out of the fit and turn the line down when they read
    below it (memory_fit.split_fresh, turn_to_fresh): reused workers read high.
    """
    readings = [(o.batch, o.peak_bytes, o.fresh) for o in outcomes if o.ran and o.measured and o.peak_bytes is not None]
    rest, fresh = split_fresh(readings)
    model = _trusted_fit(config, rest) or _trusted_fit(config, [(b, p) for b, p, _ in readings])
    return None if model is None else turn_to_fresh(model, fresh)


def _trusted_fit(config: SearchConfig, points: Sequence[tuple[int, float]]) -> MemoryModel | None:
    model = fit_memory_model(points)
    if model is None or model.points < config.min_fit_points or model.r2 < config.min_fit_r2:
        return None
    if model.per_sample_bytes <= 0:
        return None
    return model


def next_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Step:
    """Decide what to do next from every outcome so far (in any order)."""
    if config.strategy not in ("slow_start", "binsearch", "power"):
        from edgebatch.probe import baselines  # imports this module: import when needed

        return baselines.next_step(config, outcomes)
    budget = config.budget_bytes
    cap = round_down(config.max_batch, config.multiple)
    if not outcomes:
        return Run(first_batch(config))

    good = [o.batch for o in outcomes if o.fits(budget)]
    lo = max(good, default=0)
    # Failures at or below the best fit are noise at the fuzzy boundary (FACTS.md); the interval
    # is bounded by the first failure above it.
    failures_above = [o.batch for o in outcomes if not o.fits(budget) and o.batch > lo]
    hi = min(failures_above, default=None)
    model = usable_model(config, outcomes) if config.strategy == "slow_start" else None

    if hi is None:
        step = _grow(config, lo, cap, model)
    elif config.strategy == "power" and lo > 0:
        return Done(lo)
    else:
        over = [o.peak_bytes for o in outcomes if o.batch == hi and o.ran and o.measured and o.peak_bytes is not None]
        step = _bisect(config, lo, hi, model, min(over, default=None))
    if config.strategy == "slow_start" and config.fresh_endgame:
        return _fresh_endgame(step, outcomes, hi, model)
    return step


def _fresh_endgame(step: Step, outcomes: Sequence[Outcome], hi: int | None, model: MemoryModel | None) -> Step:
    """Trials run fresh once the model is trusted; the failure bounding the answer must be fresh."""
    if isinstance(step, Run) and model is not None:
        return Run(step.batch, fresh=True)
    if isinstance(step, Done) and step.max_batch and hi is not None:
        confirmed = any(o.batch == hi and o.fresh and o.measured for o in outcomes)
        if not confirmed:
            return Run(hi, fresh=True)
    return step


def _grow(config: SearchConfig, lo: int, cap: int, model: MemoryModel | None) -> Step:
    step = config.multiple
    if lo >= cap:
        return Done(lo)
    candidate = 2 * lo
    if model is not None:
        ceiling = model.batch_for_bytes(config.budget_bytes)
        if lo < ceiling * (1 - 2 * config.jump_margin):
            # Far below the predicted ceiling: jump to just under it.
            candidate = round_down(ceiling * (1 - config.jump_margin), step)
        else:
            # Near it (the fit now includes a point close to the boundary): try the ceiling
            # itself, or one tolerance step past the last fit; the model skips what is over.
            candidate = max(round_down(ceiling, step), lo + round_down(lo * config.tolerance, step))
    candidate = min(max(candidate, lo + step), cap)
    return _maybe_skip(config, candidate, model)


def _bisect(config: SearchConfig, lo: int, hi: int, model: MemoryModel | None, hi_peak_bytes: int | None = None) -> Step:
    """Next batch between the last fit `lo` and the first failure `hi`.

    With a model, the guess is its ceiling; when `hi` ran and measured over budget, the guess
    steps down from `hi`'s own reading by the model's bytes per sample instead (the reading is
    the best evidence of where the line really is near the boundary).
    """
    step = config.multiple
    if lo == 0:
        # Nothing fits yet: back off (halve) toward the smallest allowed batch.
        if hi <= step:
            return Done(None)
        return _maybe_skip(config, max(round_down(hi // 2, step), step), model)
    if hi - lo <= max(step, config.tolerance * lo):
        return Done(lo)
    midpoint = round_down((lo + hi) // 2, step)
    candidate = midpoint
    if model is not None:
        if hi_peak_bytes is not None:
            excess_samples = math.ceil((hi_peak_bytes - config.budget_bytes) / model.per_sample_bytes)
            guess = round_down(hi - excess_samples, step)
        else:
            guess = round_down(model.batch_for_bytes(config.budget_bytes), step)
        if lo < guess < hi:
            # Each trial moves at least one tolerance step: creeping up one sample at a time
            # toward a guess that sits just above the last fit costs trials and gains nothing.
            candidate = max(guess, lo + max(step, round_down(lo * config.tolerance, step)))
    candidate = min(max(candidate, lo + step), hi - step)
    if candidate <= lo:
        return Done(lo)
    return _maybe_skip(config, candidate, model)


def _maybe_skip(config: SearchConfig, candidate: int, model: MemoryModel | None) -> Step:
    if model is not None and config.refuse_predicted_over_budget:
        predicted = model.predict_bytes(candidate)
        if predicted > config.budget_bytes:
            return Skip(candidate, int(predicted))
    return Run(candidate)
