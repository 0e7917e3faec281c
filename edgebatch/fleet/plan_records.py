"""What `edgebatch fleet plan` decides, as records: each device's assignment, the splits, the plan.

Frozen dataclasses with their JSON form (`to_dict`, what `--json` prints); `plan_fleet` (plan.py)
fills them and cli/fleet_plan.py renders them as a table.
"""

from __future__ import annotations

from dataclasses import dataclass


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
