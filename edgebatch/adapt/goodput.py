"""Goodput: the effective batch that makes the most training progress per second. Pure.

goodput(B) = throughput(B) x efficiency(B), as in Pollux (Qiao et al., OSDI 2021). throughput(B)
is samples/s at effective batch B on this device: micro-batches within the memory ceiling, the
rest by accumulation, timed from a measured curve (`StepCurve`: the profile's steady-state
samples/s by batch, or, with throughput="measured", the curve `MeasuredSteps` fits to the step
times fit measures as it trains). efficiency(B) = (B_noise + B0) / (B_noise + B)
is the progress one example makes at batch B relative to one at the base batch B0, from the
gradient noise scale B_noise (McCandlish et al. 2018; signals.noise_scale_samples). Numbers in,
a `GoodputChoice` out; no TensorFlow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgebatch.errors import UsageError

__all__ = ["MEASURED", "GoodputChoice", "MeasuredSteps", "StepCurve", "best_batch", "efficiency"]

#: AdaptConfig(throughput=MEASURED): learn the curve from the run's own step times (MeasuredSteps).
MEASURED = "measured"
# Updates MeasuredSteps needs (after the first, which traces) before it gives a curve.
MIN_MEASURED_UPDATES = 2
# The pieces and updates it keeps: the most recent, so the curve follows the device as it is now.
MEASURED_WINDOW = 256


@dataclass(frozen=True)
class StepCurve:
    """Samples/s by micro-batch, measured at `batches` and interpolated linearly between them
    (clamped at the ends), plus a fixed cost per optimizer update (the apply, the loop's own work).

    A micro-batch's step takes micro / samples_per_second(micro) seconds; an update of B examples
    as micro-batches of m takes ceil(B / m) - 1 full steps, one last step of the rest, and the
    per-update cost.
    """

    batches: tuple[int, ...]
    samples_per_second: tuple[float, ...]
    update_overhead_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.samples_per_second):
            raise UsageError("a throughput curve needs one samples/s figure per batch, and at least one")
        if list(self.batches) != sorted(set(self.batches)) or self.batches[0] < 1:
            raise UsageError(f"the curve's batches must be distinct, increasing and >= 1, got {self.batches}")
        if not all(math.isfinite(rate) and rate > 0 for rate in self.samples_per_second):
            raise UsageError(f"samples/s must be finite and > 0, got {self.samples_per_second}")
        if not (math.isfinite(self.update_overhead_seconds) and self.update_overhead_seconds >= 0):
            raise UsageError(f"the per-update cost must be >= 0 s, got {self.update_overhead_seconds!r}")

    @classmethod
    def from_points(cls, points: Sequence[tuple[int, float]], update_overhead_seconds: float = 0.0) -> StepCurve:
        """From (batch, samples/s) pairs in any order; several at one batch count as their median."""
        by_batch: dict[int, list[float]] = {}
        for batch, rate in points:
            by_batch.setdefault(int(batch), []).append(float(rate))
        batches = tuple(sorted(by_batch))
        rates = tuple(float(np.median(by_batch[batch])) for batch in batches)
        return cls(batches, rates, update_overhead_seconds)

    @classmethod
    def from_profile(cls, profile, update_overhead_seconds: float = 0.0) -> StepCurve:
        """A probe's samples/s by batch (duck-typed DeviceProfile): the curve `edgebatch fleet plan`
        reads (fleet/plan_model.py: steady trials' medians). UsageError when the profile timed none."""
        from edgebatch.fleet.plan_model import throughput_points

        points = throughput_points(profile.answer_trials)
        if not points:
            raise UsageError("the profile has no timed trial to read samples/s from: probe again "
                             "(its trials' samples_per_second is empty)")
        return cls.from_points([(point.batch, point.samples_per_second) for point in points], update_overhead_seconds)

    def step_seconds(self, micro_batch: np.ndarray | int) -> np.ndarray:
        """Seconds of one step of `micro_batch` examples (0 for an empty one)."""
        micro = np.asarray(micro_batch, dtype=float)
        rate = np.interp(micro, self.batches, self.samples_per_second)
        return np.where(micro > 0, micro / rate, 0.0)

    def update_seconds(self, effective: np.ndarray | int, micro_ceiling: int) -> np.ndarray:
        """Seconds of one update of `effective` examples in micro-batches of at most `micro_ceiling`."""
        effective = np.asarray(effective, dtype=np.int64)
        micro = np.minimum(effective, micro_ceiling)
        steps = -(-effective // micro)
        last = effective - (steps - 1) * micro
        return (steps - 1) * self.step_seconds(micro) + self.step_seconds(last) + self.update_overhead_seconds


@dataclass(frozen=True)
class GoodputChoice:
    """The chosen effective batch, its split within the ceiling, and what the model predicts for it."""

    effective_batch_samples: int
    micro_batch_samples: int
    accumulation_steps: int
    samples_per_second: float  # throughput at this effective batch
    efficiency: float  # progress per example relative to the base batch
    goodput: float  # samples_per_second x efficiency

    def describe(self) -> str:
        return (f"goodput {self.goodput:.4g}/s at batch {self.effective_batch_samples} "
                f"({self.micro_batch_samples} x {self.accumulation_steps}, {self.samples_per_second:.4g} samples/s, "
                f"efficiency {self.efficiency:.2f})")


def efficiency(effective: np.ndarray | int, base_batch_samples: int, noise_scale_samples: float) -> np.ndarray:
    """(B_noise + B0) / (B_noise + B): 1 at the base batch, lower above it, higher below it."""
    effective = np.asarray(effective, dtype=float)
    return (noise_scale_samples + base_batch_samples) / (noise_scale_samples + effective)


def best_batch(
    curve: StepCurve,
    noise_scale_samples: float,
    base_batch_samples: int,
    micro_ceiling_samples: int,
    bounds_samples: tuple[int, int],
) -> GoodputChoice:
    """The effective batch in `bounds_samples` (low, high, inclusive) with the highest goodput.

    Micro-batches are the largest the ceiling allows (min(B, ceiling)), the rest accumulated. Ties go
    to the smaller batch. Raises UsageError for a noise scale that is not a finite number >= 0,
    bounds with low < 1 or high < low, or a ceiling < 1.
    """
    low, high = bounds_samples
    if not (isinstance(noise_scale_samples, (int, float)) and math.isfinite(noise_scale_samples)
            and noise_scale_samples >= 0):
        raise UsageError(f"the noise scale must be a finite number >= 0, got {noise_scale_samples!r}")
    if low < 1 or high < low:
        raise UsageError(f"goodput bounds must have 1 <= low <= high, got {bounds_samples}")
    if micro_ceiling_samples < 1 or base_batch_samples < 1:
        raise UsageError("the micro-batch ceiling and the base batch must be >= 1")
    candidates = np.arange(low, high + 1, dtype=np.int64)
    rates = candidates / curve.update_seconds(candidates, micro_ceiling_samples)
    gains = efficiency(candidates, base_batch_samples, noise_scale_samples)
    scores = rates * gains
    best = int(np.argmax(scores))  # the first of equal maxima: the smaller batch
    effective = int(candidates[best])
    micro = min(effective, micro_ceiling_samples)
    return GoodputChoice(
        effective_batch_samples=effective,
        micro_batch_samples=micro,
        accumulation_steps=-(-effective // micro),
        samples_per_second=float(rates[best]),
        efficiency=float(gains[best]),
        goodput=float(scores[best]),
    )


class MeasuredSteps:
    """A StepCurve learned from the step times of the run itself: goodput with no profile.

    Each update adds its pieces' (size, seconds) and its per-update cost: the update's seconds less
    its pieces' (the apply, the loop's own work). A step of b examples is modelled as
    c + d x b seconds (non-negative least squares over the pieces, in relative error; with one size
    only, d = its seconds per example and c = 0, which predicts no gain from larger steps than it
    has seen). The first update is left out: it traces. Only the most recent MEASURED_WINDOW
    pieces and updates count.
    """

    def __init__(self) -> None:
        from collections import deque

        self.pieces: deque[tuple[int, float]] = deque(maxlen=MEASURED_WINDOW)
        self.update_costs: deque[float] = deque(maxlen=MEASURED_WINDOW)
        self._seen_first = False

    def add(self, piece_sizes: Sequence[int], piece_seconds: Sequence[float], update_seconds: float) -> None:
        """One update's pieces and its whole time (seconds)."""
        if not self._seen_first:
            self._seen_first = True
            return
        timed = [(int(size), float(seconds)) for size, seconds in zip(piece_sizes, piece_seconds) if seconds > 0]
        if not timed:
            return
        self.pieces.extend(timed)
        self.update_costs.append(max(0.0, float(update_seconds) - sum(seconds for _, seconds in timed)))

    def curve(self, largest_micro_batch: int) -> StepCurve | None:
        """The curve up to `largest_micro_batch` (at least the largest size measured); None before
        MIN_MEASURED_UPDATES updates were measured."""
        if len(self.update_costs) < MIN_MEASURED_UPDATES:
            return None
        fixed, per_example = self._step_model()
        top = max(int(largest_micro_batch), max(size for size, _ in self.pieces))
        batches = sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), top})
        rates = [batch / (fixed + per_example * batch) for batch in batches]
        return StepCurve(tuple(batches), tuple(rates), float(np.median(self.update_costs)))

    def _step_model(self) -> tuple[float, float]:
        """(c, d) of a step's c + d x b seconds."""
        from scipy.optimize import nnls

        sizes = np.array([size for size, _ in self.pieces], dtype=float)
        seconds = np.array([s for _, s in self.pieces])
        if len(set(sizes.tolist())) >= 2:
            design = np.column_stack([np.ones_like(sizes), sizes]) / seconds[:, None]
            (fixed, per_example), _ = nnls(design, np.ones_like(seconds))
            if per_example > 0 or fixed > 0:
                return float(fixed), float(per_example)
        return 0.0, float(np.median(seconds / sizes))
