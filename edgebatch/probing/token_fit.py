"""Peak memory of a sequence model against batch and length: peak = fixed + a x B x L + b x B x L^2.

Pure: plain numbers in, numbers out (no TensorFlow, no NumPy). A probe per length
(`edgebatch probe --seq-lens`, probing/per_length.py) searches the ceiling at each length and fits
this model by least squares over the readings of every length: `a` is what each token of each
sample costs (embeddings, feed-forward activations, an LSTM's states), `b` what each token costs
per token of its sequence (attention scores and their softmax, B x heads x L x L). With the model
a ceiling can be predicted at any length (`TokenMemoryModel.batch_for_bytes`,
`ceiling_at_length`), and a length probed after two others starts its search at the prediction
(`TokenMemoryModel.line_at`: the line in batch at that length).

Also here: the `--seq-lens` text, the default ladder of lengths and the order they are probed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from edgebatch.errors import UsageError
from edgebatch.probing.memory_fit import PEAK_SPREAD_FRACTION
from edgebatch.profiles.model import LengthCeiling, TokenMemoryModel

# The default ladder doubles from this length up to the model's longest (64,128,256,512 for 512).
LADDER_START_LENGTH = 64
# The model is trusted with readings at two lengths or more, at least this many, this straight.
MIN_FIT_POINTS = 4
MIN_FIT_R2 = 0.98
# A reading this far above the first fit is a high draw of a two-valued peak (fit_token_model):
# memory_fit.PEAK_SPREAD_FRACTION, how far one batch's peaks differ between processes without
# one. The high draws seen sat 9-10% above the line, the rest within 1.9% (fit_token_model).
HIGH_DRAW_FRACTION = PEAK_SPREAD_FRACTION
# Left out as high draws only when they are at most this share of the points (1-2 of 23-24 seen).
MAX_HIGH_DRAW_SHARE = 0.25

# (batch, length, peak_bytes) of a trial that measured a peak.
TokenReading = tuple[int, int, float]

__all__ = [
    "LADDER_START_LENGTH", "LengthCeiling", "TokenMemoryModel", "TokenReading", "ceiling_at_length",
    "default_lengths", "fit_token_model", "low_level_points", "parse_seq_lens", "probe_order", "profile_ceiling_at_length", "trusted",
]


def parse_seq_lens(text: str | Iterable[int] | None) -> tuple[int, ...] | None:
    """'64,128,256' (or a sequence of ints) -> (64, 128, 256), sorted and unique; None stays None.

    Anything else is a UsageError of one line.
    """
    if text is None:
        return None
    if isinstance(text, str):
        parts = [part.strip() for part in text.split(",")]
        if not text.strip() or not all(part.isdigit() for part in parts):
            raise UsageError(f"--seq-lens expects token counts separated by commas, like 64,128,256; got {text!r}")
        values = [int(part) for part in parts]
    else:
        values = list(text)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise UsageError(f"seq_lens expects whole token counts, like (64, 128, 256); got {text!r}")
    if min(values) < 1:
        raise UsageError(f"--seq-lens must be 1 token or more, got {min(values)}")
    return tuple(sorted(set(values)))


def default_lengths(max_length: int, start: int = LADDER_START_LENGTH) -> tuple[int, ...]:
    """Doublings from `start` below `max_length`, then `max_length` itself: 512 -> (64, 128, 256, 512).

    A model shorter than `start` gets its half length and its length, so two lengths are still fitted.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length!r}")
    if max_length <= start:
        return tuple(sorted({max(1, max_length // 2), max_length}))
    ladder, length = [], start
    while length < max_length:
        ladder.append(length)
        length *= 2
    return (*ladder, max_length)


def probe_order(lengths: Sequence[int]) -> tuple[int, ...]:
    """The order lengths are probed in: the shortest, the longest, then the rest, shortest first.

    The first two are searched in full and fix the model over the whole range, so every later
    length is predicted by interpolation and its search starts at the prediction.
    """
    ordered = sorted(set(lengths))
    if len(ordered) <= 2:
        return tuple(ordered)
    return (ordered[0], ordered[-1], *ordered[1:-1])


def fit_token_model(readings: Iterable[TokenReading]) -> TokenMemoryModel | None:
    """Least squares of peak on (1, B x L, B x L^2), with a and b kept at or above zero, fitted to
    the low level of two-valued peaks.

    Processes can read one batch at two levels, the high draws 9-10% above the line through the
    rest, and fitted reading by reading they bent r2 under MIN_FIT_R2 (docs/probe-evidence.md,
    "Probing per sequence length"). So each (batch, length) is fitted at its lowest reading, and
    then once more without the points that sit more than HIGH_DRAW_FRACTION above that fit, when
    they are at most MAX_HIGH_DRAW_SHARE of the points (more than that above the line is a line
    that bends, not draws). The kept runs then fit at r2 0.998-0.999, every kept point within 1.9%
    of the line. The line is the low level, as memory_fit's turns toward the fresh readings under
    it; how far processes differ is the spread, which each length's search takes off its budget
    (outcomes.effective_budget_bytes) and a predicted length's ceiling
    too (profile_ceiling_at_length). `points` counts the (batch, length) pairs fitted.

    When the free fit gives a negative coefficient (an LSTM has no quadratic term, and noise can
    make it slightly negative), the best fit without that term is taken. None with readings at fewer
    than two lengths or fewer than three points: the terms cannot be told apart.
    """
    return _fit_rows(low_level_points(readings))


def low_level_points(readings: Iterable[TokenReading]) -> list[tuple[float, float, float]]:
    """The (batch, length, peak) points fit_token_model fits: each pair at its lowest reading, less
    the high draws (more than HIGH_DRAW_FRACTION above the fit of those, when they are at most
    MAX_HIGH_DRAW_SHARE of them). tools/bench/token_model_forms.py fits its other forms to the same points."""
    lowest: dict[tuple[int, int], float] = {}
    for b, length, peak in readings:
        key = (int(b), int(length))
        lowest[key] = min(float(peak), lowest.get(key, math.inf))
    rows = [(float(b), float(length), peak) for (b, length), peak in sorted(lowest.items())]
    first = _fit_rows(rows)
    if first is None:
        return rows
    low = [row for row in rows if row[2] <= first.predict_bytes(row[0], row[1]) * (1 + HIGH_DRAW_FRACTION)]
    if len(rows) - len(low) > MAX_HIGH_DRAW_SHARE * len(rows) or _fit_rows(low) is None:
        return rows
    return low


def _fit_rows(rows: list[tuple[float, float, float]]) -> TokenMemoryModel | None:
    """The least-squares fit of fit_token_model over (batch, length, peak) rows, one per pair."""
    lengths = sorted({int(length) for _, length, _ in rows})
    if len(lengths) < 2 or len(rows) < 3:
        return None
    tokens = [b * length for b, length, _ in rows]
    squared = [b * length * length for b, length, _ in rows]
    peaks = [peak for _, _, peak in rows]
    candidates = []
    for use_a, use_b in ((True, True), (True, False), (False, True)):
        columns = [[1.0] * len(rows)] + ([tokens] if use_a else []) + ([squared] if use_b else [])
        solution = _least_squares(columns, peaks)
        if solution is None:
            continue
        fixed, rest = solution[0], solution[1:]
        a = rest.pop(0) if use_a else 0.0
        b = rest.pop(0) if use_b else 0.0
        if a < 0 or b < 0:
            continue
        candidates.append((_residual(fixed, a, b, rows), fixed, a, b))
    if not candidates:
        return None
    residual, fixed, a, b = min(candidates)
    return TokenMemoryModel(
        fixed_bytes=fixed, per_token_bytes=a, per_token_squared_bytes=b, r2=_r2(residual, peaks), points=len(rows),
        lengths=tuple(lengths),
    )


def _r2(residual: float, peaks: list[float]) -> float:
    mean = sum(peaks) / len(peaks)
    total = sum((peak - mean) ** 2 for peak in peaks)
    return 1.0 if total == 0 else max(0.0, 1.0 - residual / total)


def children_offset_bytes(rows: Iterable[tuple[float, float, float, bool]]) -> float | None:
    """How far fork-server children read above new processes, as the offset of one least-squares fit
    of peak on (1, B x L, B x L^2, child) over (batch, length, peak, child) readings; None where
    either kind read fewer than two (batch, length) points, the readings cover fewer than two
    lengths, or that fit is not straight enough to trust (MIN_FIT_R2) or does not grow with tokens.

    It needs no batch read both ways: per_length.child_lift_bytes asks it only where fewer than
    outcomes.MIN_LIFT_PAIRS such pairs were read. Each (batch, length, kind) counts at its lowest
    reading, as fit_token_model's pairs do.
    """
    lowest: dict[tuple[int, int, bool], float] = {}
    for batch, length, peak, child in rows:
        key = (int(batch), int(length), bool(child))
        lowest[key] = min(float(peak), lowest.get(key, math.inf))
    children = sum(1 for (_, _, child) in lowest if child)
    if len({length for _, length, _ in lowest}) < 2 or children < 2 or len(lowest) - children < 2:
        return None
    keys = sorted(lowest)
    peaks = [lowest[key] for key in keys]
    columns = [[1.0] * len(keys), [float(b * length) for b, length, _ in keys],
               [float(b * length * length) for b, length, _ in keys], [1.0 if child else 0.0 for _, _, child in keys]]
    solution = _least_squares(columns, peaks)
    if solution is None:
        return None
    fixed, a, b, offset = solution
    lowered = [(batch, length, peak - (offset if child else 0.0)) for (batch, length, child), peak in zip(keys, peaks)]
    if _r2(_residual(fixed, a, b, lowered), peaks) < MIN_FIT_R2 or a + b <= 0:
        return None
    return offset


def trusted(model: TokenMemoryModel | None) -> bool:
    """Readings at two lengths or more, enough of them, straight enough, growing with batch."""
    return (
        model is not None
        and len(model.lengths) >= 2
        and model.points >= MIN_FIT_POINTS
        and model.r2 >= MIN_FIT_R2
        and model.per_token_bytes + model.per_token_squared_bytes > 0
    )


def ceiling_at_length(
    length: int,
    *,
    per_length: dict[int, LengthCeiling] | None,
    token_model: TokenMemoryModel | None,
    fit_budget_bytes: float,
    headroom: float,
    multiple: int = 1,
) -> LengthCeiling:
    """The ceiling at `length`: the probed one when it was probed, else the token model's prediction.

    A prediction (`measured` False) is the largest batch (a multiple of `multiple`) whose predicted
    peak fits `fit_budget_bytes` (the budget less the probe's measurement margin), and the safe
    batch the same under `fit_budget_bytes x (1 - headroom)`; its `peak_bytes` is the predicted peak
    at that batch. ValueError when it was not probed and there is no trusted model.
    """
    if per_length and length in per_length:
        return per_length[length]
    if not trusted(token_model):
        raise ValueError(f"length {length} was not probed and the profile has no trusted token memory model")
    top = token_model.batch_for_bytes(fit_budget_bytes, length) // multiple * multiple
    safe = token_model.batch_for_bytes(fit_budget_bytes * (1 - headroom), length) // multiple * multiple
    return LengthCeiling(
        max_batch=top, safe_batch=min(safe, top), peak_bytes=int(token_model.predict_bytes(top, length)), measured=False
    )


def profile_ceiling_at_length(profile, length: int) -> LengthCeiling:
    """ceiling_at_length for a probe per length's DeviceProfile: its table, model, budget and headroom.

    A length it did not probe is predicted under the budget its searches judged readings by
    (summary.judged_budget_bytes): lowered by the widest spread any probed length showed between
    processes. The model is the low level of two-valued peaks (fit_token_model); where processes
    read 256 and 512 tokens up to 6.6% apart, a length between them is not known to read alike.
    """
    from edgebatch.probing.budget import judged_bytes

    return ceiling_at_length(
        length,
        per_length=profile.per_length,
        token_model=profile.token_model,
        fit_budget_bytes=judged_bytes(profile),
        headroom=profile.headroom,
        multiple=int(profile.search.get("multiple", 1)),
    )


def _residual(fixed: float, a: float, b: float, rows) -> float:
    return sum((peak - (fixed + a * batch * length + b * batch * length * length)) ** 2 for batch, length, peak in rows)


def _least_squares(columns: list[list[float]], targets: list[float]) -> list[float] | None:
    """numpy's least-squares solution over `columns`; None when they are not independent.

    Columns are scaled to unit size first (B x L^2 runs to 10^7 where the intercept column is 1), so
    the rank numpy reports compares like with like. numpy is imported here: edgebatch's import stays
    light.
    """
    import numpy as np

    matrix = np.asarray(columns, dtype=np.float64).T
    scales = np.abs(matrix).max(axis=0)
    scales[scales == 0] = 1.0
    solution, _, rank, _ = np.linalg.lstsq(matrix / scales, np.asarray(targets, dtype=np.float64), rcond=None)
    if rank < matrix.shape[1]:
        return None
    return [float(value) for value in solution / scales]

