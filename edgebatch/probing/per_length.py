"""A probe per sequence length: one search per length, sharing what the lengths before it showed.

For a model with a variable sequence axis (`edgebatch probe --seq-lens 64,128,256,512`, or the
default ladder up to the model's longest length), each length gets the probe's own search
(search.py, in workers started for that length: a worker's memory holds what its earlier trials
used, so none crosses lengths). The shortest and the longest length are searched first and in full;
after them the token memory model (token_fit.py) fitted over every reading so far predicts the line
at the next length, and that search starts just under the predicted ceiling, in fresh workers,
steering by the prediction turned through its own readings (memory_fit.prior_through_readings).

`resolve_lengths` (which lengths, or a one-line UsageError) and `summarise_lengths` (the table and
the model from the trials) are pure; `search_lengths` drives the workers through the `search`
callable it is given (run_search.run_search).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from edgebatch.errors import UsageError
from edgebatch.probing import summary, token_fit
from edgebatch.probing.memory_fit import prior_through_readings
from edgebatch.probing.outcomes import MIN_LIFT_PAIRS, SearchConfig, lowest_by_worker_kind, steady_lift_bytes
from edgebatch.profiles.model import LengthCeiling, MemoryModel, TokenMemoryModel, Trial
from edgebatch.models.zoo import SEQUENCE_MODEL_MAX_LENGTHS, ModelSpec


def resolve_lengths(spec: ModelSpec, seq_lens) -> tuple[int, ...] | None:
    """The lengths to probe, from `--seq-lens` or a built-in's default ladder; None for a plain probe.

    What can be told without building the model is refused here in one line: --seq-lens for a
    built-in without a sequence axis, or beyond a built-in's longest length. A user's model is
    checked once its worker has built it (check_sequence_axis).
    """
    lengths = token_fit.parse_seq_lens(seq_lens)
    if spec.kind != "builtin":
        return lengths
    longest = SEQUENCE_MODEL_MAX_LENGTHS.get(spec.name)
    if longest is None:
        if lengths is not None:
            raise UsageError(
                f"--seq-lens applies to models with a variable sequence axis ({', '.join(sorted(SEQUENCE_MODEL_MAX_LENGTHS))}, "
                f"or your own with an input of shape (None,)); {spec.name} has a fixed input shape"
            )
        return None
    if lengths is None:
        return token_fit.default_lengths(longest)
    if lengths[-1] > longest:
        raise UsageError(f"{spec.name} takes at most {longest} tokens; --seq-lens asks for {lengths[-1]}")
    return lengths


def check_sequence_axis(model_name: str, lengths: tuple[int, ...] | None, has_sequence_axis: bool) -> None:
    """--seq-lens for a model its worker built without a variable axis is a UsageError of one line."""
    if lengths is not None and not has_sequence_axis:
        raise UsageError(
            f"--seq-lens applies to models with a variable sequence axis (an input of shape (None,)); "
            f"{model_name}'s inputs have fixed shapes: probe it without --seq-lens"
        )


# One search of one length: (config, setup) -> (trials, Done). The probe binds the rest of
# run_search's arguments (workers, measure, progress, fork server, room watch) once for all lengths.
Search = Callable[[SearchConfig, object], tuple[list[Trial], object]]


def search_lengths(lengths: Sequence[int], config: SearchConfig, setup, workers: list, progress,
                   search: Search) -> dict[int, tuple[list[Trial], int | None]]:
    """Run `search` (run_search.run_search) once per length in token_fit.probe_order; length -> (trials, max_batch).

    Trials come back marked with their `seq_len`. `workers` holds the scout, started for the first
    length in that order, and is the list `search` runs its workers from; each later length closes
    every worker first.
    """
    results: dict[int, tuple[list[Trial], int | None]] = {}
    earlier: list[Trial] = []
    for index, length in enumerate(token_fit.probe_order(lengths)):
        if index > 0:
            for worker in workers:
                worker.close()
            workers.clear()
        model = token_fit.fit_token_model(token_readings(earlier))
        prior = model.line_at(length) if token_fit.trusted(model) else None
        if prior is None:
            progress(f"length {length} tokens: searching from batch {config.start_batch}")
        else:
            progress(
                f"length {length} tokens: the token memory model (fitted on lengths "
                f"{', '.join(map(str, model.lengths))}) puts the ceiling near batch "
                f"{prior.batch_for_bytes(config.budget_bytes)}; starting just under it"
            )
        length_config = dataclasses.replace(config, prior_model=prior)
        length_setup = dataclasses.replace(setup, sequence_length=length)
        trials, final = search(length_config, length_setup)
        trials = [dataclasses.replace(trial, seq_len=length) for trial in trials]
        earlier += trials
        results[length] = (trials, final.max_batch)
    return {length: results[length] for length in sorted(results)}


def token_readings(trials: Sequence[Trial]) -> list[token_fit.TokenReading]:
    """(batch, length, peak) of every trial with a length that measured a peak, over budget or not,
    at the level of a new process: a trial in a fork-server child less child_lift_bytes."""
    lift = child_lift_bytes(trials)
    return [
        (t.batch, t.seq_len, t.peak_bytes - (lift if t.forked else 0.0))
        for t in trials if t.seq_len and t.measured and t.peak_bytes is not None
    ]


def child_lift_bytes(trials: Sequence[Trial]) -> float:
    """How far fork-server children read above new processes, where that is one steady amount
    (outcomes.steady_lift_bytes over the (batch, length) pairs read fresh both ways); else 0.0.

    Fitted over both levels, children's and new processes', the token model read too crooked to
    trust; with the children's readings moved down by the lift it fits (tests/test_probe_per_length.py
    replays two such runs). Differences with no agreeing majority (a child or a new process drawing
    one of two levels at random: token_fit.fit_token_model) are no steady amount, and the low-level
    fit handles them.

    Where fewer than MIN_LIFT_PAIRS batches were read both ways (the search reads a batch the line
    puts just over the budget in a new process at once, so such pairs are few), the lift is the
    children's offset in one fit over every reading of known kind (token_fit.children_offset_bytes),
    when that fit is trusted and the offset positive (docs/probe-evidence.md, "A steady lift in
    fork-server children").
    """
    children, new_processes = lowest_by_worker_kind(
        ((t.batch, t.seq_len), t.peak_bytes, t.forked) for t in trials
        if t.fresh and t.measured and t.peak_bytes is not None and t.forked is not None
    )
    lift = steady_lift_bytes(children, new_processes)
    if lift is None and len(children.keys() & new_processes.keys()) < MIN_LIFT_PAIRS:
        offset = token_fit.children_offset_bytes(
            (t.batch, t.seq_len, t.peak_bytes, t.forked) for t in trials
            if t.seq_len and t.measured and t.peak_bytes is not None and t.forked is not None
        )
        lift = offset if offset is not None and offset > 0 else None
    return 0.0 if lift is None else lift


@dataclasses.dataclass(frozen=True)
class LengthSummary:
    per_length: dict[int, LengthCeiling]
    token_model: TokenMemoryModel | None
    lines: dict[int, MemoryModel | None]  # each length's line in batch (its memory model)


def summarise_lengths(results: dict[int, tuple[list[Trial], int]], fit_budget_bytes: float, headroom: float,
                      multiple: int) -> LengthSummary:
    """The per-length table and the token model, read from the trials by the profile's own rules.

    Each length's safe batch is summary.safe_batch_of's, with that length's line: its own memory
    model when trusted, else the token model's line there turned through its readings (a search
    that started at the prediction has too few readings to trust a line of its own).
    """
    all_trials = [trial for trials, _ in results.values() for trial in trials]
    model = token_fit.fit_token_model(token_readings(all_trials))
    model = model if token_fit.trusted(model) else None
    table, lines = {}, {}
    for length, (trials, max_batch) in sorted(results.items()):
        line = summary.memory_model_of(trials)
        if line is None and model is not None:
            line = prior_through_readings(model.line_at(length), summary.readings_of(trials))
        lines[length] = line
        safe = summary.safe_batch_of(trials, fit_budget_bytes, headroom, multiple, line, max_batch)
        peak = max((t.peak_bytes for t in trials if t.ok and t.batch == max_batch and t.peak_bytes is not None),
                   default=None)
        table[length] = LengthCeiling(max_batch=max_batch, safe_batch=safe if safe is not None else multiple,
                                      peak_bytes=peak)
    return LengthSummary(table, model, lines)
