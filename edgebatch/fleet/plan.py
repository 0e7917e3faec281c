"""Split an effective batch across profiled devices so a synchronous data-parallel update is shortest.

Pure: no TensorFlow, no I/O. The input is one `PlanDevice` per device (built from a DeviceProfile by
`device_from_profile`), the output a `FleetPlan`: each device's micro-batch, accumulation count and
share, the predicted update time, and the naive equal split to compare with.

This module is the share solver: `plan_fleet` states the time model and how the plan minimises it.
The model itself is plan_model.py (ThroughputPoint, PlanDevice, throughput_points,
device_from_profile), the records plan_records.py (Assignment, LeftOut, Split, FleetPlan); both
are re-exported here for callers of this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgebatch.errors import UsageError
from edgebatch.fleet.plan_model import PlanDevice, ThroughputPoint, device_from_profile, throughput_points
from edgebatch.fleet.plan_records import Assignment, FleetPlan, LeftOut, Split

# Re-exported: callers import these from here (cli/fleet_plan.py, tools/bench, tests).
__all__ = [
    "Assignment",
    "FleetPlan",
    "LeftOut",
    "PlanDevice",
    "Split",
    "ThroughputPoint",
    "device_from_profile",
    "plan_fleet",
    "throughput_points",
]

# Relative width at which the bisection on the update time stops.
_RELATIVE_TOLERANCE = 1e-12
_MAX_BISECTIONS = 200


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
    then N is split in proportion to each device's largest share within the smallest feasible T
    (largest remainders first), so equal devices get equal shares. The result is optimal to within a relative 1e-12 of the update
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
        plan, left_out = _alone_if_no_slower(devices, effective_batch, plan, left_out)

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


def _alone_if_no_slower(
    devices: Sequence[PlanDevice], total: int, plan: Split, left_out: list[LeftOut]
) -> tuple[Split, list[LeftOut]]:
    """The fastest device alone, with every other left out, where that is no slower than the shared
    `plan` with its overhead; else `plan` and `left_out` as they are."""
    overhead_seconds = plan.overhead_seconds
    alone_seconds, alone = min((device.best_layout(total)[0], index) for index, device in enumerate(devices))
    if alone_seconds > plan.predicted_update_seconds:
        return plan, left_out
    single = devices[alone]
    reasons = {left.device_id: left.reason for left in left_out}
    sharing = (
        f"{single.label} alone ({alone_seconds:.4g} s) is no slower than sharing the update "
        f"({plan.predicted_update_seconds:.4g} s with the {overhead_seconds:.4g} s overhead)"
    )
    left_out = [
        LeftOut(device.device_id, device.label, reasons.get(device.device_id, sharing))
        for device in devices
        if device is not single
    ]
    return _split([single], [total], overhead_seconds), left_out


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
    shares = _apportioned([device.max_share_within(high, total) for device in devices], total)
    parallel_seconds = max(device.best_layout(share)[0] for device, share in zip(devices, shares) if share)
    return shares, parallel_seconds


def _apportioned(capacity: list[int], total: int) -> list[int]:
    """`total` (<= sum(capacity)) split in proportion to `capacity`, largest remainders first, none
    over its capacity. Every share then ends within the update time the capacities were read at, and
    equal devices get equal shares (flat stretches of step times leave many optimal splits)."""
    exact = [total * room / sum(capacity) for room in capacity]
    shares = [min(room, math.floor(part)) for room, part in zip(capacity, exact)]
    by_remainder = sorted(range(len(capacity)), key=lambda index: (shares[index] - exact[index], index))
    while sum(shares) < total:  # each pass adds at most one per device, within its capacity
        for index in by_remainder:
            if sum(shares) < total and shares[index] < capacity[index]:
                shares[index] += 1
    return shares


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
