"""The probe's batch-size search as a pure decision: outcomes in, the next step out.

No TensorFlow here. `next_step(config, outcomes)` looks at every trial so far and returns
`Run(batch, fresh)` (run a trial; `fresh`: in a worker that has run no other trial batch),
`Skip(batch, predicted_peak_bytes)` (the memory model puts it over budget: recorded as a failure
unrun, since on CPU a real OOM hurts other processes too) or `Done(max_batch)` (None when not even
the smallest batch fits). The state is just the outcome list, so a search can be replayed, tested
with tables of numbers and resumed from a saved profile.

The search is slow start: double, jump under the memory model's ceiling once it is trusted,
bisect, and read the endgame in fresh workers; which fits and failures count is outcomes.edge_of's
rule. SLOW_START is it as the Finder record run_search takes by default; the peers' finders are
benchmark baselines, in tools/bench/finders.py. How it treats bumps, children's readings and its
answer: docs/probe-rules.md, "search.next_step: slow start".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgebatch.probing.memory_fit import bump_excess_bytes, memory_model_of, prior_through_readings
from edgebatch.probing.outcomes import (
    ANSWER_READINGS,
    BUMP_EDGE_FRACTION,
    Done,
    Finder,
    Outcome,
    Run,
    SearchConfig,
    Skip,
    Step,
    answer_readings_wanted,
    edge_of,
    first_batch,
    round_down,
    with_effective_budget,
)
from edgebatch.profiles.model import MemoryModel

# Fresh trials above one bump before it is taken as the ceiling (see _confirm_above_bump).
BUMP_CONFIRMATIONS = 2
# How far an answer keeps below a bump that bounds it: SearchConfig.bump_edge_fraction, whose
# default (BUMP_EDGE_FRACTION, 3%) and reasons live in outcomes.py.
# The widest bump measured, as a share of its batch: small_cnn's, high from 292 to 308 and low
# again at 320 (docs/probe-evidence.md, "Bumps").
BUMP_WIDTH_FRACTION = 0.10
# How far over the search's budget (the device budget less the measurement margin) a fork-server
# child's reading may sit and still be read again in a new process before it bounds the answer
# (_reread_childs_failure), as a share of it. Near the edge children read 0.7-1.6% above new
# processes, so a child within 1% over stands for a new process at most 0.3% over, inside the 1%
# margin (margins.MEASUREMENT_MARGIN_ONE_THREAD); further out, a re-read would only cost an import
# (docs/probe-evidence.md, "Why: a step's peak is decided by the allocator's growth in its first step").
CHILD_LIFT_FRACTION = 0.01

__all__ = [
    "ANSWER_READINGS", "BUMP_EDGE_FRACTION", "CHILD_LIFT_FRACTION", "SLOW_START", "Done", "Finder", "Outcome", "Run",
    "SearchConfig", "Skip", "Step", "first_batch", "next_step", "round_down", "usable_model",
]


def readings_of(outcomes: Sequence[Outcome]) -> list[tuple[int, int, bool]]:
    """(batch, measured peak, fresh) of every trial that ran, over budget or not."""
    return [(o.batch, o.peak_bytes, o.fresh) for o in outcomes if o.reading]


def usable_model(outcomes: Sequence[Outcome]) -> MemoryModel | None:
    """The memory model of the measured trials (memory_fit.memory_model_of), if it is trusted."""
    return memory_model_of(readings_of(outcomes))


def next_step(config: SearchConfig, outcomes: Sequence[Outcome]) -> Step:
    """Decide what to do next from every outcome so far (in any order)."""
    # Repeated fresh readings that differ lower the budget every reading is judged by.
    config = with_effective_budget(config, outcomes)
    cap = round_down(config.max_batch_limit, config.multiple)
    prior = config.prior_model
    if not outcomes:
        return Run(first_batch(config)) if prior is None else _start_at_prior(config, prior, cap)

    edge = edge_of(outcomes, config.budget_bytes)
    lo, hi = edge.lo, edge.hi
    if prior is not None:
        # The prior's intercept is the process's; its slope moves to this search's readings.
        model = prior_through_readings(prior, readings_of(outcomes))
    else:
        model = usable_model(outcomes)

    if hi is None:
        step = _grow(config, lo, cap, model)
    else:
        if config.fresh_endgame and model is not None:
            reread = _reread_childs_failure(config, outcomes, hi, model)
            if reread is not None:
                return reread
            confirm = _confirm_above_bump(config, outcomes, hi, cap, model)
            if confirm is not None:
                return confirm
        over = [o.peak_bytes for o in outcomes if o.batch == hi and o.reading]
        step = _bisect(config, lo, hi, model, min(over, default=None))
    if config.fresh_endgame:
        step = _fresh_endgame(config, step, outcomes, hi, model)
        if isinstance(step, Done) and model is not None:
            step = _clear_of_bump(config, outcomes, step, hi, model)
        if isinstance(step, Done):
            step = _repeat_answer(config, outcomes, step)
    return step


# The probe's search as run_search takes it: it reads its answer in fresh workers (_repeat_answer).
SLOW_START = Finder(name="slow_start", next_step=next_step, checks_answer=True)


def _repeat_answer(config: SearchConfig, outcomes: Sequence[Outcome], done: Done) -> Step:
    """One more fresh trial at the answer until it has the fresh readings it needs
    (outcomes.answer_readings_wanted: config.answer_readings, BAND_READINGS_FACTOR times that where
    each new process is a draw, in an out-of-memory band or between peak levels).

    Where fresh processes read one batch differently, the repeats show it: the budget is then
    lowered by the spread (outcomes.effective_budget_bytes) and the search goes on below. In a band
    a reading that runs out of memory counts as a failure and the search goes on below it.
    """
    if done.max_batch is None:
        return done
    # Every fresh trial of the batch counts, an out-of-memory one too: at most the readings asked each.
    tried = sum(1 for o in outcomes if o.batch == done.max_batch and o.fresh and o.measured)
    wanted = answer_readings_wanted(config.answer_readings, outcomes)
    missing = wanted - tried
    return Run(done.max_batch, fresh=True, readings=missing) if missing > 0 else done


def _clear_of_bump(config: SearchConfig, outcomes: Sequence[Outcome], done: Done, hi: int | None,
                   model: MemoryModel) -> Step:
    """The answer moved config.bump_edge_fraction below the failure `hi` when `hi` is a bump (its reading
    sits above the line by more than the noise): a fresh trial there first, then the largest fit at
    or under it. Otherwise `done` as it is."""
    if done.max_batch is None or hi is None:
        return done
    readings = [o.peak_bytes for o in outcomes if o.batch == hi and o.reading]
    if not readings or bump_excess_bytes(model, readings_of(outcomes), hi, min(readings)) <= 0:
        return done
    guard = round_down(hi * (1 - config.bump_edge_fraction), config.multiple)
    if done.max_batch <= guard:
        return done
    best = max((o.batch for o in outcomes if o.fits(config.budget_bytes) and o.batch <= guard), default=0)
    if best < guard and guard >= config.multiple and not any(o.batch == guard and o.measured for o in outcomes):
        return Run(guard, fresh=True)
    return Done(best or None)


def _start_at_prior(config: SearchConfig, prior: MemoryModel, cap: int) -> Run:
    """The first trial of a search with a prior line: just under its ceiling, in a fresh worker."""
    step = config.multiple
    ceiling = prior.batch_for_bytes(config.budget_bytes)
    return Run(min(max(round_down(ceiling * (1 - config.jump_margin), step), step), cap), fresh=True)


def _confirm_above_bump(
    config: SearchConfig, outcomes: Sequence[Outcome], hi: int, cap: int, model: MemoryModel
) -> Run | None:
    """A fresh trial above the failure `hi` when `hi` is a bump (defined below), else None.

    `hi` is a bump when a fresh worker measured it over budget, the line puts it within the budget,
    and its reading sits above the line by more than the noise (memory_fit.bump_excess_bytes).
    The first confirming trial goes to the line's ceiling less one tolerance step (at least one
    tolerance step above `hi`), when the line puts that within the budget. If there is no such
    room, or that trial fails and also reads above the line by more than the noise, the line itself
    is in doubt near the boundary (small_cnn: fresh workers read 1535-1578 MiB at 292-308, a
    reused one 1450 MiB at 320, against a line through 8, 16 and 32 that puts 320 at 1560 MiB),
    and one more goes past the widest bump measured (BUMP_WIDTH_FRACTION above `hi`), or to where
    the line, lowered by the most the bump read above it, puts the ceiling, whichever is higher.
    After that the bump stands: at most BUMP_CONFIRMATIONS trials per bump.
    """
    chain = sorted((o for o in outcomes if o.fresh and o.measured and o.batch >= hi), key=lambda o: o.batch)
    above = [o for o in chain if o.batch > hi]
    top = chain[-1] if chain else None
    if top is None or not top.reading or top.fits(config.budget_bytes) or len(above) >= BUMP_CONFIRMATIONS:
        return None
    if not above and not _is_bump(config, outcomes, model, hi, top.peak_bytes):
        return None  # on the line, or over a line that puts hi over budget: the line's ceiling
    if above and bump_excess_bytes(model, readings_of(outcomes), top.batch, top.peak_bytes) <= 0:
        return None
    step = config.multiple
    tolerance_step = max(step, round_down(hi * config.tolerance, step))
    candidate = None
    if not above:
        ceiling = model.batch_for_bytes(config.budget_bytes)
        candidate = max(hi + tolerance_step, round_down(ceiling * (1 - config.tolerance), step))
        if model.predict_bytes(candidate) > config.budget_bytes:
            candidate = None  # no room under the line above the bump
    if candidate is None:
        deviation = max(o.peak_bytes - model.predict_bytes(o.batch) for o in chain if o.reading)
        candidate = max(
            round_down(hi * (1 + BUMP_WIDTH_FRACTION), step),
            round_down(model.batch_for_bytes(config.budget_bytes + deviation), step),
        )
    candidate = min(candidate, cap)
    return Run(candidate, fresh=True) if candidate >= top.batch + tolerance_step else None


def _reread_childs_failure(config: SearchConfig, outcomes: Sequence[Outcome], hi: int, model: MemoryModel) -> Run | None:
    """A fresh trial at the failure `hi` again, in a new process, when only fork-server children read it
    over budget, and their readings are a bump (above the line by more than the noise) or a near miss
    (within CHILD_LIFT_FRACTION over the budget); else None.

    Children and new processes can meet the edge at different batches, and training runs in a new
    process: children's bumps held small_cnn's answer under batches new processes fit, and their
    near misses mobilenet_v2's (docs/probe-evidence.md, "Bumps" and "Why: a step's peak is decided
    by the allocator's growth in its first step"). So such a
    failure is read in a new process before it bounds the answer (the api runs a fresh trial of a
    batch that already has a fresh reading in a new process). If that fits, the child's failure is
    contradicted (outcomes.edge_of) and the search goes on above it; if not, it bounds the answer
    (a bump is confirmed as before, _confirm_above_bump). One new process reads it: a second would
    double the cost (a TensorFlow import each) to settle what the first already settles either way.
    """
    fresh = [o for o in outcomes if o.batch == hi and o.fresh and o.measured]
    if not fresh or any(o.forked is not True for o in fresh):
        return None
    readings = [o.peak_bytes for o in fresh if o.reading]
    if len(readings) < len(fresh):
        return None  # a child ran out of memory there for real: no reading to weigh
    if _within_child_lift(config, min(readings)) or _is_bump(config, outcomes, model, hi, min(readings)):
        return Run(hi, fresh=True, readings=1)
    return None


def _is_bump(config: SearchConfig, outcomes: Sequence[Outcome], model: MemoryModel, batch: int,
             peak_bytes: int) -> bool:
    """Whether `peak_bytes` at `batch` is a bump: above the line by more than the noise
    (memory_fit.bump_excess_bytes) where the line puts `batch` within the budget.

    Over a line that puts the batch over budget a failure is the line's ceiling, whatever it reads.
    Not checking that let a re-read climb past the truth: a new process drew a low reading of
    mobilenet_v2's 34, and the probe answered 36, which a fresh process failed
    (docs/probe-evidence.md, "Why: a step's peak is decided by the allocator's growth in its first step").
    """
    return (model.predict_bytes(batch) <= config.budget_bytes
            and bump_excess_bytes(model, readings_of(outcomes), batch, peak_bytes) > 0)


def _fresh_endgame(config: SearchConfig, step: Step, outcomes: Sequence[Outcome], hi: int | None,
                   model: MemoryModel | None) -> Step:
    """Trials run fresh once the model is trusted; the failure bounding the answer must be fresh.

    That failure is read in a new process at once where the line puts it within CHILD_LIFT_FRACTION
    over the budget: a fork-server child's reading there is over the budget or a near miss, and a
    near miss is read again in a new process anyway (_reread_childs_failure), so the child's trial
    is spent for nothing. Where children read above new processes that happened at every step:
    transformer_tiny took 12 fresh trials for 6 batches (docs/probe-evidence.md, "Bumps").
    """
    if isinstance(step, Run) and model is not None:
        return Run(step.batch, fresh=True)
    if isinstance(step, Done) and step.max_batch and hi is not None:
        confirmed = any(o.batch == hi and o.fresh and o.measured for o in outcomes)
        if not confirmed:
            predicted = model.predict_bytes(hi) if model is not None else None
            near_miss = predicted is not None and predicted > config.budget_bytes and _within_child_lift(config, predicted)
            return Run(hi, fresh=True, new_process=near_miss)
    return step


def _within_child_lift(config: SearchConfig, peak_bytes: float) -> bool:
    """Whether a child's reading of `peak_bytes` may stand for a new process's within the budget
    (CHILD_LIFT_FRACTION over it at most)."""
    return peak_bytes <= config.budget_bytes * (1 + CHILD_LIFT_FRACTION)


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
        # Nothing fits yet: back off (halve) toward the smallest allowed batch; with a prior line
        # (turned through the failure's reading), to just under its ceiling when that is lower.
        if hi <= step:
            return Done(None)
        candidate = max(round_down(hi // 2, step), step)
        if config.prior_model is not None and model is not None:
            guess = round_down(model.batch_for_bytes(config.budget_bytes) * (1 - config.jump_margin), step)
            if step <= guess < hi:
                candidate = guess
        return _maybe_skip(config, candidate, model)
    if hi - lo <= max(step, config.tolerance * lo):
        return Done(lo)
    candidate = round_down(_midpoint(lo, hi), step)
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


# slow_start bisects geometrically only across an interval wider than this (hi / lo): wider than one
# doubling. Narrower ones keep the arithmetic midpoint, whose last steps land nearer the failure
# (`python tools/bench/run.py --quick --only probe`: dense_wide 253 geometric, 255 arithmetic;
# docs/probe-evidence.md, "Two ways to cut the new-process wait, measured and not taken").
GEOMETRIC_ABOVE_RATIO = 2


def _midpoint(lo: int, hi: int) -> float:
    """Where bisection goes between the last fit `lo` and the first failure `hi` when no line guides it.

    The geometric midpoint across an interval wider than one doubling (GEOMETRIC_ABOVE_RATIO), the
    arithmetic one otherwise (the benchmark's binsearch keeps Lightning's arithmetic one). A
    wide interval without a line's guess comes from a failure the line does not explain: a real
    OOM at a batch the line puts well inside the budget, so a limit the readings cannot see binds
    (an address-space cap, a cgroup the budget was not told of). Where that limit lies is then
    unknown by orders of magnitude, and each failure in a new process costs a TensorFlow import
    and the OOM's own ~10 s. dense_wide told only the RAM under a 300 MiB cap took 10 OOMs with
    arithmetic midpoints, 5 with this (docs/probe-rules.md, "search._midpoint").
    """
    if hi > GEOMETRIC_ABOVE_RATIO * lo:
        return math.sqrt(lo * hi)
    return (lo + hi) // 2


def _maybe_skip(config: SearchConfig, candidate: int, model: MemoryModel | None) -> Step:
    if model is not None and config.refuse_predicted_over_budget:
        predicted = model.predict_bytes(candidate)
        if predicted > config.budget_bytes:
            return Skip(candidate, int(predicted))
    return Run(candidate)
