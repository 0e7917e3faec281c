"""`edgebatch fleet report`, the decisions: merge many devices' profiles into rows and flags.

Two steps, kept apart so the second is pure and testable without files:

- `collect(locations)` reads profiles through `edgebatch.profiles.store` (a profile file, a directory
  searched recursively, or an fsspec URL) and returns the profiles plus every file that could not be
  read, each with its one-line error. Nothing here writes anything.
- `analyse(entries, invalid, now=..., running=...)` turns them into a `FleetReport`: one `ProfileRow`
  per profile, a device x model matrix of safe batches, and three kinds of flags (stale, duplicate,
  outlier: `analyse` says what each means).

Every string in a row came from someone else's machine: this module never interprets it, and the
renderers (report_html.py, cli/fleet_report.py) escape it for their medium.
"""

from __future__ import annotations

import importlib.metadata
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from edgebatch.errors import EdgebatchError
from edgebatch.fleet.plan import throughput_points
from edgebatch.profiles.fingerprint import tf_major_minor
from edgebatch.profiles.model import DeviceProfile, Trial
from edgebatch.profiles.schema import ANSWERS_UNCHANGED_SINCE, SCHEMA_VERSION

#: Ceilings of the same hardware and model on different hosts further apart than this are outliers.
OUTLIER_SPREAD_FRACTION = 0.10

# Distributions TensorFlow ships as; the first one installed names the running TensorFlow version.
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-nightly")

STALE, DUPLICATE, OUTLIER = "stale", "duplicate", "outlier"


@dataclass(frozen=True)
class RunningVersions:
    """What this install would write into a new profile; None where it cannot be told (not compared)."""

    schema_version: int
    edgebatch: str | None
    tensorflow: str | None
    # Profiles of an older schema than this are stale: their answers meant something else.
    answers_unchanged_since: int = ANSWERS_UNCHANGED_SINCE


def running_versions() -> RunningVersions:
    """The running schema, edgebatch and TensorFlow versions, read from package metadata.

    TensorFlow is not imported (seconds, and gigabytes on a GPU): its installed distribution's
    version is what a probe run here would record.
    """
    return RunningVersions(
        schema_version=SCHEMA_VERSION,
        edgebatch=_distribution_version(("edgebatch",)),
        tensorflow=_distribution_version(_TENSORFLOW_DISTRIBUTIONS),
    )


def _distribution_version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


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

    The figures are the fleet plan's (plan.throughput_points: successful measured trials, the
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


def throughput_at_batch(trials: Sequence[Trial], batch: int) -> Throughput:
    """Samples/s at `batch` on the throughput curve the fleet plan uses (see Throughput)."""
    points = throughput_points(trials)
    for point in points:
        if point.batch == batch:
            return Throughput(batch, point.samples_per_second, "measured", point.steady)
    below = [point for point in points if point.batch < batch]
    above = [point for point in points if point.batch > batch]
    if not below or not above:
        return Throughput(batch, None, "unmeasured", None)
    low, high = below[-1], above[0]
    fraction = (batch - low.batch) / (high.batch - low.batch)
    rate = low.samples_per_second + (high.samples_per_second - low.samples_per_second) * fraction
    return Throughput(batch, rate, "interpolated", low.steady and high.steady)


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
    matrix_models: tuple[tuple[str, str], ...]  # (model key, model name)
    matrix_cells: dict[tuple[tuple[str, str], str], tuple[int, ...]]

    def count(self, kind: str) -> int:
        """How many rows carry a flag of `kind`."""
        return sum(1 for row in self.rows if any(flag.kind == kind for flag in row.flags))


# --- reading ------------------------------------------------------------------------------------

ProfileEntry = tuple[str, DeviceProfile]


