"""A cached profile's answer at a budget below its own, from the readings it already holds. Pure.

A probe's trials read the peak of many batches; every reading that fits a smaller budget still
fits it, and every one over it is still over. So a smaller budget is answered without a trial:
the edge is re-read from the same outcomes (outcomes.edge_of, as the search reads them), and where
the readings leave it wider than the search's tolerance the profile's memory line bridges the gap
from the readings (summary.anchor_bounds), never past a reading over the budget. The safe batch is
summary's rule at the new budget. A per-length profile, or one with no memory line where the
readings are too far apart, cannot answer: the caller probes again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from edgebatch.probing import summary
from edgebatch.probing.margins import HIDDEN_LIMIT_MARGIN
from edgebatch.probing.outcomes import round_down
from edgebatch.profiles.model import DeviceProfile, MemoryModel, Trial
from edgebatch.profiles.schema import SAFE_RULE_SCHEMA, SCHEMA_VERSION
from edgebatch.units import format_bytes


@dataclass(frozen=True, kw_only=True)
class BudgetQuestion:
    """What is asked of the cached readings: the budget, and the margins the answer is judged by."""

    budget_bytes: int
    # The figure a reading must stay under (margins.fit_budget_bytes of budget_bytes).
    fit_budget_bytes: int
    headroom: float
    multiple: int
    tolerance: float


@dataclass(frozen=True, kw_only=True)
class BudgetAnswer:
    """The answer at `budget_bytes`. `read_batch`: the largest batch read under it; `over_batch`: the
    smallest read over it (None: none was). `on_line`: max_batch lies between those two readings,
    from the memory line, not itself read."""

    budget_bytes: int
    max_batch: int
    safe_batch: int
    read_batch: int
    over_batch: int | None
    on_line: bool

    def describe(self) -> str:
        """One line for people: where the answer came from."""
        over = f", {self.over_batch} read over it" if self.over_batch is not None else ""
        source = (f"on the memory line between readings at {self.read_batch} (fits){over}" if self.on_line
                  else f"read under it{over}")
        return (f"max_batch {self.max_batch} ({source}), safe_batch {self.safe_batch} "
                f"at {format_bytes(self.budget_bytes)}")


def question_at(cached_budget_bytes: int, budget_bytes: int, fit_budget_bytes: int, *, headroom: float, multiple: int,
                tolerance: float) -> BudgetQuestion:
    """What a cached profile's readings are asked for a probe at `budget_bytes`: that budget, or the
    profile's own where the probe's is larger (reuse.py lets it be larger by a few percent, and the
    readings answer no larger budget), its fit figure scaled alike."""
    if budget_bytes > cached_budget_bytes:
        fit_budget_bytes = int(fit_budget_bytes * cached_budget_bytes / budget_bytes)
        budget_bytes = cached_budget_bytes
    return BudgetQuestion(budget_bytes=budget_bytes, fit_budget_bytes=fit_budget_bytes, headroom=headroom,
                          multiple=multiple, tolerance=tolerance)


def why_read_again(profile: DeviceProfile, question: BudgetQuestion) -> str:
    """Why a reused profile's answer is read from its readings, as part of one line for people."""
    if question.budget_bytes < profile.budget_bytes:
        return f"probed under {format_bytes(profile.budget_bytes)}, its readings answer this smaller budget"
    if profile.schema_version < SAFE_RULE_SCHEMA:
        return (f"its safe_batch came from an older rule (schema {profile.schema_version}, headroom "
                f"{profile.headroom:.0%}), its readings answer this one's (headroom {question.headroom:.0%})")
    return (f"it was probed with --headroom {profile.headroom:.0%}, its readings answer this probe's "
            f"{question.headroom:.0%}")


