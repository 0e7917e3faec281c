"""`edgebatch fleet report PATH_OR_URL... [--html FILE] [--json]`: many devices' profiles, one view.

Reads through edgebatch.fleet.report (collect, analyse), prints a text table (or --json) on stdout
and, with --html, writes one self-contained page (edgebatch.fleet.report_html). Profile text is
someone else's: the text table shows control characters as escapes so a profile cannot drive the
terminal, and the page escapes everything through Jinja2.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

import click

from edgebatch.cli.errors import handle_errors
from edgebatch.errors import EdgebatchError, UsageError
from edgebatch.files import write_atomically
from edgebatch.fleet.report import (
    DUPLICATE,
    OUTLIER,
    STALE,
    FleetReport,
    analyse,
    collect,
    format_age,
    outlier_message,
    report_to_dict,
    running_versions,
)

#: A location that yields at least this many files gets a progress line on stderr.
PROGRESS_MIN_FILES = 20
# Text-table cells longer than this are cut (the --json and --html outputs keep them whole).
_CELL_CHARS = 40
_FLAG_LETTERS = {STALE: "S", DUPLICATE: "D", OUTLIER: "O"}


@click.command("report")
@click.argument("locations", nargs=-1, required=True, metavar="PATH_OR_URL...")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True), default=None, metavar="FILE",
              help="Also write the report as one self-contained HTML page (tables and plots; opens offline).")
@click.option("--json", "as_json", is_flag=True, help="Print the merged records as JSON instead of the table.")
@click.option("--no-plots", is_flag=True, help="Leave the plots out of the HTML page (faster for large fleets).")
@click.option("--max-age", "max_age", default="180d", show_default=True, metavar="AGE",
              help="Flag profiles older than this as stale: a number with d, h or w (hardware, drivers and "
                   "other processes change); 'none' to not judge age.")
@handle_errors
def report(locations, html_path, as_json, no_plots, max_age):
    """Merge profiles from many devices: one row per device x model, with stale, duplicate and outlier flags.

    PATH_OR_URL is a profile file, a directory (searched recursively, e.g. the one `edgebatch
    fleet probe` wrote) or an fsspec URL. Files that are not valid profiles are listed with their
    error and do not stop the report. Exit 0 when at least one profile was read (flags or not), 1
    when none was (the report, listing what could not be read, is still printed) or the HTML could
    not be written, 2 on bad usage.
    """
    max_age_seconds = parse_max_age(max_age)
    entries, invalid = collect(list(locations), on_location=_progress)
    result = analyse(entries, invalid, now=datetime.now(timezone.utc), running=running_versions(),
                     max_age_seconds=max_age_seconds)
    if as_json:
        click.echo(json.dumps(report_to_dict(result), indent=2))
    else:
        click.echo(format_text(result))
    if html_path is not None:
        from edgebatch.fleet.report_html import render_html

        written = write_atomically(Path(html_path), render_html(result, plots=not no_plots))
        click.echo(f"wrote {written}", err=as_json)
    if not entries:
        # After the outputs, so the files that could not be read are still listed.
        raise EdgebatchError(f"no readable profile in {', '.join(locations)}")


_AGE_UNITS_SECONDS = {"h": 3600, "d": 86400, "w": 7 * 86400}


def parse_max_age(text: str) -> float | None:
    """'90d', '12h', '2w' as seconds; 'none' as None. A usage error (exit 2) for anything else."""
    cleaned = str(text).strip().lower()
    if cleaned == "none":
        return None
    number, unit = cleaned[:-1], cleaned[-1:]
    if unit in _AGE_UNITS_SECONDS and number.isdigit() and int(number) > 0:
        return int(number) * _AGE_UNITS_SECONDS[unit]
    raise UsageError(f"--max-age {text!r}: give a whole number > 0 with d, h or w (e.g. 90d), or 'none'")


def _progress(location: str, profiles: int, invalid: int) -> None:
    if profiles + invalid >= PROGRESS_MIN_FILES:
        click.echo(f"read {profiles} profiles and {invalid} invalid files from {terminal_text(location)}", err=True)


def terminal_text(text: object, limit: int | None = None) -> str:
    """`text` safe to print: control and format characters (ESC, bidi overrides) shown as \\x/\\u escapes."""
    shown = "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")
        else ch
        for ch in str(text)
    )
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 3] + "..."
    return shown


def format_text(result: FleetReport) -> str:
    """The report as a plain-text table plus its flags and unreadable files (what stdout shows)."""
    header = ["host", "device", "model", "max", "safe", "knee", "samples/s@safe", "memory model", "age", "flags"]
    table = [header]
    for row in result.rows:
        rate = row.throughput_at_safe
        if rate.samples_per_second is None:
            rate_text = "-"
        else:
            rate_text = f"{rate.samples_per_second:.1f}" + ("~" if rate.basis == "interpolated" else "")
            rate_text += "!" if rate.steady is False else ""
        memory = "-"
        if row.memory_fixed_bytes is not None and row.memory_per_sample_bytes is not None:
            memory = f"{row.memory_fixed_bytes / 2**20:.0f}+{row.memory_per_sample_bytes / 2**20:.2f}/sample MiB"
        table.append([
            terminal_text(row.host, _CELL_CHARS),
            terminal_text(f"{row.device_description} ({row.tf_device})", _CELL_CHARS),
            terminal_text(row.model_name, _CELL_CHARS),
            str(row.max_batch),
            str(row.safe_batch),
            str(row.throughput_knee or "-"),
            rate_text,
            memory,
            format_age(row.age_seconds),
            "".join(_FLAG_LETTERS[kind] for kind in row.flag_kinds()) or "-",
        ])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    lines.append(
        f"{len(result.rows)} profiles, {len(result.matrix_devices)} devices, {len(result.matrix_models)} models; "
        f"{result.count(STALE)} stale (S), {result.count(DUPLICATE)} duplicate (D), {result.count(OUTLIER)} outlier (O); "
        f"{len(result.invalid)} unreadable. samples/s: ~ interpolated, ! not steady-state."
    )
    notes = []
    for row in result.rows:
        for flag in row.flags:
            if flag.kind != OUTLIER:  # one line per outlier group below, not one per member
                notes.append(f"  {terminal_text(row.host)} {terminal_text(row.model_name)}: {terminal_text(flag.message)}")
    for group in result.outliers:
        notes.append(f"  {terminal_text(group.model_name)} on {group.device_fingerprint}: "
                     f"{terminal_text(outlier_message(group))}")
    if notes:
        lines.append("flags:")
        lines.extend(dict.fromkeys(notes))  # each member of a duplicate group says the same: once is enough
    if result.invalid:
        lines.append("unreadable:")
        lines.extend(f"  {terminal_text(item.source)}: {terminal_text(item.error)}" for item in result.invalid)
    return "\n".join(lines)
