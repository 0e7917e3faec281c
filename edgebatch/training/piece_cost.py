"""Where to cut an update of variable-length examples: a piece's predicted seconds, and the cut
that minimises their sum.

fit pads each piece to its own longest example (sequences.py). One piece per ceiling wastes the
padding between its shortest and longest; one piece per length wastes a step's fixed cost each
time. `PieceCost` predicts a piece of n examples padded to L tokens to take

    overhead_seconds + seconds_per_token x n x L + seconds_per_token_squared x n x L^2

(the L^2 term is attention), fitted to the step times a probe per length measured at each of its
lengths (`from_trials`). `cut` then picks the consecutive pieces of a length-sorted update with the
least predicted time, each within the ceiling its longest example allows: padding is run only where
it costs less than another step. Which examples share an update does not change, so the update's
gradient is the same exact mean.

A probe's step also applies the optimizer, which fit does once per update, not per piece, so the
probe's fixed cost is above a piece's. fit therefore times its pieces and refits the cost from them
(`PieceTimes`) once it has enough, and cuts by that.

Pure: numpy and scipy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PieceCost", "PieceTimes"]

# Fewer steady trials than this, or trials at one length only, leave the three terms undetermined.
MIN_TRIALS = 4
# fit refits from its own pieces once it has timed this many, and again after as many more.
REFIT_PIECES = 32


@dataclass(frozen=True)
class PieceCost:
    """Predicted seconds of one piece (module docstring); every coefficient >= 0."""

    overhead_seconds: float
    seconds_per_token: float
    seconds_per_token_squared: float = 0.0

    def seconds(self, examples: int, padded_length: int) -> float:
        """Predicted seconds of a piece of `examples` padded to `padded_length` tokens."""
        per_example = self.seconds_per_token * padded_length + self.seconds_per_token_squared * padded_length**2
        return self.overhead_seconds + examples * per_example

    @classmethod
    def from_trials(cls, trials: Iterable[Any]) -> PieceCost | None:
        """Non-negative least squares over the trials that ran at a sequence length and timed steady
        steps (`Trial.seq_len`, `step_seconds`, `steady` not False); None with fewer than MIN_TRIALS
        of them or all at one length. A probe's trial times a whole training step, optimizer
        included, so its overhead is above a piece's (module docstring)."""
        points = [(t.batch, t.seq_len, t.step_seconds) for t in trials
                  if getattr(t, "ok", False) and getattr(t, "seq_len", None) and getattr(t, "step_seconds", None)
                  and getattr(t, "steady", None) is not False and getattr(t, "measured", True)]
        return cls.from_points(points)

    @classmethod
    def from_points(cls, points: Sequence[tuple[int, int, float]]) -> PieceCost | None:
        """Non-negative least squares over (examples, padded length, seconds) points, in relative
        error; None with fewer than MIN_TRIALS points or all at one length."""
        import numpy as np
        from scipy.optimize import nnls

        if len(points) < MIN_TRIALS or len({length for _, length, _ in points}) < 2:
            return None
        batch, length, seconds = (np.array(column, dtype=float) for column in zip(*points))
        design = np.column_stack([np.ones_like(batch), batch * length, batch * length**2])
        # Each row scaled by its own time: the fit is in relative error, so short steps count too.
        coefficients, _ = nnls(design / seconds[:, None], np.ones_like(seconds))
        return cls(*(float(value) for value in coefficients))

    def cut(self, lengths: Sequence[int], limit_at: Callable[[int], int]) -> list[int]:
        """Sizes of consecutive pieces of `lengths` (fit passes an update sorted by length) with the
        least predicted seconds in all, each piece at most `limit_at(its longest length)` examples
        (at least 1). The sizes sum to len(lengths).

        Dynamic programming over the cut points: best[j] is the least time of the first j examples,
        best[j] = min over i of best[i] + seconds(j - i, max(lengths[i:j])), with j - i within the
        limit at that maximum. O(n x the largest limit) numpy work per update.
        """
        import numpy as np

        count = len(lengths)
        values = np.asarray(lengths, dtype=float)
        distinct = np.unique(values)
        limit_of_distinct = np.array([max(1, int(limit_at(int(length)))) for length in distinct])
        widest = int(limit_of_distinct.max()) if count else 1
        best = np.zeros(count + 1)
        start_of = np.zeros(count + 1, dtype=int)
        for end in range(1, count + 1):
            starts = np.arange(end - 1, max(0, end - widest) - 1, -1)  # the piece [start, end), nearest first
            longest = np.maximum.accumulate(values[end - 1 : starts[-1] - 1 if starts[-1] else None : -1])
            sizes = end - starts
            allowed = sizes <= limit_of_distinct[np.searchsorted(distinct, longest)]
            allowed[0] = True  # a piece of one example always runs
            totals = best[starts] + self.overhead_seconds + sizes * (
                self.seconds_per_token * longest + self.seconds_per_token_squared * longest**2)
            totals[~allowed] = np.inf
            choice = len(totals) - 1 - int(np.argmin(totals[::-1]))  # on a tie, the larger piece
            best[end], start_of[end] = totals[choice], starts[choice]
        sizes_out: list[int] = []
        end = count
        while end > 0:
            sizes_out.append(end - int(start_of[end]))
            end = int(start_of[end])
        return sizes_out[::-1]


class PieceTimes:
    """The pieces fit timed, and the cost refitted from them every REFIT_PIECES pieces.

    `add` takes one update's pieces: sizes, longest lengths and seconds. The first update (it
    traces) and updates that ran out of memory are left out by the caller. `refit` returns a new
    PieceCost when REFIT_PIECES more pieces arrived since the last fit and they determine one.
    """

    def __init__(self) -> None:
        self.points: list[tuple[int, int, float]] = []
        self._fitted_at = 0

    def add(self, sizes: Sequence[int], lengths: Sequence[int], seconds: Sequence[float]) -> None:
        self.points.extend((int(n), int(length), float(s)) for n, length, s in zip(sizes, lengths, seconds) if s > 0)

    def refit(self) -> PieceCost | None:
        if len(self.points) - self._fitted_at < REFIT_PIECES:
            return None
        self._fitted_at = len(self.points)
        return PieceCost.from_points(self.points)
