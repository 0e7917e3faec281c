"""What a finished search means: max, safe and knee batches. Pure: trials in, numbers out.

The trials are read through the search's own evidence rule (outcomes.edge_of) and memory model
(memory_fit.memory_model_of, memory_fit.trusted), so max_batch, safe_batch and the recorded model
come from one reading of the same outcomes the search decided on: a failure that a fresh worker
contradicted is in the trials but bounds nothing, and no safe batch lies above a failure that
counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgebatch.probing import memory_fit
from edgebatch.probing.margins import HIDDEN_LIMIT_MARGIN
from edgebatch.probing.outcomes import Edge, Outcome, counted_failures, edge_of, lowered_by_spread, peak_spread_fraction
from edgebatch.profiles.model import MemoryModel, Trial

# Throughput within 5% of the best counts as the plateau (the definition of the knee).
KNEE_FRACTION = 0.95
# Failures that are the device's (a raised OOM, a killed worker, a trial that pushed the worker
# into swap), not the budget's verdict.
DEVICE_FAILURES = ("oom", "worker_killed", "swapped")


def outcome_of(trial: Trial) -> Outcome:
    """The search's view of a recorded trial: it ran when it measured a peak (over budget or not)."""
    return Outcome(
        batch=trial.batch,
        ran=trial.measured and trial.peak_bytes is not None,
        peak_bytes=trial.peak_bytes,
        measured=trial.measured,
        fresh=trial.fresh,
        forked=trial.forked,
    )


def spread_fraction_of(trials: Sequence[Trial]) -> float:
    """The widest spread of repeated fresh readings of one batch (outcomes.peak_spread_fraction),
    taken within each sequence length: a probe per length reads a batch at 64 and at 512 tokens in
    different workers, and those are not one batch's readings."""
    by_length: dict[int | None, list[Outcome]] = {}
    for trial in trials:
        by_length.setdefault(trial.seq_len, []).append(outcome_of(trial))
    return max((peak_spread_fraction(outcomes) for outcomes in by_length.values()), default=0.0)


def judged_budget_bytes(trials: Sequence[Trial], budget_bytes: float) -> int:
    """The budget the search judged readings by: lowered by the spread of repeated fresh readings of
    one batch (outcomes.lowered_by_spread, as effective_budget_bytes lowers it in the search).
    Over a probe per length's trials, the widest spread of any length (spread_fraction_of)."""
    return lowered_by_spread(budget_bytes, spread_fraction_of(trials))


def edge_of_trials(trials: Sequence[Trial], budget_bytes: float) -> Edge:
    return edge_of([outcome_of(t) for t in trials], budget_bytes)


def fitting_trials(trials: Sequence[Trial], budget_bytes: float) -> list[Trial]:
    return [t for t in trials if t.ok and t.measured and t.peak_bytes is not None and t.peak_bytes <= budget_bytes]


def readings_of(trials: Sequence[Trial]) -> list[memory_fit.Reading]:
    """(batch, peak, fresh) of every trial that measured a peak, over budget or not."""
    return [(t.batch, t.peak_bytes, t.fresh) for t in trials if t.measured and t.peak_bytes is not None]


def memory_model_of(trials: Sequence[Trial]) -> MemoryModel | None:
    """The search's memory model of these trials (memory_fit.memory_model_of): None when not trusted."""
    return memory_fit.memory_model_of(readings_of(trials))


def max_batch_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    """The largest fit below every failure that counts (outcomes.edge_of, under judged_budget_bytes);
    None when nothing fits."""
    return edge_of_trials(trials, judged_budget_bytes(trials, budget_bytes)).lo or None


