"""`edgebatch fleet report`, the decisions: merge many devices' profiles into rows and flags.

`analyse(entries, invalid, now=..., running=...)` turns profiles into a `FleetReport`: one
`ProfileRow` per profile, a device x model matrix of safe batches, and three kinds of flags (stale,
duplicate, outlier: `analyse` says what each means). Pure and testable without files.

The rest lives beside it, by idea, and is re-exported here for callers of this module:
report_records.py (the records), report_read.py (`collect`, `running_versions`: the I/O),
report_flags.py (the flags), report_output.py (`format_age`, `report_to_dict`: the --json form).
Every string in a row came from someone else's machine: the renderers (report_html.py,
cli/fleet_report.py) escape it for their medium.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone

from edgebatch.fleet.plan_model import throughput_points
from edgebatch.fleet.report_flags import (
    OUTLIER_SPREAD_FRACTION,
    find_duplicates,
    find_outliers,
    outlier_message,
    stale_flags,
)
from edgebatch.fleet.report_output import format_age, report_to_dict
from edgebatch.fleet.report_read import collect, running_versions
from edgebatch.fleet.report_records import (
    DUPLICATE,
    OUTLIER,
    STALE,
    DuplicateGroup,
    FleetReport,
    Flag,
    InvalidFile,
    OutlierGroup,
    OutlierMember,
    ProfileEntry,
    ProfileRow,
    RunningVersions,
    Throughput,
)
from edgebatch.profiles.model import DeviceProfile, Trial

# Re-exported: callers import these from here (cli/fleet_report.py, cli/fleet_plan.py, tests).
__all__ = [
    "DUPLICATE",
    "OUTLIER",
    "OUTLIER_SPREAD_FRACTION",
    "STALE",
    "DuplicateGroup",
    "FleetReport",
    "Flag",
    "InvalidFile",
    "OutlierGroup",
    "OutlierMember",
    "ProfileEntry",
    "ProfileRow",
    "RunningVersions",
    "Throughput",
    "analyse",
    "collect",
    "format_age",
    "outlier_message",
    "parse_created_at",
    "report_to_dict",
    "running_versions",
    "throughput_at_batch",
]


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


def analyse(
    entries: Sequence[ProfileEntry],
    invalid: Sequence[InvalidFile] = (),
    *,
    now: datetime,
    running: RunningVersions,
    max_age_seconds: float | None = None,
) -> FleetReport:
    """Rows, matrix and flags for `entries`.

    * stale: the profile's schema version, TensorFlow major.minor or edgebatch version differs from
      the running ones (`running_versions()`), so its numbers may not hold for this install; or it
      is older than `max_age_seconds` (None: age is not judged). (A file
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
        flags[index].extend(stale_flags(row, running, max_age_seconds))
    duplicates = find_duplicates(base_rows, flags)
    outliers = find_outliers(base_rows, flags)
    rows = tuple(_with_flags(row, tuple(flags[index])) for index, row in enumerate(base_rows))

    devices: dict[tuple[str, str], str] = {}
    # Columns are model keys (one model, settings and TensorFlow version each), labelled with every
    # name their profiles give: one profile's name must not relabel the column for every host.
    models: dict[str, set[str]] = defaultdict(set)
    cells: dict[tuple[tuple[str, str], str], set[int]] = defaultdict(set)
    for row in rows:
        devices.setdefault(row.device_id, row.device_description)
        models[row.model_key].add(row.model_name)
        cells[(row.device_id, row.model_key)].add(row.safe_batch)
    return FleetReport(
        generated_at=now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        running=running,
        rows=rows,
        invalid=tuple(invalid),
        duplicates=duplicates,
        outliers=outliers,
        matrix_devices=tuple((host, fingerprint, devices[(host, fingerprint)]) for host, fingerprint in sorted(devices)),
        matrix_models=tuple((key, " / ".join(sorted(names))) for key, names in sorted(models.items())),
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
