"""`edgebatch fleet plan`: split an effective batch across profiled devices (edgebatch/fleet/plan.py decides).

Which profiles count: every readable profile under the given files, directories (recursively:
a fleet probe writes `<dir>/nodes/<node-label>/<file>.json`) or fsspec URLs whose model key is
`--model` exactly; if none has that key, the profiles of the key that model *name* `--model` has,
provided the name spans one key (a name that spans several keys is refused, listing them:
different keys are different models, settings or TensorFlow versions). One device per profile, named by its
`device["host"]` when it has one, else by the directory its file sits in; the same (name,
fingerprint) met twice (a directory given twice, a copied file) counts once, the newest profile.
Unreadable profiles and missing locations are skipped with a line on stderr each; if nothing is
left to read, that is an error (exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import click

from edgebatch.cli.errors import handle_errors
from edgebatch.cli.fleet_report import terminal_text
from edgebatch.errors import ProfileError, UsageError
from edgebatch.fleet.plan import FleetPlan, PlanDevice, device_from_profile, plan_fleet
from edgebatch.profiles.location import is_url


@click.command("plan")
@click.option("--model", "model", required=True, metavar="KEY",
              help="Model key of the profiles to plan with (or a model name that maps to one key).")
@click.option("--effective-batch", "effective_batch", type=int, required=True, metavar="N",
              help="Samples per update, summed over all devices.")
@click.option("--overhead-seconds", "overhead_seconds", type=float, default=0.0, show_default=True,
              help="Fixed cost added to every update that uses more than one device: the gradient exchange and "
                   "fit's own per-update work. Measure it on a short run of the planned split: its update time less the "
                   "prediction without it (tools/bench/multi_worker_bench.py does). The table shows each prediction "
                   "with and without it.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of a table.")
@click.argument("locations", nargs=-1, metavar="PATH_OR_URL...")
@handle_errors
def plan(model, effective_batch, overhead_seconds, as_json, locations):
    """Split an effective batch across profiled devices for the shortest synchronous update.

    Each device gets a micro-batch within its safe batch, an accumulation count and a share of
    the effective batch; the shares sum to N, and the predicted update time (from each profile's
    measured samples/s, interpolated between trials) is the smallest possible. Devices that
    would not shorten the update are left out, with the reason. The naive equal split is shown
    beside it. Default PATH: $EDGEBATCH_PROFILES, else ./device_profiles.
    """
    if effective_batch < 1:
        raise UsageError(f"--effective-batch must be at least 1, got {effective_batch}")
    if overhead_seconds < 0:
        raise UsageError(f"--overhead-seconds must be >= 0, got {overhead_seconds:g}")
    if not locations:
        from edgebatch.profiles.store import resolve_profiles_dir

        locations = (str(resolve_profiles_dir(None)),)
    entries, invalid = read_profiles(locations)
    for source, message in invalid:
        click.echo(terminal_text(f"edgebatch: skipped {source}: {message}"), err=True)
    selected, key = select_model(entries, model, locations)
    devices, sources, duplicates = plan_devices(selected)
    for message in duplicates:
        click.echo(terminal_text(f"edgebatch: {message}"), err=True)
    result = plan_fleet(devices, effective_batch, update_overhead_seconds=overhead_seconds)
    if as_json:
        data = {"model_key": key, **result.to_dict(),
                "sources": {device.device_id: source for device, source in zip(devices, sources)}}
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_plan(result, key))


def read_profiles(locations) -> tuple[list[tuple[str, object]], list[tuple[str, str]]]:
    """(source, profile) for each readable profile under `locations`; (source, why) for each that gave none.

    Reads like `edgebatch fleet report` (edgebatch.fleet.report.collect): files, directories
    recursively, fsspec URLs (a `.json` URL is one file). A location or file given twice counts once.
    """
    from edgebatch.fleet.report import collect

    entries, invalid = collect(list(dict.fromkeys(str(location) for location in locations)))
    unique = list({source: (source, profile) for source, profile in entries}.values())
    return unique, [(item.source, item.error) for item in invalid]


def select_model(entries, model: str, locations) -> tuple[list[tuple[str, object]], str]:
    """The entries whose model key is `model`, else whose model name is (if that names one key); and the key."""
    by_key = [(source, profile) for source, profile in entries if profile.model_key == model]
    if by_key:
        return by_key, model
    by_name = [(source, profile) for source, profile in entries if profile.model.get("name") == model]
    keys = sorted({profile.model_key for _, profile in by_name})
    if len(keys) == 1:  # the key's profiles, also those that name the model otherwise
        return [(source, profile) for source, profile in entries if profile.model_key == keys[0]], keys[0]
    where = ", ".join(str(location) for location in locations)
    if len(keys) > 1:
        raise UsageError(f"model name {model!r} has profiles under several keys in {where}: {', '.join(keys)}; "
                         "give one key with --model")
    if not entries:
        raise ProfileError(f"no readable device profiles in {where}: run `edgebatch probe` or "
                           "`edgebatch fleet probe` first")
    counts: dict[str, int] = {}
    for _, profile in entries:
        counts[profile.model_key] = counts.get(profile.model_key, 0) + 1
    available = ", ".join(f"{key} ({count} device{'s' if count > 1 else ''})" for key, count in sorted(counts.items()))
    raise UsageError(f"no profile for model {model!r} in {where}; available keys: {available}")


def plan_devices(selected) -> tuple[list[PlanDevice], list[str], list[str]]:
    """One PlanDevice per (name, fingerprint), the newest profile winning; its source; a line per duplicate dropped."""
    chosen: dict[tuple[str, str], tuple[str, object]] = {}
    messages = []
    for source, profile in selected:
        name = _device_name(source, profile)
        key = (name, profile.device_fingerprint)
        if key in chosen:
            other_source, other = chosen[key]
            newer, older = ((source, profile), (other_source, other)) if profile.created_at > other.created_at \
                else ((other_source, other), (source, profile))
            messages.append(f"{older[0]} is the same device as {newer[0]} ({name}); using the newer profile")
            chosen[key] = newer
        else:
            chosen[key] = (source, profile)
    names = [name for name, _ in chosen]
    devices, sources = [], []
    for (name, fingerprint), (source, profile) in chosen.items():
        label = name if names.count(name) == 1 else f"{name}/{fingerprint}"
        devices.append(device_from_profile(profile, device_id=label, label=label))
        sources.append(source)
    return devices, sources, messages


def format_plan(result: FleetPlan, model_key: str) -> str:
    split = result.plan
    used = len(split.assignments)
    lines = [
        f"Plan for {model_key}: effective batch {result.effective_batch} over {used} device{'s' if used > 1 else ''}"
        + (f" ({len(result.left_out)} left out)" if result.left_out else ""),
        "",
    ]
    header = ("device", "safe batch", "micro-batch", "accumulation", "share", "predicted s", "samples/s")
    rows = []
    for a in split.assignments:
        accumulation = str(a.accumulation) + (f" (last {a.last_micro_batch})" if a.last_micro_batch != a.micro_batch else "")
        rate = a.samples_per_second
        rows.append((a.label, str(a.safe_batch), str(a.micro_batch), accumulation, str(a.share),
                     f"{a.predicted_seconds:.4g}", "-" if rate is None else f"{rate:.1f}"))
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        lines.append("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    lines.append("")
    for left in result.left_out:
        lines.append(f"  left out: {left.label}: {left.reason}")
    if result.left_out:
        lines.append("")
    equal = result.equal_split
    working = [a for a in equal.assignments if a.share > 0]
    shares = sorted({a.share for a in working})
    share_text = str(shares[0]) if len(shares) == 1 else f"{shares[0]}-{shares[-1]}"
    lines.append(f"  predicted update  {split.predicted_update_seconds:.4g} s{_overhead_text(split)}")
    lines.append(
        f"  equal split       {equal.predicted_update_seconds:.4g} s{_overhead_text(equal)} ({share_text} each on {len(working)} "
        f"device{'s' if len(working) > 1 else ''}, "
        f"micro-batch <= {result.equal_micro_batch} (the smallest ceiling), slowest {equal.slowest.label})"
    )
    lines.append(f"  speedup           {result.speedup:.2f}x over the equal split")
    for note in result.notes:
        lines.append(f"  note: {note}")
    # Host names come from profiles, someone else's files: control characters print as escapes.
    return "\n".join(terminal_text(line) for line in lines)


def _overhead_text(split) -> str:
    """', X s without the Y s overhead' where the split's update time includes one."""
    if not split.overhead_seconds or sum(1 for a in split.assignments if a.share > 0) < 2:
        return ""
    return f" ({split.predicted_update_seconds - split.overhead_seconds:.4g} s without the {split.overhead_seconds:g} s overhead)"


def _device_name(source: str, profile) -> str:
    host = profile.device.get("host")
    if isinstance(host, str) and host.strip():
        return host.strip()
    if is_url(source):
        return PurePosixPath(urlsplit(source).path).parent.name or urlsplit(source).netloc
    return Path(source).parent.name or "."
