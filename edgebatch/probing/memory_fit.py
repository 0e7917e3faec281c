"""Least-squares fit of peak memory against batch size: peak = fixed + per_sample x batch.

Pure: plain numbers in, a `MemoryModel` out. docs/tensorflow-memory.md: on this machine MobileNetV2's process peak
is linear in batch to within 13 MiB over 8..128, but at fine scale peaks step by +-40 MiB, so the
fit predicts the neighbourhood of the ceiling and trials near the boundary decide.

`memory_model_of` is the one fit the probe uses and `trusted` the one rule for when to believe
it: the search (search.py) jumps and skips by it, and the profile (summary.py) records it and
steps the safe batch along it. `bump_excess_bytes` says when a reading sits further above the line
than the noise of the other readings: a bump in a peak that is not monotone in batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from edgebatch.profiles.model import MemoryModel

# Fresh readings are fitted on their own only when their batches span this share of the largest:
# at fine scale peaks step by +-40 MiB (docs/tensorflow-memory.md), so the slope between close batches is noise.
LOCAL_FIT_MIN_SPREAD = 0.25

# The model is trusted after this many readings with at least this r2, growing with batch: three
# points on a line are the fewest that can show it bending, and the MobileNetV2 line (docs/tensorflow-memory.md) has
# r2 > 0.999 over 8..128, so 0.98 lets the +-40 MiB steps through but not a curve.
MIN_FIT_POINTS = 3
MIN_FIT_R2 = 0.98
# Peaks of the same batch differ between processes by this much, more between runs at different
# times than back to back (small_cnn at 337: up to 1.45% with the inter-op pool;
# docs/probe-evidence.md, "Bumps"). A reading closer to the line than this is not told apart from it.
PEAK_SPREAD_FRACTION = 0.02

# (batch, peak_bytes, fresh): fresh when the trial was the first trial batch of its worker.
Reading = tuple[int, float, bool]


def trusted(model: MemoryModel | None) -> bool:
    """The one rule for believing a fitted line: enough points, straight enough, growing with batch."""
    return (
        model is not None
        and model.points >= MIN_FIT_POINTS
        and model.r2 >= MIN_FIT_R2
        and model.per_sample_bytes > 0
    )


def memory_model_of(readings: Sequence[Reading]) -> MemoryModel | None:
    """The trusted line through the readings, turned toward the fresh ones; None when none is trusted.

    Readings are (batch, measured peak, fresh) of trials that ran, over budget or not. Fresh
    readings at large batches are kept out of the fit and turn the line down when they read below
    it (split_fresh, turn_to_fresh): reused workers read high. When the rest is too few or too
    crooked to trust, every reading is fitted.
    """
    rest, fresh = split_fresh(readings)
    for points in (rest, [(batch, peak) for batch, peak, _ in readings]):
        model = fit_memory_model(points)
        if trusted(model):
            return turn_to_fresh(model, fresh)
    return None


def bump_excess_bytes(model: MemoryModel, readings: Sequence[Reading], batch: int, peak_bytes: float) -> float:
    """How far `peak_bytes` at `batch` sits above the line beyond the noise (> 0: a bump).

    The noise is the larger of the other readings' root-mean-square distance from the line and the
    process-to-process spread (PEAK_SPREAD_FRACTION of the predicted peak): a fit through three
    small batches on a clean line has almost no residual, but a reading near the boundary still
    moves by the spread from one process to the next.
    """
    predicted = model.predict_bytes(batch)
    others = [peak - model.predict_bytes(b) for b, peak, _ in readings if b != batch]
    rms = math.sqrt(sum(r * r for r in others) / len(others)) if others else 0.0
    noise = max(rms, PEAK_SPREAD_FRACTION * predicted)
    return peak_bytes - predicted - noise


def fit_memory_model(points: Iterable[tuple[int, float]]) -> MemoryModel | None:
    """Fit a line through (batch, peak_bytes) points; None with fewer than two distinct batches.

    When one batch was measured more than once, every measurement counts (least squares averages
    them). r2 is 1.0 when all peaks are equal or two points define the line exactly.
    """
    pairs = [(float(batch), float(peak)) for batch, peak in points]
    if len({batch for batch, _ in pairs}) < 2:
        return None
    count = len(pairs)
    mean_batch = sum(batch for batch, _ in pairs) / count
    mean_peak = sum(peak for _, peak in pairs) / count
    spread = sum((batch - mean_batch) ** 2 for batch, _ in pairs)
    covariance = sum((batch - mean_batch) * (peak - mean_peak) for batch, peak in pairs)
    per_sample = covariance / spread
    fixed = mean_peak - per_sample * mean_batch
    total = sum((peak - mean_peak) ** 2 for _, peak in pairs)
    residual = sum((peak - (fixed + per_sample * batch)) ** 2 for batch, peak in pairs)
    r2 = 1.0 if total == 0 else max(0.0, 1.0 - residual / total)
    return MemoryModel(
        fixed_bytes=fixed, per_sample_bytes=per_sample, r2=r2, points=count
    )


def split_fresh(readings: Sequence[Reading]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(the rest, fresh readings at large batches): fresh ones at >= half the largest batch.

    Readings of reused workers are lifted by memory kept from earlier trials (dense_wide at 300:
    1410 MiB after trials at 8..276, 1327 MiB in a new process), fresh ones are not, and a fit
    over a mix of both bends. The small first trials are little lifted and stay with the rest.
    """
    if not readings:
        return [], []
    largest = max(batch for batch, _, _ in readings)
    fresh = [(b, p) for b, p, is_fresh in readings if is_fresh and 2 * b >= largest]
    rest = [(b, p) for b, p, is_fresh in readings if not (is_fresh and 2 * b >= largest)]
    return rest, fresh


