"""Memory taken from outside during a probe: when a failure is the host's, not the device's.

A trial's reading is its own process's peak, so another process cannot lift it; but it can take
the room a trial needs, and then an out-of-memory failure, or a worker the kernel killed, says
nothing about the device. The probe samples the room (what the device can give now, plus what
its own workers hold) around every step, and gives no answer bounded by a failure met while the
room was under the budget (RoomWatch.problem): such an answer would be recorded as the device's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edgebatch.probing.summary import DEVICE_FAILURES
from edgebatch.profiles.model import Trial
from edgebatch.units import format_bytes

# A room this far under the budget counts as squeezed: less is the drift of a default budget (the
# RAM available when the probe started) while the machine does its ordinary work.
SQUEEZE_FRACTION = 0.05


@dataclass(frozen=True)
class Squeeze:
    """A failure met while the room was under the budget."""

    batch: int
    error: str
    room_bytes: int


def squeezed(failure_rooms: Iterable[tuple[Trial, int | None]], budget_bytes: int) -> list[Squeeze]:
    """The device failures among `failure_rooms` (trial, the least room seen around it; None where
    unknown) whose room was under budget x (1 - SQUEEZE_FRACTION). Pure."""
    floor = budget_bytes * (1 - SQUEEZE_FRACTION)
    return [Squeeze(trial.batch, trial.error, room) for trial, room in failure_rooms
            if trial.error in DEVICE_FAILURES and room is not None and room < floor]


def squeeze_problem(squeezes: list[Squeeze], budget_bytes: int) -> str | None:
    """One line for people when a failure was the host's, else None. Pure."""
    if not squeezes:
        return None
    least = min(squeezes, key=lambda s: s.room_bytes)
    return (
        f"memory was taken from outside during the probe: batch {least.batch} failed "
        f"({least.error.replace('_', ' ')}) while the host had {format_bytes(least.room_bytes)} for a budget of "
        f"{format_bytes(budget_bytes)}, so the answer would be the host's, not the device's, and is not saved; "
        "probe again when the host is quieter, or lower --memory-budget"
    )


@dataclass
class RoomWatch:
    """Samples the room around each step (`sample_room`: workers' pids -> bytes, or None where
    unknown; no sampler, no sampling) and keeps it beside each failed trial."""

    sample_room: Callable[[list[int]], int | None] | None = None
    failure_rooms: list[tuple[Trial, int | None]] = field(default_factory=list)

    def room(self, workers: Iterable) -> int | None:
        """The room now, with the resident memory of `workers` (live probe workers) counted as free."""
        if self.sample_room is None:
            return None
        return self.sample_room([worker.process.pid for worker in workers])

    def note(self, trials: Iterable[Trial], rooms: Iterable[int | None]) -> None:
        """Keep each failed trial with the least of `rooms` (the samples before and after its step)."""
        known = [room for room in rooms if room is not None]
        least = min(known) if known else None
        self.failure_rooms.extend((trial, least) for trial in trials if trial.error in DEVICE_FAILURES)

    def problem(self, budget_bytes: int) -> str | None:
        return squeeze_problem(squeezed(self.failure_rooms, budget_bytes), budget_bytes)


def host_room_with_workers(device: str) -> Callable[[list[int]], int | None]:
    """The room sampler of a CPU device: the probe's default budget now (available RAM, or the
    room under a cgroup limit) plus the resident memory of the probe's own workers. None on GPU,
    where NVML's free memory is not split by process here."""
    if not device.upper().startswith("CPU"):
        return lambda pids: None

    def sample(pids: list[int]) -> int | None:
        import psutil

        from edgebatch.probing.budget import device_room_bytes

        room = device_room_bytes(device)
        if room is None:
            return None
        for pid in pids:
            try:
                room += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass  # a worker that just ended holds nothing
        return room

    return sample