def collect(
    locations: Sequence[str],
    *,
    on_location: Callable[[str, int, int], None] | None = None,
) -> tuple[list[ProfileEntry], list[InvalidFile]]:
    """Read every profile under `locations`: profile files, directories (recursively) or fsspec URLs.

    A URL whose last component ends in `.json` is read as one profile file, any other URL as a
    directory. Returns (source, profile) for each readable profile and an InvalidFile for each
    file that is not one (corrupt, invalid, misnamed, of another schema version) and for each
    location that does not exist or cannot be reached; one bad location never stops the others.
    `on_location(location, profiles, invalid)` is called after each location is read (for progress lines).
    """
    from edgebatch.profiles.location import ProfileURL, as_location
    from edgebatch.profiles.store import list_profiles, load_profile

    entries: list[ProfileEntry] = []
    invalid: list[InvalidFile] = []
    for text in locations:
        found_before, invalid_before = len(entries), len(invalid)
        try:
            location = as_location(text)
            if isinstance(location, ProfileURL) and location.name.endswith(".json"):
                listed = [(location, load_profile(location))]
            elif isinstance(location, ProfileURL) or location.is_dir():
                listed = list_profiles(location, recursive=True)
                if not listed and isinstance(location, ProfileURL):
                    # An object store cannot tell an empty prefix from a missing one; say both.
                    invalid.append(InvalidFile(text, f"{text} holds no profile files (or does not exist)"))
            elif location.is_file():
                listed = [(location, load_profile(location))]
            else:
                listed = []
                invalid.append(InvalidFile(text, f"{text} does not exist"))
        except EdgebatchError as error:
            listed = []
            invalid.append(InvalidFile(text, _one_line(str(error))))
        for source, item in listed:
            if isinstance(item, Exception):
                invalid.append(InvalidFile(str(source), _one_line(str(item))))
            else:
                entries.append((str(source), item))
        if on_location is not None:
            on_location(text, len(entries) - found_before, len(invalid) - invalid_before)
    return entries, invalid


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- analysis (pure) ----------------------------------------------------------------------------


def analyse(
    entries: Sequence[ProfileEntry],
    invalid: Sequence[InvalidFile] = (),
    *,
    now: datetime,
    running: RunningVersions,
) -> FleetReport:
    """Rows, matrix and flags for `entries`.

    * stale: the profile's schema version, TensorFlow major.minor or edgebatch version differs from
      the running ones (`running_versions()`), so its numbers may not hold for this install. (A file
      of another schema version cannot be read by this edgebatch at all: `collect` lists it as
      invalid, with the store's "written by a newer edgebatch" / "unknown schema_version" error.);
    * duplicate: the same (device fingerprint, model key, host) appears more than once;
    * outlier: the same fingerprint and model key on different hosts with max_batch values more than
      `OUTLIER_SPREAD_FRACTION` apart, measured as (largest - smallest) / smallest.

    Pure: the result depends only on the arguments. `now` must be timezone-aware. Rows are sorted
    by (host, fingerprint, model name, model key, source); every row of a duplicate or outlier
    group carries that group's flag.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (e.g. datetime.now(timezone.utc))")
    base_rows = sorted(
        (_row(source, profile, now) for source, profile in entries),
        key=lambda r: (r.host, r.device_fingerprint, r.model_name, r.model_key, r.source),
    )
    flags: dict[int, list[Flag]] = defaultdict(list)
    for index, row in enumerate(base_rows):
        flags[index].extend(_stale_flags(row, running))
    duplicates = _duplicates(base_rows, flags)
    outliers = _outliers(base_rows, flags)
    rows = tuple(_with_flags(row, tuple(flags[index])) for index, row in enumerate(base_rows))

    devices: dict[tuple[str, str], str] = {}
    models: dict[str, str] = {}
    cells: dict[tuple[tuple[str, str], str], set[int]] = defaultdict(set)
    for row in rows:
        devices.setdefault(row.device_id, row.device_description)
        models.setdefault(row.model_key, row.model_name)
        cells[(row.device_id, row.model_key)].add(row.safe_batch)
    return FleetReport(
        generated_at=now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        running=running,
        rows=rows,
        invalid=tuple(invalid),
        duplicates=duplicates,
        outliers=outliers,
        matrix_devices=tuple((host, fingerprint, devices[(host, fingerprint)]) for host, fingerprint in sorted(devices)),
        matrix_models=tuple(sorted(models.items(), key=lambda item: (item[1], item[0]))),
        matrix_cells={key: tuple(sorted(values)) for key, values in cells.items()},
    )


def _row(source: str, profile: DeviceProfile, now: datetime) -> ProfileRow:
    device, model, versions = profile.device, profile.model, profile.versions
    host_value = device.get("host")
    if isinstance(host_value, str) and host_value.strip():
        host, host_source = host_value, "profile"
    else:
        host, host_source = _parent_name(source), "directory"
    ray_node_id = device.get("ray_node_id")
    memory = profile.memory_model
    return ProfileRow(
        source=source,
        host=host,
        host_source=host_source,
        ray_node_id=ray_node_id if isinstance(ray_node_id, str) else None,
        device_fingerprint=profile.device_fingerprint,
        device_description=str(device.get("description", "")),
        device_kind=str(device["kind"]),
        tf_device=str(device["tf_device"]),
        model_name=str(model["name"]),
        model_key=profile.model_key,
        budget_bytes=profile.budget_bytes,
        headroom=profile.headroom,
        measure=profile.measure,
        max_batch=profile.max_batch,
        safe_batch=profile.safe_batch,
        throughput_knee=profile.throughput_knee,
        throughput_at_safe=throughput_at_batch(profile.answer_trials, profile.safe_batch),
        unsteady_batches=tuple(sorted({t.batch for t in profile.answer_trials if t.steady is False})),
        memory_fixed_bytes=None if memory is None else memory.fixed_bytes,
        memory_per_sample_bytes=None if memory is None else memory.per_sample_bytes,
        memory_r2=None if memory is None else memory.r2,
        created_at=profile.created_at,
        age_seconds=(now - parse_created_at(profile.created_at)).total_seconds(),
        schema_version=profile.schema_version,
        edgebatch_version=versions.get("edgebatch"),
        tensorflow_version=versions.get("tensorflow"),
        profile=profile,
    )


def parse_created_at(created_at: str) -> datetime:
    """A profile's created_at (validated ISO-8601 UTC, 'Z' allowed) as an aware datetime."""
    text = created_at[:-1] + "+00:00" if created_at.endswith(("Z", "z")) else created_at
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _parent_name(source: str) -> str:
    from edgebatch.profiles.location import as_location

    return as_location(source).parent.name or "."