def answer_at(trials: Sequence[Trial], model: MemoryModel | None, question: BudgetQuestion,
              ceiling_batch: int, ceiling_safe_batch: int | None = None) -> BudgetAnswer | str:
    """The answer the `trials` give at a budget at or below the one they were read under, or why
    they give none (a line for people).

    `ceiling_batch` and `ceiling_safe_batch`: the profile's own max_batch and safe_batch, which the
    answer at a smaller budget never passes (max_batch may be a --max-batch-limit the readings never
    met; safe_batch may come from an older, stricter rule, and a smaller budget must not give more).
    """
    judged = summary.judged_budget_bytes(trials, question.fit_budget_bytes)
    edge = summary.edge_of_trials(trials, judged)
    read = min(edge.lo, ceiling_batch)
    if read < question.multiple:
        return f"no batch it read fits {format_bytes(question.budget_bytes)}"
    over = edge.hi if edge.hi is not None and edge.hi > read else None
    closed = over is None or over - read <= max(question.multiple, question.tolerance * read)
    max_batch = read
    if not closed:
        if model is None or model.per_sample_bytes <= 0:
            return (f"its readings at {read} (fits) and {over} (over) leave the edge at "
                    f"{format_bytes(question.budget_bytes)} open and it has no memory line to bridge them")
        line_bound = _line_bound(trials, question.fit_budget_bytes, 0.0, model)
        max_batch = max(read, round_down(min(line_bound, over - 1, ceiling_batch), question.multiple))
    safe = _safe_batch(trials, model, question, judged, max_batch)
    if ceiling_safe_batch is not None:
        safe = max(min(safe, ceiling_safe_batch), question.multiple)
    return BudgetAnswer(budget_bytes=question.budget_bytes, max_batch=max_batch, safe_batch=safe,
                        read_batch=read, over_batch=over, on_line=max_batch > read)


def _line_bound(trials: Sequence[Trial], fit_budget_bytes: int, headroom: float, model: MemoryModel) -> int:
    """The largest batch every reading allows, stepping along the memory line from its own peak
    (summary.anchor_bounds): the smallest anchor's bound."""
    bounds = summary.anchor_bounds(trials, fit_budget_bytes, headroom, model.per_sample_bytes)
    return bounds[0][0] if bounds else 0


def _safe_batch(trials: Sequence[Trial], model: MemoryModel | None, question: BudgetQuestion, judged: int,
                max_batch: int) -> int:
    """The training batch at the new budget, by summary.safe_batch_of's rule: along the memory line
    from the readings at or below max_batch (summary.line_safe_batch; without a line, the largest
    fit under budget x (1 - headroom)), under a limit the budget does not see
    (summary.hidden_limit_edge_of), never above max_batch, never below the multiple."""
    if model is None or model.per_sample_bytes <= 0:
        safe_budget = judged * (1 - question.headroom)
        safe = max((t.batch for t in summary.fitting_trials(trials, safe_budget)), default=0)
    else:
        safe = summary.line_safe_batch(trials, question.fit_budget_bytes * (1 - question.headroom),
                                       model.per_sample_bytes, max_batch)
    edge = summary.hidden_limit_edge_of(trials, judged, model)
    if edge is not None:
        safe = min(safe, int(edge * (1 - max(question.headroom, HIDDEN_LIMIT_MARGIN))))
    safe = min(safe, max_batch)
    return max(round_down(safe, question.multiple), question.multiple)


def rejudged(trials: Sequence[Trial], fit_budget_bytes: int) -> tuple[Trial, ...]:
    """The trials as a probe at the smaller budget would have recorded them: a reading that fitted
    the old budget and is over the new one becomes an over-budget trial."""
    return tuple(
        dataclasses.replace(t, ok=False, error="over_budget")
        if t.ok and t.measured and t.peak_bytes is not None and t.peak_bytes > fit_budget_bytes else t
        for t in trials
    )


def profile_at(profile: DeviceProfile, answer: BudgetAnswer, question: BudgetQuestion,
               budget_source: str) -> DeviceProfile:
    """`profile` as its answer to `question`: the budget (from `budget_source`), max and safe
    batches, knee, predicted ceiling and trials' verdicts of that budget, summarised by this
    schema's rule. Not saved: the file keeps the readings' own budget, which answers every smaller
    one."""
    fit_budget_bytes = question.fit_budget_bytes
    trials = rejudged(profile.trials, fit_budget_bytes)
    model = profile.memory_model
    predicted = model.batch_for_bytes(fit_budget_bytes) if model is not None and model.per_sample_bytes > 0 else None
    return dataclasses.replace(
        profile,
        budget_bytes=answer.budget_bytes,
        budget_source=budget_source,
        schema_version=SCHEMA_VERSION,
        headroom=question.headroom,
        max_batch=answer.max_batch,
        safe_batch=answer.safe_batch,
        throughput_knee=summary.throughput_knee_of(trials, fit_budget_bytes),
        predicted_ceiling=predicted,
        trials=trials,
    )