def turn_to_fresh(model: MemoryModel, fresh: Sequence[tuple[int, float]]) -> MemoryModel:
    """The line moved down toward fresh readings below it; never up.

    One fresh reading (or fresh readings on a straight line through the intercept): the line turns
    about its intercept to pass through them (least squares). The lift grows with the batches run
    before (13% of what the batch adds on dense_wide), so the intercept, fitted mostly on small
    early batches, stays. Two or more fresh batches that bend away from that line (MobileNetV2 on
    a 23 GiB budget: 16.37 GiB at 1255, 21.83 GiB at 1865, 12.0 MiB/sample through the intercept but
    9.0 MiB/sample between them) are fitted on their own when that line lies lower at the largest of
    them: near the boundary the local line predicts, and a line through the far intercept made the
    search creep up in 2% steps, each a trial. Fresh readings above the line are the fine-scale steps
    of docs/tensorflow-memory.md, which trials near the boundary settle: they do not turn it up.
    """
    # Only readings at or under the line turn it: one above it (a bump, a step) would cancel the
    # turn of the others in the least-squares slope below.
    fresh = [(batch, peak) for batch, peak in fresh if peak <= model.predict_bytes(batch)]
    if not fresh:
        return model
    turned = model
    slope = sum((peak - model.fixed_bytes) * batch for batch, peak in fresh) / sum(batch**2 for batch, _ in fresh)
    if 0 < slope < model.per_sample_bytes:
        turned = dataclasses.replace(model, per_sample_bytes=slope)
    batches = [batch for batch, _ in fresh]
    if max(batches) - min(batches) < LOCAL_FIT_MIN_SPREAD * max(batches):
        return turned  # close batches: their slope is the fine-scale noise, not the line
    local = fit_memory_model(fresh)
    # The local line is held to the one trust rule too: fresh readings that take peak levels fit a
    # crooked line, which the profile then recorded (docs/probe-rules.md, "memory_fit.turn_to_fresh").
    if not trusted(local) or not turned.per_sample_bytes / 2 <= local.per_sample_bytes < turned.per_sample_bytes:
        return turned
    if local.predict_bytes(max(batches)) > turned.predict_bytes(max(batches)):
        return turned
    return local


def prior_through_readings(prior: MemoryModel, readings: Sequence[Reading]) -> MemoryModel:
    """A line known beforehand, turned about its intercept through these readings (least squares).

    A probe per length knows the line at a new length from the token memory model fitted over the
    others (probing/token_fit.py): its intercept is the process's fixed cost, the same at every
    length, and its slope the prediction. Readings at this length move the slope to where they
    are, up or down, as soon as there is one; without readings (or with a slope that does not grow)
    the prior stands.
    """
    points = [(batch, peak) for batch, peak, _ in readings if batch > 0]
    if not points:
        return prior
    slope = sum((peak - prior.fixed_bytes) * batch for batch, peak in points) / sum(batch**2 for batch, _ in points)
    if slope <= 0:
        return prior
    return dataclasses.replace(prior, per_sample_bytes=slope, points=prior.points + len(points))