def _with_flags(row: ProfileRow, flags: tuple[Flag, ...]) -> ProfileRow:
    return replace(row, flags=flags, profile=row.profile)


def _stale_flags(row: ProfileRow, running: RunningVersions) -> list[Flag]:
    reasons = []
    # Schema 2 only added per-length fields: a version-1 profile's answers mean what they meant.
    if row.schema_version < running.answers_unchanged_since:
        reasons.append(f"schema {row.schema_version}, this edgebatch writes {running.schema_version}")
    if running.tensorflow is not None:
        if row.tensorflow_version is None:
            reasons.append(f"no TensorFlow version recorded, running {tf_major_minor(running.tensorflow)}")
        elif tf_major_minor(str(row.tensorflow_version)) != tf_major_minor(running.tensorflow):
            reasons.append(
                f"TensorFlow {tf_major_minor(str(row.tensorflow_version))}, running {tf_major_minor(running.tensorflow)}"
            )
    if running.edgebatch is not None and row.edgebatch_version != running.edgebatch:
        reasons.append(f"edgebatch {row.edgebatch_version}, running {running.edgebatch}")
    if not reasons:
        return []
    return [Flag(STALE, "stale: " + "; ".join(reasons) + " (re-probe to trust its numbers here)")]


def _duplicates(rows: Sequence[ProfileRow], flags: dict[int, list[Flag]]) -> tuple[DuplicateGroup, ...]:
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        groups[(row.device_fingerprint, row.model_key, row.host)].append(index)
    found = []
    for (fingerprint, key, host), indices in sorted(groups.items()):
        if len(indices) < 2:
            continue
        first = _profile_dict(rows[indices[0]])
        identical = all(_profile_dict(rows[i]) == first for i in indices[1:])
        sources = tuple(rows[i].source for i in indices)
        found.append(DuplicateGroup(fingerprint, key, host, sources, identical))
        for index in indices:
            others = [rows[i].source for i in indices if i != index]
            where = "also read from " + ", ".join("this same file" if s == rows[index].source else s for s in others)
            what = "identical copies" if identical else "contents differ: " + _difference(rows, indices)
            flags[index].append(Flag(DUPLICATE, f"duplicate of this device, model and host ({where}; {what})"))
    return tuple(found)


def _profile_dict(row: ProfileRow) -> dict[str, Any] | None:
    return None if row.profile is None else row.profile.to_dict()


def _difference(rows: Sequence[ProfileRow], indices: Sequence[int]) -> str:
    parts = []
    for label, getter in (
        ("max_batch", lambda r: r.max_batch),
        ("safe_batch", lambda r: r.safe_batch),
        ("created_at", lambda r: r.created_at),
    ):
        values = [getter(rows[i]) for i in indices]
        if len(set(values)) > 1:
            parts.append(f"{label} " + " vs ".join(str(v) for v in values))
    return ", ".join(parts) or "other fields"


def _outliers(rows: Sequence[ProfileRow], flags: dict[int, list[Flag]]) -> tuple[OutlierGroup, ...]:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        groups[(row.device_fingerprint, row.model_key)].append(index)
    found = []
    for (fingerprint, key), indices in sorted(groups.items()):
        if len({rows[i].host for i in indices}) < 2:
            continue
        ceilings = [rows[i].max_batch for i in indices]
        smallest, largest = min(ceilings), max(ceilings)
        spread = (largest - smallest) / smallest
        if spread <= OUTLIER_SPREAD_FRACTION:
            continue
        members = tuple(
            OutlierMember(rows[i].host, rows[i].max_batch, rows[i].budget_bytes, rows[i].source)
            for i in sorted(indices, key=lambda i: (rows[i].max_batch, rows[i].host))
        )
        budgets_differ = len({m.budget_bytes for m in members}) > 1
        group = OutlierGroup(fingerprint, key, rows[indices[0]].model_name, spread, budgets_differ, members)
        found.append(group)
        message = outlier_message(group)
        for index in indices:
            flags[index].append(Flag(OUTLIER, message))
    return tuple(found)


