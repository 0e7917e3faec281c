"""`edgebatch fleet report --html`: the FleetReport as one self-contained HTML page.

Every name in a profile came from someone else's machine, so the page is rendered by Jinja2 with
autoescaping on for the whole template: a profile's text can only ever become text, never an element
or an attribute. No value from a profile is placed inside an attribute, a <style> block or a URL;
the only attribute values that vary are the plots' `src`, which are `data:image/png;base64,...`
URIs of PNGs drawn here (base64 holds no character HTML treats specially).

The page loads nothing: no scripts, no external CSS, fonts or images, so it opens offline and can
be mailed around. Plots need matplotlib (the `plots` extra); without it the page says how to get
them instead of failing.
"""

from __future__ import annotations

import base64
import io
import unicodedata
from collections import defaultdict
from dataclasses import dataclass

import jinja2

from edgebatch.fleet.report_flags import outlier_message
from edgebatch.fleet.report_output import format_age
from edgebatch.fleet.report_records import (
    DUPLICATE,
    OUTLIER,
    STALE,
    FleetReport,
    ProfileRow,
)
from edgebatch.units import format_bytes

GIB = 1024**3
PLOTS_HINT = "pip install 'edgebatch[plots]'"
# Plot labels are truncated: a 10 kB device description would otherwise squeeze the axes to nothing.
_PLOT_LABEL_CHARS = 48


