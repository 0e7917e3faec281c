"""The three flags of `edgebatch fleet report`: stale (versions or age), duplicate and outlier rows.

Pure: each function looks only at the rows (and the running versions) it is given. analyse
(report.py) calls them; what each flag means is in its docstring there. `find_duplicates` and
`find_outliers` append each group's Flag to every member row's list in `flags` (keyed by row index)
and return the groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from edgebatch.fleet.report_output import format_age
from edgebatch.fleet.report_records import (
    DUPLICATE,
    OUTLIER,
    STALE,
    DuplicateGroup,
    Flag,
    OutlierGroup,
    OutlierMember,
    ProfileRow,
    RunningVersions,
)
from edgebatch.profiles.fingerprint import tf_major_minor

#: Ceilings of the same hardware and model on different hosts further apart than this are outliers.
OUTLIER_SPREAD_FRACTION = 0.10


def stale_flags(row: ProfileRow, running: RunningVersions, max_age_seconds: float | None = None) -> list[Flag]:
    """A STALE flag when the row's schema, TensorFlow major.minor or edgebatch differs from `running`,
    or the profile is older than `max_age_seconds` (None: age not judged)."""
    reasons = []
    if row.schema_version < running.answers_unchanged_since:
        reasons.append(f"schema {row.schema_version}, this edgebatch writes {running.schema_version} "
                       "(its safe_batch follows an older, more cautious rule)")
    if running.tensorflow is not None:
        if row.tensorflow_version is None:
            reasons.append(f"no TensorFlow version recorded, running {tf_major_minor(running.tensorflow)}")
        elif tf_major_minor(str(row.tensorflow_version)) != tf_major_minor(running.tensorflow):
            reasons.append(
                f"TensorFlow {tf_major_minor(str(row.tensorflow_version))}, running {tf_major_minor(running.tensorflow)}"
            )
    if running.edgebatch is not None and row.edgebatch_version != running.edgebatch:
        reasons.append(f"edgebatch {row.edgebatch_version}, running {running.edgebatch}")
    if max_age_seconds is not None and row.age_seconds > max_age_seconds:
        reasons.append(f"{format_age(row.age_seconds)} old, over the {format_age(max_age_seconds)} --max-age")
    if not reasons:
        return []
    return [Flag(STALE, "stale: " + "; ".join(reasons) + " (re-probe to trust its numbers here)")]


def find_duplicates(rows: Sequence[ProfileRow], flags: dict[int, list[Flag]]) -> tuple[DuplicateGroup, ...]:
    """Rows of one (fingerprint, model key, host) found more than once; flags each member DUPLICATE."""
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


def find_outliers(rows: Sequence[ProfileRow], flags: dict[int, list[Flag]]) -> tuple[OutlierGroup, ...]:
    """Fingerprint + model key groups whose max_batch across hosts spreads over OUTLIER_SPREAD_FRACTION."""
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