def outlier_message(group: OutlierGroup, *, members_shown: int = 6) -> str:
    """One line: how far apart the ceilings are, each host's max_batch and budget, and whether budgets explain it."""
    from edgebatch.units import format_bytes

    # Duplicates (same host, ceiling and budget) say the same thing: once is enough.
    distinct = list(dict.fromkeys(
        f"{m.host}: {m.max_batch} at budget {format_bytes(m.budget_bytes)}" for m in group.members
    ))
    shown = distinct[:members_shown]
    if len(distinct) > members_shown:
        shown.append(f"and {len(distinct) - members_shown} more")
    cause = (
        "the budgets differ, which may explain it"
        if group.budgets_differ
        else "same budget, so the hosts themselves differ (other processes, drivers, memory limits)"
    )
    return (
        f"outlier: max_batch of the same hardware and model differs by {group.spread_fraction:.0%} across hosts "
        f"({'; '.join(shown)}); {cause}"
    )


def format_age(age_seconds: float) -> str:
    """'45 s', '12 min', '5 h', '3 d' (whole units, rounded down); 'in the future' when negative."""
    if age_seconds < 0:
        return "in the future"
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60)):
        if age_seconds >= seconds:
            return f"{int(age_seconds // seconds)} {unit}"
    return f"{int(age_seconds)} s"


def report_to_dict(report: FleetReport) -> dict[str, Any]:
    """The report as JSON-ready data (what `--json` prints). Sizes in bytes, ages in seconds."""
    return {
        "generated_at": report.generated_at,
        "running": {
            "schema_version": report.running.schema_version,
            "edgebatch": report.running.edgebatch,
            "tensorflow": report.running.tensorflow,
        },
        "rows": [_row_dict(row) for row in report.rows],
        "matrix": {
            "devices": [
                {"host": host, "device_fingerprint": fingerprint, "device_description": description}
                for host, fingerprint, description in report.matrix_devices
            ],
            "models": [{"model_key": key, "model_name": name} for key, name in report.matrix_models],
            "safe_batch": [
                [list(report.matrix_cells.get(((host, fingerprint), key), ())) for key, _name in report.matrix_models]
                for host, fingerprint, _description in report.matrix_devices
            ],
        },
        "duplicates": [
            {"device_fingerprint": g.device_fingerprint, "model_key": g.model_key, "host": g.host,
             "sources": list(g.sources), "identical": g.identical}
            for g in report.duplicates
        ],
        "outliers": [
            {"device_fingerprint": g.device_fingerprint, "model_key": g.model_key, "model_name": g.model_name,
             "spread_fraction": g.spread_fraction, "budgets_differ": g.budgets_differ,
             "members": [{"host": m.host, "max_batch": m.max_batch, "budget_bytes": m.budget_bytes,
                          "source": m.source} for m in g.members]}
            for g in report.outliers
        ],
        "invalid": [{"source": item.source, "error": item.error} for item in report.invalid],
    }


def _row_dict(row: ProfileRow) -> dict[str, Any]:
    rate = row.throughput_at_safe
    return {
        "source": row.source,
        "host": row.host,
        "host_source": row.host_source,
        "ray_node_id": row.ray_node_id,
        "device_fingerprint": row.device_fingerprint,
        "device_description": row.device_description,
        "device_kind": row.device_kind,
        "tf_device": row.tf_device,
        "model_name": row.model_name,
        "model_key": row.model_key,
        "budget_bytes": row.budget_bytes,
        "headroom": row.headroom,
        "measure": row.measure,
        "max_batch": row.max_batch,
        "safe_batch": row.safe_batch,
        "throughput_knee": row.throughput_knee,
        "samples_per_second_at_safe_batch": rate.samples_per_second,
        "samples_per_second_basis": rate.basis,
        "samples_per_second_steady": rate.steady,
        "unsteady_batches": list(row.unsteady_batches),
        "memory_fixed_bytes": row.memory_fixed_bytes,
        "memory_per_sample_bytes": row.memory_per_sample_bytes,
        "memory_r2": row.memory_r2,
        "created_at": row.created_at,
        "age_seconds": row.age_seconds,
        "versions": {
            "schema": row.schema_version,
            "edgebatch": row.edgebatch_version,
            "tensorflow": row.tensorflow_version,
        },
        "flags": [{"kind": flag.kind, "message": flag.message} for flag in row.flags],
    }
