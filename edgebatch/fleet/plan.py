"""Split an effective batch across profiled devices so a synchronous data-parallel update is shortest.

Pure: no TensorFlow, no I/O. The input is one `PlanDevice` per device (built from a DeviceProfile by
`device_from_profile`), the output a `FleetPlan`: each device's micro-batch, accumulation count and
share, the predicted update time, and the naive equal split to compare with.

The time model (interpolated throughput per device, step times made non-decreasing in batch,
the update as long as its slowest device) and how the plan minimises it: `plan_fleet`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from edgebatch.errors import ProfileError, UsageError

# Relative width at which the bisection on the update time stops.
_RELATIVE_TOLERANCE = 1e-12
_MAX_BISECTIONS = 200


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


@dataclass(frozen=True)
class Assignment:
    """What one device does in an update: `accumulation` micro-batches of `micro_batch`, the last of `last_micro_batch`.

    share = (accumulation - 1) x micro_batch + last_micro_batch, and micro_batch <= the device's
    max_micro_batch (so within its safe batch). A share of 0 is an idle device (equal split only).
    """

    device_id: str
    label: str
    safe_batch: int
    max_micro_batch: int
    micro_batch: int
    accumulation: int
    last_micro_batch: int
    share: int
    predicted_seconds: float

    @property
    def samples_per_second(self) -> float | None:
        return self.share / self.predicted_seconds if self.predicted_seconds > 0 else None

    def to_dict(self) -> dict:
        return {
            "device_id": self.device_id,
            "label": self.label,
            "safe_batch": self.safe_batch,
            "max_micro_batch": self.max_micro_batch,
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "last_micro_batch": self.last_micro_batch,
            "share": self.share,
            "predicted_seconds": self.predicted_seconds,
            "samples_per_second": self.samples_per_second,
        }


@dataclass(frozen=True)
class LeftOut:
    device_id: str
    label: str
    reason: str

    def to_dict(self) -> dict:
        return {"device_id": self.device_id, "label": self.label, "reason": self.reason}


@dataclass(frozen=True)
class Split:
    """Shares for every device it uses, and the predicted update time (overhead included)."""

    assignments: tuple[Assignment, ...]
    predicted_update_seconds: float
    overhead_seconds: float

    @property
    def total(self) -> int:
        return sum(assignment.share for assignment in self.assignments)

    @property
    def slowest(self) -> Assignment:
        return max(self.assignments, key=lambda assignment: assignment.predicted_seconds)

    def to_dict(self) -> dict:
        return {
            "predicted_update_seconds": self.predicted_update_seconds,
            "overhead_seconds": self.overhead_seconds,
            "slowest": self.slowest.device_id,
            "devices": [assignment.to_dict() for assignment in self.assignments],
        }


@dataclass(frozen=True)
class FleetPlan:
    """The plan (devices used, with shares), the devices left out and why, and the equal split beside it.

    `notes` say where the prediction leans on weaker figures: unsteady (warm-up) samples/s, or a
    micro-batch below the smallest measured batch (timed at that batch's samples/s).
    """

    effective_batch: int
    update_overhead_seconds: float
    plan: Split
    left_out: tuple[LeftOut, ...]
    equal_split: Split
    equal_micro_batch: int
    notes: tuple[str, ...]

    @property
    def speedup(self) -> float:
        """Equal split's predicted update time over the plan's (> 1: the plan is faster)."""
        return self.equal_split.predicted_update_seconds / self.plan.predicted_update_seconds

    def to_dict(self) -> dict:
        return {
            "effective_batch": self.effective_batch,
            "update_overhead_seconds": self.update_overhead_seconds,
            "predicted_update_seconds": self.plan.predicted_update_seconds,
            "equal_split_update_seconds": self.equal_split.predicted_update_seconds,
            "speedup_over_equal_split": self.speedup,
            "plan": self.plan.to_dict(),
            "left_out": [left.to_dict() for left in self.left_out],
            "equal_split": {**self.equal_split.to_dict(), "micro_batch": self.equal_micro_batch},
            "notes": list(self.notes),
        }


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


def plan_fleet(
    devices: Sequence[PlanDevice], effective_batch: int, *, update_overhead_seconds: float = 0.0
) -> FleetPlan:
    """The shortest-update split of `effective_batch` samples over `devices`, with the equal split beside it.

    Holds: the plan's shares sum to `effective_batch` exactly, every micro-batch is within its
    device's max_micro_batch, and its predicted update time is the minimum under the model below
    to a relative 1e-12, so never above the equal split's. Raises UsageError for
    effective_batch < 1, no devices, duplicate ids or a negative overhead.

    The time model, exactly:

    - A device's samples/s at batch b is interpolated piecewise-linearly in b between its profile's
      successful measured trials (`ok and measured and samples_per_second`), clamped at the ends: below
      the smallest measured batch it is that batch's figure (optimistic: small batches are usually
      slower), and no micro-batch above the largest measured batch or above `safe_batch` is allowed.
    - Where a batch has steady trials (`steady` not False) only those count; a batch whose only figures
      timed the warm-up step (`steady is False`, a slower figure) is dropped when steady batches lie on
      both sides of it (interpolating between them is the better figure) and kept otherwise, and the
      plan says that the device relies on it.
    - One step of b samples takes b / samples_per_second(b) seconds, made non-decreasing in b (the step
      time at b is the smallest at any batch >= b): a smaller batch never takes longer than a larger one,
      whatever measurement noise says. This keeps a device's time non-decreasing in its share, which
      the search below relies on.
    - A share s done as micro-batch m with accumulation k = ceil(s / m) is k - 1 full micro-batches and
      a last one of s - (k - 1) m samples: its time is the sum of their step times. Shares are always
      of this form ("m x k, possibly with a smaller last micro-batch"); the optimum is over it.
    - The update time is the largest device time (synchronous), plus `update_overhead_seconds` (the
      all-reduce) whenever more than one device takes part. The overhead defaults to 0.

    The plan minimises the update time over integer shares summing to N and every allowed micro-batch
    per device: a bisection on the update time T (a device's largest share within T is monotone in T),
    then the shares at the smallest feasible T are trimmed to sum to N exactly, always from the device
    that is slowest at that moment. The result is optimal to within a relative 1e-12 of the update
    time (the bisection's tolerance). A device whose share ends at 0 is left out, with the reason.
    """
    if isinstance(effective_batch, bool) or not isinstance(effective_batch, int) or effective_batch < 1:
        raise UsageError(f"the effective batch must be a whole number >= 1, got {effective_batch!r}")
    if not devices:
        raise UsageError("no devices to plan for")
    ids = [device.device_id for device in devices]
    if len(set(ids)) != len(ids):
        raise UsageError(f"device ids must be distinct, got {ids}")
    if not (math.isfinite(update_overhead_seconds) and update_overhead_seconds >= 0):
        raise UsageError(f"the update overhead must be >= 0 seconds, got {update_overhead_seconds!r}")

    shares, parallel_seconds = _minimax_shares(devices, effective_batch)
    used = [device for device, share in zip(devices, shares) if share > 0]
    left_out: list[LeftOut] = []
    for device, share in zip(devices, shares):
        if share == 0:
            left_out.append(LeftOut(device.device_id, device.label, _left_out_reason(device, parallel_seconds)))
    plan = _split(used, [share for share in shares if share > 0], update_overhead_seconds)

    if len(used) > 1 and update_overhead_seconds > 0:
        alone_seconds, alone = min((device.best_layout(effective_batch)[0], index) for index, device in enumerate(devices))
        if alone_seconds <= plan.predicted_update_seconds:
            single = devices[alone]
            reasons = {left.device_id: left.reason for left in left_out}
            sharing = (
                f"{single.label} alone ({alone_seconds:.4g} s) is no slower than sharing the update "
                f"({plan.predicted_update_seconds:.4g} s with the {update_overhead_seconds:.4g} s overhead)"
            )
            left_out = [
                LeftOut(device.device_id, device.label, reasons.get(device.device_id, sharing))
                for device in devices
                if device is not single
            ]
            plan = _split([single], [effective_batch], update_overhead_seconds)

    equal, equal_micro = _equal_split(devices, effective_batch, update_overhead_seconds)
    return FleetPlan(
        effective_batch=effective_batch,
        update_overhead_seconds=update_overhead_seconds,
        plan=plan,
        left_out=tuple(left_out),
        equal_split=equal,
        equal_micro_batch=equal_micro,
        notes=tuple(_notes(devices, plan)),
    )


def _minimax_shares(devices: Sequence[PlanDevice], total: int) -> tuple[list[int], float]:
    """Integer shares summing to `total` whose largest device time is smallest; and that time."""

    def capacity(seconds: float) -> int:
        return sum(device.max_share_within(seconds, total) for device in devices)

    # One device doing everything is always feasible; nothing is below its first sample.
    high = min(device.best_layout(total)[0] for device in devices)
    low = 0.0
    for _ in range(_MAX_BISECTIONS):
        if high - low <= high * _RELATIVE_TOLERANCE:
            break
        middle = (low + high) / 2
        if capacity(middle) >= total:
            high = middle
        else:
            low = middle
    while capacity(high) < total:  # rounding in max_share_within at the very edge: step just past it
        high = float(np.nextafter(high, math.inf)) * (1 + _RELATIVE_TOLERANCE)
    shares = [device.max_share_within(high, total) for device in devices]
    excess = sum(shares) - total
    # Trim to exactly `total`, always from the device that is slowest now; jump whole plateaus of
    # equal time at once so the loop ends after at most (devices x distinct times) rounds.
    while excess > 0:
        times = [device.best_layout(share)[0] if share else -1.0 for device, share in zip(devices, shares)]
        index = max(range(len(devices)), key=lambda i: (times[i], shares[i]))
        device, share = devices[index], shares[index]
        below = device.max_share_within(float(np.nextafter(times[index], 0.0)), share - 1)
        cut = min(excess, share - below)
        shares[index] -= cut
        excess -= cut
    parallel_seconds = max(device.best_layout(share)[0] for device, share in zip(devices, shares) if share)
    return shares, parallel_seconds


def _split(devices: Sequence[PlanDevice], shares: Sequence[int], overhead_seconds: float) -> Split:
    assignments = []
    for device, share in zip(devices, shares):
        seconds, micro, accumulation, last = device.best_layout(share)
        assignments.append(
            Assignment(device.device_id, device.label, device.safe_batch, device.max_micro_batch,
                       micro, accumulation, last, share, seconds)
        )
    return _with_update_time(assignments, overhead_seconds)


def _with_update_time(assignments: list[Assignment], overhead_seconds: float) -> Split:
    working = [assignment for assignment in assignments if assignment.share > 0]
    seconds = max(assignment.predicted_seconds for assignment in working)
    if len(working) > 1:
        seconds += overhead_seconds
    return Split(tuple(assignments), seconds, overhead_seconds)


def _equal_split(devices: Sequence[PlanDevice], total: int, overhead_seconds: float) -> tuple[Split, int]:
    """N / d samples each (the first N mod d devices one more), micro-batch min(share, smallest ceiling)."""
    count = len(devices)
    ceiling = min(device.max_micro_batch for device in devices)
    assignments = []
    for index, device in enumerate(devices):
        share = total // count + (1 if index < total % count else 0)
        if share == 0:
            assignments.append(
                Assignment(device.device_id, device.label, device.safe_batch, device.max_micro_batch, 0, 0, 0, 0, 0.0)
            )
            continue
        micro = min(share, ceiling)
        accumulation = -(-share // micro)
        last = share - (accumulation - 1) * micro
        assignments.append(
            Assignment(device.device_id, device.label, device.safe_batch, device.max_micro_batch,
                       micro, accumulation, last, share, device.share_seconds(share, micro))
        )
    return _with_update_time(assignments, overhead_seconds), ceiling


def _left_out_reason(device: PlanDevice, parallel_seconds: float) -> str:
    one_sample_seconds = device.step_seconds(1)
    if one_sample_seconds > parallel_seconds:
        return (
            f"even one sample takes {one_sample_seconds:.4g} s there, longer than the whole update "
            f"without it ({parallel_seconds:.4g} s)"
        )
    return f"not needed: the other devices reach the same update time ({parallel_seconds:.4g} s) without it"


def _notes(devices: Sequence[PlanDevice], plan: Split) -> list[str]:
    notes = []
    for device in devices:
        if device.unsteady_batches:
            batches = ", ".join(str(batch) for batch in device.unsteady_batches)
            notes.append(
                f"{device.label}: samples/s at batch {batches} timed the warm-up step (not steady), "
                "so its times there are likely overestimated"
            )
    by_id = {device.device_id: device for device in devices}
    for assignment in plan.assignments:
        smallest = by_id[assignment.device_id].points[0].batch
        if 0 < min(assignment.micro_batch, assignment.last_micro_batch) < smallest:
            notes.append(
                f"{assignment.label}: a micro-batch below its smallest measured batch {smallest} is timed at "
                f"that batch's samples/s (likely optimistic)"
            )
    return notes
