"""How much of a probe is left, for its progress line: trials and seconds. Pure.

An estimate from the search's records, not a promise: a bump, peak levels or an out-of-memory
band each ask for more readings than the bracket shows. Trials left are the bisections between
the largest fit and the smallest failure that counts (outcomes.edge_of) down to the search's
tolerance, plus the fresh readings the answer still needs (outcomes.answer_readings_wanted);
before any failure, one jump to the memory line's ceiling and two bisections around it. Seconds
left are those trials at the mean wall time of the fresh trials so far, which cost a worker's
start-up each, where any ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgebatch.probing import memory_fit
from edgebatch.probing.outcomes import Outcome, SearchConfig, answer_readings_wanted, edge_of, effective_budget_bytes

# Bisections the search spends around the line's predicted ceiling before a failure brackets it.
BISECTIONS_AROUND_THE_LINE = 2


@dataclass(frozen=True)
class TrialTime:
    """One trial's wall seconds, start-up of its worker included, and whether it ran in a fresh worker."""

    seconds: float
    fresh: bool


@dataclass(frozen=True)
class Estimate:
    trials_left: int
    seconds_left: float

    def describe(self) -> str:
        trials = "1 trial" if self.trials_left == 1 else f"{self.trials_left} trials"
        return f"about {trials}, {_duration(self.seconds_left)} left"


def trials_left(config: SearchConfig, outcomes: Sequence[Outcome], checks_answer: bool) -> int | None:
    """Trials the search likely still runs (see the module docstring); None before anything fits
    (the search is still backing off) or before a memory line exists without a failure to bracket."""
    budget = effective_budget_bytes(outcomes, config.budget_bytes)
    edge = edge_of(outcomes, budget)
    if edge.lo == 0:
        return None
    wanted = answer_readings_wanted(config.answer_readings, outcomes) if checks_answer else 1
    step = config.multiple
    if edge.hi is None:
        if edge.lo >= config.max_batch_limit - step:
            return max(wanted - _fresh_readings_at(edge.lo, outcomes), 0)
        model = memory_fit.memory_model_of([(o.batch, o.peak_bytes, o.fresh) for o in outcomes if o.reading])
        if model is None or model.per_sample_bytes <= 0:
            return None
        return 1 + BISECTIONS_AROUND_THE_LINE + wanted - 1
    width = max(step, config.tolerance * edge.lo)
    bisections = math.ceil(math.log2((edge.hi - edge.lo) / width)) if edge.hi - edge.lo > width else 0
    readings_left = wanted - 1 if bisections else max(wanted - _fresh_readings_at(edge.lo, outcomes), 0)
    return bisections + readings_left


def estimate(left: int | None, times: Sequence[TrialTime]) -> Estimate | None:
    """`left` trials at the mean wall time of the fresh trials so far (of all trials before any ran fresh)."""
    if not left or not times:
        return None
    fresh = [t.seconds for t in times if t.fresh] or [t.seconds for t in times]
    return Estimate(trials_left=left, seconds_left=left * sum(fresh) / len(fresh))


def _fresh_readings_at(batch: int, outcomes: Sequence[Outcome]) -> int:
    return sum(1 for o in outcomes if o.batch == batch and o.fresh and o.reading)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{max(round(seconds), 1)} s"
    return f"~{round(seconds / 60)} min"
