"""The records `edgebatch fleet report` is made of: rows, flags, groups and the report itself.

Plain frozen dataclasses and the three flag kinds; no logic beyond a property or two. analyse
(report.py) fills them, report_flags.py decides the flags, the renderers (report_output.py,
report_html.py, cli/fleet_report.py) read them. Every string in a row came from someone else's
machine: nothing here interprets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgebatch.profiles.model import DeviceProfile
from edgebatch.profiles.schema import ANSWERS_UNCHANGED_SINCE

STALE, DUPLICATE, OUTLIER = "stale", "duplicate", "outlier"


@dataclass(frozen=True)
class RunningVersions:
    """What this install would write into a new profile; None where it cannot be told (not compared)."""

    schema_version: int
    edgebatch: str | None
    tensorflow: str | None
    # Profiles of an older schema than this are stale: their answers meant something else.
    answers_unchanged_since: int = ANSWERS_UNCHANGED_SINCE



@dataclass(frozen=True)
class InvalidFile:
    """A file or location that gave no profile, with the one-line error that says why."""

    source: str
    error: str


@dataclass(frozen=True)
class Flag:
    """One thing wrong with a row: `kind` is STALE, DUPLICATE or OUTLIER; `message` says what, in words."""

    kind: str
    message: str


@dataclass(frozen=True)
class Throughput:
    """Samples per second at one batch size, and how it was obtained.

    The figures are the fleet plan's (plan_model.throughput_points: successful measured trials, the
    median of steady-state ones at a batch, warm-up-timed ones only where no steady figure stands
    on both sides), so the report and the plan never quote two rates for one device and batch.
    `basis` is "measured" (a figure at exactly that batch), "interpolated" (linearly in batch
    between the nearest figures below and above) or "unmeasured" (no figure on both sides;
    `samples_per_second` is None). `steady` is False when a figure it rests on timed its warm-up
    step, else True (trials of profiles written before edgebatch recorded it count as steady).
    """

    batch: int
    samples_per_second: float | None
    basis: str
    steady: bool | None


@dataclass(frozen=True)
class ProfileRow:
    """One profile (one device x one model) as the report shows it. Sizes in bytes, ages in seconds.

    `host` is the profile's device["host"] when it has one (`host_source` "profile"), else the name
    of the directory the file sits in (`host_source` "directory"): a fleet probe writes
    `<dir>/nodes/<node-label>/<file>.json`. `age_seconds` is `now` - created_at (negative when the
    profile claims to come from the future: a wrong clock somewhere).
    """

    source: str
    host: str
    host_source: str
    ray_node_id: str | None
    device_fingerprint: str
    device_description: str
    device_kind: str
    tf_device: str
    model_name: str
    model_key: str
    budget_bytes: int
    headroom: float
    measure: str
    max_batch: int
    safe_batch: int
    throughput_knee: int | None
    throughput_at_safe: Throughput
    unsteady_batches: tuple[int, ...]
    memory_fixed_bytes: float | None
    memory_per_sample_bytes: float | None
    memory_r2: float | None
    created_at: str
    age_seconds: float
    schema_version: int
    edgebatch_version: str | None
    tensorflow_version: str | None
    flags: tuple[Flag, ...] = ()
    profile: DeviceProfile | None = field(default=None, compare=False, repr=False)

    @property
    def device_id(self) -> tuple[str, str]:
        """A device in the fleet: (host, fingerprint)."""
        return (self.host, self.device_fingerprint)

    def flag_kinds(self) -> tuple[str, ...]:
        return tuple(sorted({flag.kind for flag in self.flags}))


@dataclass(frozen=True)
class DuplicateGroup:
    """Profiles of one (fingerprint, model key, host) found more than once; `identical` if all hold the same data."""

    device_fingerprint: str
    model_key: str
    host: str
    sources: tuple[str, ...]
    identical: bool


@dataclass(frozen=True)
class OutlierMember:
    host: str
    max_batch: int
    budget_bytes: int
    source: str


@dataclass(frozen=True)
class OutlierGroup:
    """One fingerprint + model key whose max_batch on different hosts lies more than 10% apart.

    `spread_fraction` is (largest - smallest) / smallest max_batch; `budgets_differ` is True when
    the members were probed under different memory budgets, which by itself explains a spread.
    """

    device_fingerprint: str
    model_key: str
    model_name: str
    spread_fraction: float
    budgets_differ: bool
    members: tuple[OutlierMember, ...]


@dataclass(frozen=True)
class FleetReport:
    """Everything the report shows. `matrix_cells[(device_id, model_key)]` is the sorted distinct safe batches."""

    generated_at: str
    running: RunningVersions
    rows: tuple[ProfileRow, ...]
    invalid: tuple[InvalidFile, ...]
    duplicates: tuple[DuplicateGroup, ...]
    outliers: tuple[OutlierGroup, ...]
    matrix_devices: tuple[tuple[str, str, str], ...]  # (host, fingerprint, description)
    matrix_models: tuple[tuple[str, str], ...]  # (model key, its profiles' model names joined by ' / ')
    matrix_cells: dict[tuple[tuple[str, str], str], tuple[int, ...]]

    def count(self, kind: str) -> int:
        """How many rows carry a flag of `kind`."""
        return sum(1 for row in self.rows if any(flag.kind == kind for flag in row.flags))


#: (source, profile): what collect reads and analyse takes.
ProfileEntry = tuple[str, DeviceProfile]
