"""Least-squares fit of peak memory against batch size: peak = fixed + per_sample x batch.

Pure: plain numbers in, a `MemoryModel` out. FACTS.md: on this machine MobileNetV2's process peak
is linear in batch to within 13 MiB over 8..128, but at fine scale peaks step by +-40 MiB, so the
fit predicts the neighbourhood of the ceiling and trials near the boundary decide.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgebatch.profiles.model import MemoryModel


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
