"""The search's records and the evidence every answer is read from. Pure: no TensorFlow.

search.py (edgebatch's search) and the benchmark's peer finders (tools/bench/finders.py) both import
from here, and summary.py reads a finished probe's trials through the same
`edge_of`, so the answer a search gives and the profile's max and safe batches come from one
reading of one set of outcomes.

The evidence rule (`edge_of`): a batch fits when it ran and its peak is within the budget. A
failure (OOM, worker killed, peak over budget, or a batch the memory model ruled out) counts
unless a fresh worker contradicts it: a batch at least as large fitted as the first trial of its
worker (strictly larger for a fresh worker that ran out of memory; and below any fresh
out-of-memory failure that stands, where a fit is a draw in a band: see `contradicted`). Failures are recorded either way; a contradicted one is a transient (a worker killed once
at 16 while 334 fitted fresh used to drag the safe batch down to 13) or a bump in a peak that is
not monotone in batch (search.py). The answer is the largest fit below the smallest counted
failure: every batch the probe saw fail and nothing contradicted lies above it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from edgebatch.errors import UsageError
from edgebatch.profiles.model import MemoryModel

# The search's defaults, owned here; ProbeRequest (and through it the CLI) reads them.
DEFAULT_START_BATCH = 8
DEFAULT_MAX_BATCH_LIMIT = 4096
# The search stops when the last fit and the first failure lie within this share of the last fit
# (or one `multiple`): the answer is then at most about this far under the edge it brackets.
DEFAULT_TOLERANCE = 0.02
# slow_start: an answer keeps this far below a bump that bounds it, because with TensorFlow's
# inter-op pool the batch where a bump begins moves between processes; 3% is 8 samples of
# small_cnn's (docs/probe-evidence.md, "Bumps"). With one inter-op thread the edge stays put
# (margins.bump_edge_fraction).
BUMP_EDGE_FRACTION = 0.03
# slow_start: fresh readings of the answer before it is given (search._repeat_answer). Some hosts
# draw one of two or more peak levels per process; three readings miss a level a share p of
# processes reach with probability (1 - p)^3, so they lower the risk, not remove it
# (docs/probe-evidence.md, "Peaks that differ between processes").
ANSWER_READINGS = 3
# Two fresh readings of one batch further apart than this (max / min - 1) mean the host's peaks are
# random between processes; with one inter-op thread steady hosts read within 0.05%
# (docs/probe-evidence.md, "Peaks that differ between processes"). Any spread lowers the budget
# readings are judged by (effective_budget_bytes).
SPREAD_NOISE_FRACTION = 0.01
# A fresh worker's out-of-memory failure is a transient only when a batch this many times larger
# fitted in a fresh worker (see contradicted; docs/probe-rules.md, "OOM_TRANSIENT_RATIO").
OOM_TRANSIENT_RATIO = 2
# slow_start: where each new process is a draw (an out-of-memory band, oom_band_seen, or peak
# levels, levels_seen) the answer needs this many times answer_readings fresh readings: n fits in
# a row pass a batch failing in a share p of processes with probability (1 - p)^n, 22% at p = 0.4
# for 3 and 5% for 6 (docs/probe-evidence.md, "An out-of-memory band" and "Peaks that differ
# between processes").
BAND_READINGS_FACTOR = 2


@dataclass(frozen=True)
class SearchConfig:
    budget_bytes: int
    start_batch: int = DEFAULT_START_BATCH
    # The largest batch the search may try; the answer (`Done.max_batch`) is at most this.
    max_batch_limit: int = DEFAULT_MAX_BATCH_LIMIT
    multiple: int = 1
    # Stop bisecting when the interval is within this share of the answer (or one `multiple`).
    tolerance: float = DEFAULT_TOLERANCE
    # The first jump lands this far under the predicted ceiling: the fit from a few small batches
    # can be off by a few percent (docs/tensorflow-memory.md, "Peak is jagged in batch size":
    # +-40 MiB steps), and a jump that overshoots costs a failed trial at the most expensive batch
    # of the probe.
    jump_margin: float = 0.04
    refuse_predicted_over_budget: bool = True
    # slow_start only: trials after the model is trusted, and the check of the failure above the
    # answer, run in fresh workers (see search.py).
    fresh_endgame: bool = True
    # The worker's memory before any trial batch (same measure as the peaks); only a one-shot
    # estimator reads it (the benchmark's one_shot_estimate, tools/bench/finders.py).
    baseline_bytes: int | None = None
    # slow_start only: a line known before the first trial (a probe per length: the token memory
    # model at this length, probing/token_fit.py). The search starts just under its ceiling, in
    # fresh workers, and steers by it turned through this search's own readings (search.py).
    prior_model: MemoryModel | None = None
    # slow_start only: how far the answer keeps below a bump that stands (search._clear_of_bump).
    bump_edge_fraction: float = BUMP_EDGE_FRACTION
    # slow_start with fresh_endgame only: fresh readings of the answer before it is given
    # (search._repeat_answer); 1 turns the repeats off.
    answer_readings: int = ANSWER_READINGS

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise UsageError(f"memory budget must be positive, got {self.budget_bytes!r} bytes")
        if self.multiple < 1:
            raise UsageError(f"--multiple must be >= 1, got {self.multiple!r}")
        if self.start_batch < 1:
            raise UsageError(f"--start must be >= 1, got {self.start_batch!r}")
        if self.max_batch_limit < self.multiple:
            raise UsageError(
                f"--max-batch-limit {self.max_batch_limit!r} is below --multiple {self.multiple!r}: no batch is allowed"
            )
        if not 0 <= self.bump_edge_fraction < 1:
            raise UsageError(f"bump_edge_fraction must be in [0, 1), got {self.bump_edge_fraction!r}")
        if self.answer_readings < 1:
            raise UsageError(f"answer_readings must be >= 1, got {self.answer_readings!r}")
        if not 0 < self.tolerance < 1:
            raise UsageError(f"tolerance must be in (0, 1), got {self.tolerance!r}")


@dataclass(frozen=True)
class Outcome:
    """What one trial showed. `ran` is False for an OOM (or a worker killed) and for a skip.

    `fresh`: the trial was the first trial batch of its worker process, so nothing kept from
    earlier trials lifted its reading. `measured` is False for a skip: its peak is the model's
    prediction. `forked`: the trial's worker was a fork-server child (True) or a new process
    (False); None when unknown, which counts as a new process.
    """

    batch: int
    ran: bool
    peak_bytes: int | None = None
    measured: bool = True
    fresh: bool = False
    forked: bool | None = None

    def fits(self, budget_bytes: int) -> bool:
        return self.ran and self.peak_bytes is not None and self.peak_bytes <= budget_bytes

    @property
    def reading(self) -> bool:
        """Whether `peak_bytes` is a measured peak (a trial that ran), not a prediction or nothing."""
        return self.ran and self.measured and self.peak_bytes is not None


@dataclass(frozen=True)
class Run:
    """Run a trial at `batch`; `fresh`: in a worker that has run no other trial batch.

    `readings`: how many fresh workers read the batch, where a fresh worker already read it (a
    repeat): each is a new process, side by side where the device has room (run_search.py). A first
    reading of a batch is always one trial.
    `new_process`: a fresh first reading that runs in a new process, as a repeat does, rather than
    in a fork-server child (search._fresh_endgame: where a child's reading would be read again in
    a new process anyway).
    """

    batch: int
    fresh: bool = False
    readings: int = 1
    new_process: bool = False


@dataclass(frozen=True)
class Skip:
    batch: int
    predicted_peak_bytes: int


@dataclass(frozen=True)
class Done:
    max_batch: int | None


Step = Run | Skip | Done


@dataclass(frozen=True)
class Finder:
    """A search as one pure decision, and what the loop that runs it (run_search.py) owes it.

    `next_step(config, outcomes)` is the next Step from every outcome so far: search.SLOW_START's is
    the probe's own; the benchmark passes the peers' (tools/bench/finders.py) on the same runner.
    `checks_answer`: it reads its answer in fresh workers until answer_readings_wanted agree, so
    the loop says when a band, a spread or a child's level asks for more of them. `name` is what
    a profile records as its search's `strategy`.
    """

    name: str
    next_step: Callable[[SearchConfig, Sequence[Outcome]], Step]
    checks_answer: bool = False


@dataclass(frozen=True)
class Edge:
    """What the outcomes say about the ceiling (see the module docstring).

    `lo`: the largest fit below every counted failure (0 when none); `hi`: the smallest counted
    failure (None when none); `counted`: the batches of every counted failure, ascending.
    """

    lo: int
    hi: int | None
    counted: tuple[int, ...]


def contradicted(failure: Outcome, outcomes: Sequence[Outcome], budget_bytes: int, band_floor_batch: int | None) -> bool:
    """Whether a fresh worker fitted `failure`'s batch or a larger one (for an over-budget reading, a
    larger one below every fresh out-of-memory failure that stands).

    A fresh worker that ran out of memory (no reading) is contradicted only by a fresh fit at
    OOM_TRANSIENT_RATIO times its batch or more: near the edge another process fitting the same or
    a slightly larger batch does not make it safe (docs/probe-rules.md, "OOM_TRANSIENT_RATIO").
    Over-budget readings of one batch that differ are handled by their spread
    (effective_budget_bytes) instead. `band_floor_batch`: band_floor(outcomes, budget_bytes),
    which counted_failures asks once for all its failures.
    """
    if failure.fresh and failure.measured and not failure.ran:
        return _transient(failure, outcomes, budget_bytes)
    # A fit at or above a fresh out-of-memory failure that stands is a draw in a band, not evidence
    # that smaller batches fit: counted as one, it let checked binsearch loop for 162 trials on mlp
    # (docs/probe-evidence.md, "What a probe costs, and why").
    return any(o.fresh and o.measured and o.batch >= failure.batch and o.fits(budget_bytes)
               and (band_floor_batch is None or o.batch < band_floor_batch) for o in outcomes)


def band_floor(outcomes: Sequence[Outcome], budget_bytes: int) -> int | None:
    """The smallest batch a fresh worker ran out of memory at that no fresh fit contradicts (None without one)."""
    return min((o.batch for o in outcomes if o.fresh and o.measured and not o.ran
                and not _transient(o, outcomes, budget_bytes)), default=None)


def _transient(oom: Outcome, outcomes: Sequence[Outcome], budget_bytes: int) -> bool:
    """Whether a fresh worker's out-of-memory failure is contradicted: a fresh fit at
    OOM_TRANSIENT_RATIO times its batch or more (see contradicted)."""
    return any(o.fresh and o.measured and o.fits(budget_bytes) and o.batch >= OOM_TRANSIENT_RATIO * oom.batch
               for o in outcomes)


def oom_band_seen(outcomes: Sequence[Outcome]) -> bool:
    """Whether fresh processes met the edge as a band: one ran out of memory at a batch where another
    fresh one ran, or below one that ran (under OOM_TRANSIENT_RATIO times its batch: above that the
    failure is a transient, see contradicted). Under a hard limit (an address-space cap) where each
    process draws "runs" or "runs out" the answer then needs more readings (BAND_READINGS_FACTOR)."""
    ooms = [o.batch for o in outcomes if o.fresh and o.measured and not o.ran]
    ran = [o.batch for o in outcomes if o.fresh and o.measured and o.ran]
    return any(oom <= batch < OOM_TRANSIENT_RATIO * oom for oom in ooms for batch in ran)


def levels_seen(outcomes: Sequence[Outcome]) -> bool:
    """Whether fresh readings show peak levels: readings of one batch that differ by more than the
    noise (peak_spread_fraction over SPREAD_NOISE_FRACTION), or a fork-server child that read one
    level above the steady lift children read at elsewhere (child_level_excess). Each new process
    then draws one of several peak levels, and the answer needs more readings
    (answer_readings_wanted) to meet a high one."""
    return peak_spread_fraction(outcomes) > SPREAD_NOISE_FRACTION or child_level_excess(outcomes) is not None


# The fewest batches read fresh both in a fork-server child and in a new process that can show
# whether children read a steady amount above new processes (steady_lift_bytes): two differences
# can disagree, one cannot.
MIN_LIFT_PAIRS = 2


def steady_lift_bytes(children: Mapping[Hashable, float], new_processes: Mapping[Hashable, float]) -> float | None:
    """How far children read above new processes where that is one steady amount, else None.

    Both map what was read (a batch, or a batch and a length) to its lowest fresh reading. The lift
    is the median difference over what both read, when more than half of those differences, and
    MIN_LIFT_PAIRS or more, lie within SPREAD_NOISE_FRACTION of the new processes' peaks of it.
    The amount changed between probes on one host, so it is measured in each probe, never carried
    over (docs/probe-evidence.md, "A child's level above the steady lift" and "A steady lift in
    fork-server children").
    """
    shared = sorted(children.keys() & new_processes.keys(), key=str)
    if len(shared) < MIN_LIFT_PAIRS:
        return None
    differences = [children[key] - new_processes[key] for key in shared]
    lift = statistics.median(differences)
    agreement = SPREAD_NOISE_FRACTION * min(new_processes[key] for key in shared)
    agreeing = sum(abs(difference - lift) <= agreement for difference in differences)
    if agreeing < MIN_LIFT_PAIRS or 2 * agreeing <= len(differences):
        return None
    return float(lift)


def lowest_by_worker_kind(readings: Iterable[tuple[Hashable, float, bool]]) -> tuple[dict, dict]:
    """(children's, new processes') lowest reading of each key, from (key, peak, forked) fresh readings."""
    children: dict = {}
    new_processes: dict = {}
    for key, peak, forked in readings:
        side = children if forked else new_processes
        side[key] = min(float(peak), side.get(key, math.inf))
    return children, new_processes


def lowest_fresh_readings(outcomes: Sequence[Outcome]) -> tuple[dict[int, float], dict[int, float]]:
    """(children's, new processes') lowest fresh reading of each batch; `forked` None is neither."""
    return lowest_by_worker_kind((o.batch, o.peak_bytes, o.forked) for o in outcomes
                                 if o.fresh and o.reading and o.peak_bytes > 0 and o.forked is not None)


def child_level_excess(outcomes: Sequence[Outcome]) -> tuple[int, float, float] | None:
    """(batch, bytes above the steady lift, the lift) of the batch whose child read furthest above
    its new process beyond the steady lift (steady_lift_bytes), when that is more than
    SPREAD_NOISE_FRACTION of the new process's peak; None otherwise, or without a steady lift.

    Such a child drew a higher level, and new processes can too: after one, a test's fresh process
    read small_cnn's answer over the budget (docs/probe-evidence.md, "A child's level above the
    steady lift"). A reading above every new process is still not spread (peak_spread_fraction):
    it marks levels, and the answer's readings double; it does not lower the budget.
    """
    children, new_processes = lowest_fresh_readings(outcomes)
    lift = steady_lift_bytes(children, new_processes)
    if lift is None:
        return None
    excesses = [(children[b] - new_processes[b] - lift, b) for b in children.keys() & new_processes.keys()]
    excess, batch = max(excesses)
    if excess <= SPREAD_NOISE_FRACTION * new_processes[batch]:
        return None
    return batch, excess, lift


def answer_readings_wanted(answer_readings: int, outcomes: Sequence[Outcome]) -> int:
    """Fresh readings an answer needs: `answer_readings`, BAND_READINGS_FACTOR times that where each
    new process is a draw (an out-of-memory band, oom_band_seen, or peak levels, levels_seen)."""
    drawn = oom_band_seen(outcomes) or levels_seen(outcomes)
    return answer_readings * (BAND_READINGS_FACTOR if drawn else 1)


def counted_failures(outcomes: Sequence[Outcome], budget_bytes: int) -> list[Outcome]:
    """The failures no fresh fit contradicts, smallest batch first."""
    failed = [o for o in outcomes if not o.fits(budget_bytes)]
    floor = band_floor(outcomes, budget_bytes)
    return sorted((o for o in failed if not contradicted(o, outcomes, budget_bytes, floor)), key=lambda o: o.batch)


def peak_spread_fraction(outcomes: Sequence[Outcome]) -> float:
    """The widest spread between fresh readings of one batch, as high / low - 1 (0.0 without repeats).

    Only fresh workers count: a reused worker reads high from what earlier trials left behind.
    `low` is the batch's lowest fresh reading; `high` its highest in a new process (`forked` not
    True), or its highest at all when every reading came from fork-server children. What a child
    reads above every new process is not spread: training runs in a new process, and the child's
    reading was only ever judged on the safe side of it: taken as spread, a child's high reading
    of text_cnn lowered the budget and failed a batch fresh processes fit (docs/probe-evidence.md,
    "Peaks that differ between processes"). A child reading below the new processes still widens
    the spread (docs/probe-rules.md, "effective_budget_bytes").
    """
    return max((high / low - 1 for high, low in repeated_fresh_readings(outcomes).values()), default=0.0)


def repeated_fresh_readings(outcomes: Sequence[Outcome]) -> dict[int, tuple[float, float]]:
    """{batch: (high, low)} for each batch read fresh more than once, high and low as
    peak_spread_fraction takes them (its docstring says why a child's reading is not a high)."""
    by_batch: dict[int, list[Outcome]] = {}
    for o in outcomes:
        if o.fresh and o.reading and o.peak_bytes > 0:
            by_batch.setdefault(o.batch, []).append(o)
    repeated = {}
    for batch, readings in by_batch.items():
        if len(readings) < 2:
            continue
        in_new_processes = [o.peak_bytes for o in readings if o.forked is not True]
        high = max(in_new_processes or [o.peak_bytes for o in readings])
        repeated[batch] = (high, min(o.peak_bytes for o in readings))
    return repeated


def effective_budget_bytes(outcomes: Sequence[Outcome], budget_bytes: float) -> int:
    """The budget a reading must fit: `budget_bytes` lowered by the spread of repeated fresh readings,
    budget / (1 + spread) (the budget itself without repeats).

    A batch whose lowest reading fits the lowered budget then fits the real one at its highest
    reading seen, and so does a larger batch whose one reading fits it, as far as the spread seen
    is the spread there is. Even a spread within the noise lowers it: the answer must fit at every
    reading (docs/probe-rules.md, "effective_budget_bytes").
    """
    return lowered_by_spread(budget_bytes, peak_spread_fraction(outcomes))


def lowered_by_spread(budget_bytes: float, spread_fraction: float) -> int:
    """budget / (1 + spread): the budget a reading must fit so that its highest repeat fits the real one."""
    return int(budget_bytes / (1 + spread_fraction))


def with_effective_budget(config: SearchConfig, outcomes: Sequence[Outcome]) -> SearchConfig:
    """`config` with the budget a reading must fit (effective_budget_bytes) in place of its own."""
    budget = effective_budget_bytes(outcomes, config.budget_bytes)
    return config if budget == config.budget_bytes else replace(config, budget_bytes=budget)


def edge_of(outcomes: Sequence[Outcome], budget_bytes: int) -> Edge:
    """The ceiling the outcomes show under `budget_bytes` (the module docstring's rule).

    Callers pass the effective budget (effective_budget_bytes) when repeated readings may differ.
    """
    counted = counted_failures(outcomes, budget_bytes)
    first_failure = counted[0].batch if counted else None
    lo = max(
        (o.batch for o in outcomes if o.fits(budget_bytes) and (first_failure is None or o.batch < first_failure)),
        default=0,
    )
    return Edge(lo=lo, hi=first_failure, counted=tuple(o.batch for o in counted))


def round_down(batch: float, multiple: int) -> int:
    return int(batch // multiple) * multiple


def first_batch(config: SearchConfig) -> int:
    """The start batch, rounded up to the multiple and capped by max_batch_limit."""
    start = -(-config.start_batch // config.multiple) * config.multiple
    return min(start, round_down(config.max_batch_limit, config.multiple))