def safe_batch_of(
    trials: Sequence[Trial],
    budget_bytes: float,
    headroom: float,
    multiple: int,
    model: MemoryModel | None,
    max_batch: int | None = None,
) -> int | None:
    """Largest batch whose peak fits budget x (1 - headroom), never above the edge or `max_batch`.

    The spread between fresh processes is in the budget the search judged by
    (judged_budget_bytes), counted once; `headroom` (margins.DEFAULT_HEADROOM) holds what training
    adds to the probe's bare step.

    The edge is max_batch_of's; `max_batch` is the search's answer when one is given (a peer's
    finder can answer above a failure, the safe batch still stays under it). With a memory model,
    the readings at or below that ceiling decide, each batch at its level (batch_levels), along
    the memory line (line_safe_batch). Without a model, the largest measured fit under the
    reduced budget.

    When the ceiling is a limit the budget does not see (hidden_limit_edge_of), the safe batch
    keeps margins.HIDDEN_LIMIT_MARGIN (or the headroom, if larger) of that edge clear, in samples:
    its exact place moves by a few percent between processes (an address-space cap: 256 ran in
    the probe's worker and failed in the next fresh process).

    Never below `multiple` while anything fits: the smallest allowed batch is below every failure
    that counts (the edge is a fit), so no fallback lands above one. None when nothing fits.
    Readings are judged by judged_budget_bytes, as the search judged them.
    """
    judged = judged_budget_bytes(trials, budget_bytes)
    ceiling = edge_of_trials(trials, judged).lo
    if max_batch is not None:
        ceiling = min(ceiling, max_batch)
    if ceiling < multiple:
        return None
    if model is None or model.per_sample_bytes <= 0:
        fits = [t for t in fitting_trials(trials, judged) if t.batch <= ceiling]
        safe = max((t.batch for t in fits if t.peak_bytes <= judged * (1 - headroom)), default=0)
    else:
        safe = line_safe_batch(trials, budget_bytes * (1 - headroom), model.per_sample_bytes, ceiling)
    safe = min(safe, ceiling)
    edge = hidden_limit_edge_of(trials, judged, model)
    if edge is not None:
        safe = min(safe, math.floor(edge * (1 - max(headroom, HIDDEN_LIMIT_MARGIN))))
    return max(safe // multiple * multiple, multiple)


def anchor_bounds(trials: Sequence[Trial], budget_bytes: float, headroom: float,
                  per_sample_bytes: float) -> list[tuple[int, Trial]]:
    """The memory line's bridge between readings (budget_answer.py): every fit under the judged
    budget and every fresh reading, each with the largest batch it allows (_anchor_bound), smallest
    bound first. `budget_bytes`: the budget before any spread lowered it (judged_budget_bytes
    lowers it here)."""
    judged = judged_budget_bytes(trials, budget_bytes)
    fresh = [t for t in trials if t.fresh and t.measured and t.peak_bytes is not None]
    anchors = list(dict.fromkeys(fitting_trials(trials, judged) + fresh))  # a fresh fit is both, once
    bounds = [(_anchor_bound(t, judged * (1 - headroom), budget_bytes * (1 - headroom), per_sample_bytes), t)
              for t in anchors]
    return sorted(bounds, key=lambda pair: pair[0])


def batch_levels(trials: Sequence[Trial]) -> dict[int, Trial]:
    """{batch: the reading it stands for}: its highest reading in a new process where one read it
    (training runs in one; a fork-server child can read well above), else its highest reading."""
    readings = [t for t in trials if t.measured and t.peak_bytes is not None]
    new_process = {t.batch for t in readings if t.fresh and t.forked is False}
    levels: dict[int, Trial] = {}
    for t in readings:
        if t.batch in new_process and not (t.fresh and t.forked is False):
            continue
        if t.batch not in levels or t.peak_bytes > levels[t.batch].peak_bytes:
            levels[t.batch] = t
    return levels


def line_safe_batch(trials: Sequence[Trial], safe_budget_bytes: float, per_sample_bytes: float, ceiling: int) -> int:
    """The largest batch up to `ceiling` that every level at or above it (batch_levels), stepped
    down the memory line to it, and the nearest level below it, stepped up, put under
    `safe_budget_bytes`; 0 where none does.

    Levels above the ceiling are the ceiling's evidence, not the safe batch's: memory can jump in
    steps there, far off the line's slope. A level far below is superseded by a nearer one: the
    slope is an average (docs/probe-rules.md, "safe_batch").
    """
    levels = sorted((batch, t.peak_bytes) for batch, t in batch_levels(trials).items() if batch <= ceiling)

    def allowed(batch: int) -> bool:
        below = [(b, peak) for b, peak in levels if b < batch]
        above_ok = all(peak - (b - batch) * per_sample_bytes <= safe_budget_bytes for b, peak in levels if b >= batch)
        return above_ok and (not below or below[-1][1] + (batch - below[-1][0]) * per_sample_bytes <= safe_budget_bytes)

    return next((batch for batch in range(ceiling, 0, -1) if allowed(batch)), 0)


def level_bounds(trials: Sequence[Trial], safe_budget_bytes: float, per_sample_bytes: float,
                 ceiling: int) -> list[tuple[int, Trial]]:
    """For people (tools/bench/answer_failures.py): each level at or below `ceiling` with the batch
    it allows alone along the memory line, smallest first. line_safe_batch's answer is at most the
    smallest of those at or above it."""
    levels = [t for batch, t in batch_levels(trials).items() if batch <= ceiling]
    bounds = [(t.batch + math.floor((safe_budget_bytes - t.peak_bytes) / per_sample_bytes), t) for t in levels]
    return sorted(bounds, key=lambda pair: pair[0])


def _anchor_bound(anchor: Trial, safe_budget: float, unlowered_safe_budget: float, per_sample_bytes: float) -> int:
    """The largest batch one reading allows, stepping per_sample_bytes per sample from its own
    peak: down to the unlowered safe budget when it reads over that, else up to the lowered one
    (safe_batch_of). A reading carried down to a smaller batch keeps its own level, and the
    highest reading behind a spread is itself an anchor, so the spread is not taken off again;
    one carried up may meet a larger level there. Both lowered counted one level twice (text_cnn's
    safe batch was 99 of 710: docs/probe-evidence.md, "Counted: how often an answer goes over")."""
    down = anchor.batch + math.floor((unlowered_safe_budget - anchor.peak_bytes) / per_sample_bytes)
    if down <= anchor.batch:
        return down
    return anchor.batch + math.floor((safe_budget - anchor.peak_bytes) / per_sample_bytes)


def hidden_limit_edge_of(trials: Sequence[Trial], budget_bytes: float, model: MemoryModel | None) -> int | None:
    """The largest fit below a device failure the budget does not explain, or None.

    A failure (OOM raised, worker killed) at a batch the memory model puts within the budget means
    something else binds: an address-space or cgroup limit, another process. Without a model
    every device failure counts. Only failures that count (outcomes.counted_failures) are read: a
    worker killed once at a batch that later fitted in a fresh worker is a transient. The edge is
    the largest fit below the smallest such failure.
    """
    outcomes = [outcome_of(t) for t in trials]
    counted = {o.batch for o in counted_failures(outcomes, budget_bytes)}
    fits = fitting_trials(trials, budget_bytes)
    failed = [
        t.batch for t in trials
        if not t.ok and t.measured and t.error in DEVICE_FAILURES and t.batch in counted
        and (model is None or model.per_sample_bytes <= 0 or model.predict_bytes(t.batch) <= budget_bytes)
    ]
    if not fits or not failed:
        return None
    first_failure = min(failed)
    below = [t.batch for t in fits if t.batch < first_failure]
    return max(below) if below else None


def throughput_knee_of(trials: Sequence[Trial], budget_bytes: float) -> int | None:
    """Smallest batch within 5% of the best steady-state samples/s seen among trials that fit.

    A trial that timed its warm-up step (`steady` False: one step took longer than trial_seconds)
    is left out: the first step at a new size faults its memory in, and the committed
    mobilenet_v2 profile read 40-48 samples/s at 1248-1959 that way where training at 1024 runs
    at 125, which put its knee at 32.
    """
    budget_bytes = judged_budget_bytes(trials, budget_bytes)
    fits = [t for t in fitting_trials(trials, budget_bytes) if t.samples_per_second and t.steady is not False]
    if not fits:
        return None
    best = max(t.samples_per_second for t in fits)
    return min(t.batch for t in fits if t.samples_per_second >= KNEE_FRACTION * best)
