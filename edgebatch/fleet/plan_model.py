"""The time model of `edgebatch fleet plan`: each device's throughput curve and the step times it gives.

`throughput_points` reduces a profile's trials to one samples/s per batch (the fleet report quotes
the same figures); `PlanDevice` holds a device's curve and safe batch and answers how long a step,
a share or the best layout of a share takes, and how large a share fits in a time. The model's
exact rules are in `plan_fleet`'s docstring (plan.py). Pure: no TensorFlow, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from edgebatch.errors import ProfileError


@dataclass(frozen=True)
class ThroughputPoint:
    """A measured samples/s at one batch. `steady` is False when every figure at it timed the warm-up step."""

    batch: int
    samples_per_second: float
    steady: bool = True


@dataclass(frozen=True)
class PlanDevice:
    """One device as the planner sees it: a label, its safe batch and its throughput curve.

    `points` holds distinct batches (any order; sorted on construction) with finite positive
    samples/s. Raises ProfileError when the device cannot take a single sample: no points, or a
    safe batch below 1.
    """

    device_id: str
    label: str
    safe_batch: int
    points: tuple[ThroughputPoint, ...]

    def __post_init__(self) -> None:
        points = tuple(sorted(self.points, key=lambda point: point.batch))
        object.__setattr__(self, "points", points)
        if not points:
            raise ProfileError(
                f"device {self.label} has no usable throughput (no successful measured trial with samples/s): "
                "probe it again, or leave its profile out"
            )
        batches = [point.batch for point in points]
        if len(set(batches)) != len(batches) or batches[0] < 1:
            raise ValueError(f"device {self.label}: throughput points need distinct batches >= 1, got {batches}")
        for point in points:
            if not (math.isfinite(point.samples_per_second) and point.samples_per_second > 0):
                raise ValueError(f"device {self.label}: samples/s at batch {point.batch} is {point.samples_per_second!r}")
        if self.safe_batch < 1:
            raise ProfileError(
                f"device {self.label} has safe batch {self.safe_batch}: not even one sample fits; leave its profile out"
            )

    @property
    def max_micro_batch(self) -> int:
        """The largest allowed micro-batch: within the safe batch and not above the largest measured batch."""
        return min(self.safe_batch, self.points[-1].batch)

    @property
    def unsteady_batches(self) -> tuple[int, ...]:
        """Batches whose figure timed the warm-up step (throughput_points; plan_fleet's time model)."""
        return tuple(point.batch for point in self.points if not point.steady)

    def samples_per_second(self, batch: int) -> float:
        """Interpolated samples/s at `batch` (clamped at the measured ends; not limited to the allowed batches)."""
        xs = [point.batch for point in self.points]
        ys = [point.samples_per_second for point in self.points]
        return float(np.interp(batch, xs, ys))

    @cached_property
    def _step_table_seconds(self) -> np.ndarray:
        """Step seconds for batch 0..max_micro_batch (index = batch), non-decreasing; [0] is 0."""
        batches = np.arange(self.max_micro_batch + 1, dtype=float)
        rates = np.interp(batches, [p.batch for p in self.points], [p.samples_per_second for p in self.points])
        steps = batches / rates
        return np.minimum.accumulate(steps[::-1])[::-1]

    def step_seconds(self, batch: int) -> float:
        """Predicted seconds of one step of `batch` samples (0 <= batch <= max_micro_batch)."""
        if not 0 <= batch <= self.max_micro_batch:
            raise ValueError(f"device {self.label}: batch {batch} is outside 0..{self.max_micro_batch}")
        return float(self._step_table_seconds[batch])

    def share_seconds(self, share: int, micro_batch: int) -> float:
        """Seconds to process `share` samples as micro-batches of `micro_batch` (a smaller last one)."""
        if share == 0:
            return 0.0
        micro_batch = min(micro_batch, share)
        accumulation = -(-share // micro_batch)
        last = share - (accumulation - 1) * micro_batch
        return (accumulation - 1) * self.step_seconds(micro_batch) + self.step_seconds(last)

    def best_layout(self, share: int) -> tuple[float, int, int, int]:
        """(seconds, micro_batch, accumulation, last_micro_batch) of the fastest way to process `share` > 0.

        Ties go to the larger micro-batch (fewer steps). Non-decreasing in `share`.
        """
        if share < 1:
            raise ValueError(f"share must be >= 1, got {share}")
        steps = self._step_table_seconds
        micro = np.arange(1, min(self.max_micro_batch, share) + 1)
        accumulation = -(-share // micro)
        last = share - (accumulation - 1) * micro
        seconds = (accumulation - 1) * steps[micro] + steps[last]
        best = len(seconds) - 1 - int(np.argmin(seconds[::-1]))
        return float(seconds[best]), int(micro[best]), int(accumulation[best]), int(last[best])

    def max_share_within(self, seconds: float, cap: int) -> int:
        """The largest share (<= cap) this device processes within `seconds`; 0 if not even one sample."""
        steps = self._step_table_seconds
        if seconds < steps[1]:
            return 0
        micro = np.arange(1, self.max_micro_batch + 1)
        full = np.minimum(np.floor(seconds / steps[micro]), cap)
        remaining = seconds - full * steps[micro]
        last = np.searchsorted(steps, remaining, side="right") - 1
        last = np.clip(last, 0, micro - 1)
        return int(min(cap, np.max(full * micro + last)))


def throughput_points(trials: Iterable) -> tuple[ThroughputPoint, ...]:
    """The throughput curve of a profile's trials (plan_fleet's time model says which figures count).

    Several figures at one batch are reduced to their median.
    """
    by_batch: dict[int, list] = {}
    for trial in trials:
        rate = trial.samples_per_second
        if trial.ok and trial.measured and rate and math.isfinite(rate) and rate > 0 and trial.batch >= 1:
            by_batch.setdefault(trial.batch, []).append(trial)
    points = []
    for batch, group in sorted(by_batch.items()):
        steady = [trial.samples_per_second for trial in group if trial.steady is not False]
        if steady:
            points.append(ThroughputPoint(batch, float(statistics.median(steady)), True))
        else:
            points.append(ThroughputPoint(batch, float(statistics.median(t.samples_per_second for t in group)), False))
    steady_batches = [point.batch for point in points if point.steady]
    if steady_batches:
        low, high = min(steady_batches), max(steady_batches)
        points = [point for point in points if point.steady or not low < point.batch < high]
    return tuple(points)


def device_from_profile(profile, *, device_id: str, label: str | None = None) -> PlanDevice:
    """A PlanDevice from a DeviceProfile (anything with `safe_batch` and `trials`)."""
    return PlanDevice(
        device_id=device_id,
        label=label or device_id,
        safe_batch=int(profile.safe_batch),
        points=throughput_points(profile.answer_trials),
    )