@dataclass(frozen=True)
class DevicePlot:
    """One device's picture: memory vs batch and samples/s vs batch, every model on it in its own colour."""

    host: str
    device_fingerprint: str
    device_description: str
    png_base64: str


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>edgebatch fleet report</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.45em; text-align: left; vertical-align: top; }
th { background: #eee; }
td.num { text-align: right; }
.stale { background: #fff3c4; }
.duplicate { background: #e3e3ff; }
.outlier { background: #ffd9d9; }
.note { color: #666; font-size: 0.85em; }
td.flags { min-width: 14em; max-width: 28em; }
code { font-size: 0.9em; }
img { max-width: 100%; }
</style>
</head>
<body>
<h1>edgebatch fleet report</h1>
<p>Generated {{ report.generated_at }} by edgebatch {{ report.running.edgebatch or "(unknown version)" }}
(schema {{ report.running.schema_version }}, TensorFlow {{ report.running.tensorflow or "not installed" }}).
{{ report.rows | length }} profiles of {{ report.matrix_devices | length }} devices and
{{ report.matrix_models | length }} models; {{ report.invalid | length }} files could not be read.
Flagged: {{ report.count("stale") }} stale, {{ report.count("duplicate") }} duplicate,
{{ report.count("outlier") }} outlier.</p>

<h2>Safe batch, device x model</h2>
{% if report.matrix_devices %}
<table>
<thead><tr><th>host</th><th>device</th>{% for key, name in report.matrix_models %}<th><code>{{ key }}</code><br>{{ name }}</th>{% endfor %}</tr></thead>
<tbody>
{% for host, fingerprint, description in report.matrix_devices %}
<tr><td>{{ host }}</td><td>{{ description }}<br><code>{{ fingerprint }}</code></td>
{% for key, name in report.matrix_models %}{% set cell = report.matrix_cells.get(((host, fingerprint), key), ()) %}<td class="num">{{ cell | join(" / ") if cell else "-" }}</td>{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
{% else %}
<p>No readable profiles.</p>
{% endif %}

<h2>Profiles</h2>
{% if report.rows %}
<table>
<thead><tr><th>host</th><th>device</th><th>kind</th><th>TF device</th><th>model</th><th>budget</th>
<th>max batch</th><th>safe batch</th><th>knee</th><th>samples/s at safe batch</th><th>memory model</th>
<th>age</th><th>versions</th><th>flags</th><th>file</th></tr></thead>
<tbody>
{% for row in report.rows %}
<tr{% if row.flags %} class="{{ row_class(row) }}"{% endif %}>
<td>{{ row.host }}{% if row.host_source == "directory" %}<br><span class="note">(directory)</span>{% endif %}{% if row.ray_node_id %}<br><span class="note">ray {{ row.ray_node_id }}</span>{% endif %}</td>
<td>{{ row.device_description }}<br><code>{{ row.device_fingerprint }}</code></td>
<td>{{ row.device_kind }}</td>
<td>{{ row.tf_device }}</td>
<td>{{ row.model_name }}<br><code>{{ row.model_key }}</code></td>
<td class="num">{{ row.budget_bytes | bytes }}<br><span class="note">{{ row.measure }}, headroom {{ "%.0f" | format(row.headroom * 100) }}%</span></td>
<td class="num">{{ row.max_batch }}</td>
<td class="num">{{ row.safe_batch }}</td>
<td class="num">{{ row.throughput_knee if row.throughput_knee else "-" }}</td>
<td class="num">{{ row.throughput_at_safe | rate }}</td>
<td>{{ row | memory_model }}</td>
<td>{{ row.age_seconds | age }}<br><span class="note">{{ row.created_at }}</span></td>
<td>schema {{ row.schema_version }}<br>edgebatch {{ row.edgebatch_version }}<br>TF {{ row.tensorflow_version }}</td>
<td class="flags">{% for flag in row.flags %}{{ flag | flag_cell }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td>
<td><code>{{ row.source }}</code></td>
</tr>
{% endfor %}
</tbody>
</table>
<p class="note">Samples/s are measured at the safe batch, or interpolated linearly between the nearest measured
batches (marked "interp."); "not steady" marks figures that rest on a trial that timed its warm-up step.
The host is the profile's own <code>device.host</code>, else the name of the directory holding the file
(marked "(directory)").</p>
{% else %}
<p>No readable profiles.</p>
{% endif %}

{% if report.outliers %}
<h2>Outliers</h2>
<ul>
{% for group in report.outliers %}<li><code>{{ group.device_fingerprint }}</code>, {{ group.model_name }}: {{ outlier_text(group) }}</li>
{% endfor %}
</ul>
{% endif %}

{% if report.duplicates %}
<h2>Duplicates</h2>
<ul>
{% for group in report.duplicates %}<li><code>{{ group.device_fingerprint }}</code>, <code>{{ group.model_key }}</code> on {{ group.host }}
({{ "identical copies" if group.identical else "contents differ" }}):
{% for source in group.sources %}<code>{{ source }}</code>{% if not loop.last %}, {% endif %}{% endfor %}</li>
{% endfor %}
</ul>
{% endif %}

<h2>Files that could not be read</h2>
{% if report.invalid %}
<ul>
{% for item in report.invalid %}<li><code>{{ item.source }}</code>: {{ item.error }}</li>
{% endfor %}
</ul>
{% else %}
<p>None.</p>
{% endif %}

<h2>Memory and throughput against batch size</h2>
{% if plots_note %}
<p>{{ plots_note }}</p>
{% endif %}
{% for plot in plots %}
<h3>{{ plot.host }}: {{ plot.device_description }} <code>{{ plot.device_fingerprint }}</code></h3>
<p><img src="data:image/png;base64,{{ plot.png_base64 }}" alt="peak memory and samples per second against batch size"></p>
{% endfor %}
</body>
</html>
"""


def _environment() -> jinja2.Environment:
    # autoescape=True for every template this environment renders (it only renders TEMPLATE, which
    # is HTML); StrictUndefined turns a typo in the template into an error, not an empty cell.
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["bytes"] = format_bytes
    environment.filters["age"] = format_age
    environment.filters["rate"] = _format_rate
    environment.filters["memory_model"] = _format_memory_model
    environment.filters["flag_cell"] = _flag_cell
    environment.globals["row_class"] = _row_class
    environment.globals["outlier_text"] = lambda group: outlier_message(group).removeprefix("outlier: ")
    return environment


def render_html(report: FleetReport, *, plots: bool = True) -> str:
    """The report as one HTML page (a str). With plots=False, or without matplotlib, no pictures.

    Holds for any profile content: every profile-derived string reaches the page through
    Jinja2's autoescaping, and no such string is placed in an attribute.
    """
    device_plots: list[DevicePlot] = []
    note = None
    if not plots:
        note = "Plots were not drawn (--no-plots)."
    elif report.rows:
        try:
            device_plots = draw_device_plots(report.rows)
        except ImportError:
            note = f"Plots need matplotlib: {PLOTS_HINT}"
    template = _environment().from_string(TEMPLATE)
    return template.render(report=report, plots=device_plots, plots_note=note)


def _flag_cell(flag) -> str:
    """A flag as a table cell shows it: an outlier's or duplicate's group is listed once, below the
    table (every host of a large group in every row's cell made rows hundreds of pixels tall)."""
    if flag.kind == OUTLIER:
        return "outlier: see Outliers below"
    if flag.kind == DUPLICATE:
        return "duplicate: see Duplicates below"
    return flag.message


def _row_class(row: ProfileRow) -> str:
    # Class names come from this fixed list only, never from the profile.
    return " ".join(kind for kind in (STALE, DUPLICATE, OUTLIER) if kind in row.flag_kinds())


def _format_rate(throughput) -> str:
    if throughput.samples_per_second is None:
        return "not measured"
    text = f"{throughput.samples_per_second:,.0f}" if throughput.samples_per_second >= 10 else (
        f"{throughput.samples_per_second:.2f}"
    )
    if throughput.basis == "interpolated":
        text += " (interp.)"
    if throughput.steady is False:
        text += " (not steady)"
    return text


def _format_memory_model(row: ProfileRow) -> str:
    if row.memory_fixed_bytes is None or row.memory_per_sample_bytes is None:
        return "-"
    return (
        f"{format_bytes(row.memory_fixed_bytes)} + {format_bytes(row.memory_per_sample_bytes)}/sample"
        f" (r2 {row.memory_r2:.3f})"
    )


# --- plots --------------------------------------------------------------------------------------


def draw_device_plots(rows: tuple[ProfileRow, ...] | list[ProfileRow]) -> list[DevicePlot]:
    """One PNG (base64) per device (host, fingerprint), in row order; raises ImportError without matplotlib.

    Left: measured peak memory per trial (filled: fits, crosses: over budget, dotted verticals:
    OOM / killed without a peak), each model's fitted line and budget. Right: samples/s per
    successful trial on log axes (hollow markers: not steady-state).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_device: dict[tuple[str, str], list[ProfileRow]] = defaultdict(list)
    for row in rows:
        # A duplicate (same device, model and host) is drawn once: the first one read.
        if row.profile is not None and all(row.model_key != seen.model_key for seen in by_device[row.device_id]):
            by_device[row.device_id].append(row)
    result = []
    for (host, fingerprint), device_rows in by_device.items():
        figure = _device_figure(plt, device_rows)
        buffer = io.BytesIO()
        # metadata: drop matplotlib's "Software" stamp (it holds a URL, and nothing needs it).
        figure.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
        plt.close(figure)
        result.append(
            DevicePlot(host, fingerprint, device_rows[0].device_description,
                       base64.b64encode(buffer.getvalue()).decode("ascii"))
        )
    return result


def _device_figure(plt, device_rows: list[ProfileRow]):
    figure, (memory_axes, rate_axes) = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    budgets_drawn: set[int] = set()
    for index, row in enumerate(device_rows):
        profile = row.profile
        colour = colours[index % len(colours)]
        label = plot_text(row.model_name)
        measured = sorted((t for t in profile.answer_trials if t.measured and t.peak_bytes is not None), key=lambda t: t.batch)
        fits = [t for t in measured if t.ok]
        over = [t for t in measured if not t.ok]
        memory_axes.scatter([t.batch for t in fits], [t.peak_bytes / GIB for t in fits], color=colour, label=label)
        if over:
            memory_axes.scatter([t.batch for t in over], [t.peak_bytes / GIB for t in over], color=colour, marker="x")
        for trial in profile.answer_trials:
            if trial.measured and trial.peak_bytes is None:
                memory_axes.axvline(trial.batch, color=colour, linestyle=":", linewidth=1)
        model = profile.memory_model
        if model is not None:
            largest = max([t.batch for t in profile.answer_trials] + [profile.max_batch])
            memory_axes.plot([0, largest], [model.fixed_bytes / GIB, model.predict_bytes(largest) / GIB],
                             color=colour, linewidth=1, alpha=0.6)
        if profile.budget_bytes not in budgets_drawn:
            budgets_drawn.add(profile.budget_bytes)
            memory_axes.axhline(profile.budget_bytes / GIB, color=colour, linestyle="--", linewidth=1)
        rated = sorted((t for t in fits if t.samples_per_second), key=lambda t: t.batch)
        if rated:
            rate_axes.plot([t.batch for t in rated], [t.samples_per_second for t in rated], color=colour,
                           linewidth=1, label=label)
            steady = [t for t in rated if t.steady is not False]
            unsteady = [t for t in rated if t.steady is False]
            rate_axes.scatter([t.batch for t in steady], [t.samples_per_second for t in steady], color=colour)
            if unsteady:
                rate_axes.scatter([t.batch for t in unsteady], [t.samples_per_second for t in unsteady],
                                  facecolors="none", edgecolors=colour)
    memory_axes.plot([], [], color="gray", linewidth=1, label="fitted line")
    memory_axes.plot([], [], color="gray", linestyle="--", linewidth=1, label="budget")
    memory_axes.scatter([], [], color="gray", marker="x", label="over budget")
    memory_axes.set_xlabel("batch size")
    memory_axes.set_ylabel("peak memory, GiB")
    memory_axes.legend(fontsize=7)
    rate_axes.scatter([], [], facecolors="none", edgecolors="gray", label="not steady-state")
    rate_axes.set_xscale("log", base=2)
    rate_axes.set_yscale("log")
    rate_axes.set_xlabel("batch size")
    rate_axes.set_ylabel("samples / s")
    rate_axes.legend(fontsize=7)
    first = device_rows[0]
    figure.suptitle(plot_text(f"{first.host}: {first.device_description} ({first.tf_device})"), fontsize=10)
    figure.tight_layout()
    return figure


def plot_text(text: str) -> str:
    """`text` as matplotlib draws it literally: '$' escaped (no mathtext), no control characters,
    no leading '_' (a legend hides such labels), at most 48 characters."""
    cleaned = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in str(text))
    if len(cleaned) > _PLOT_LABEL_CHARS:
        cleaned = cleaned[: _PLOT_LABEL_CHARS - 3] + "..."
    cleaned = cleaned.replace("$", r"\$")
    return " " + cleaned if cleaned.startswith("_") else cleaned
