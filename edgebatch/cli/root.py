"""The `edgebatch` group and its probe, devices and profile commands. Thin: parse, call one library
function, print text or --json (profile_text.py writes a profile's text).

Nothing here imports TensorFlow at module level, so `edgebatch --help` is instant; probes run
TensorFlow in worker processes anyway.
"""

from __future__ import annotations

import json

import click

from edgebatch.cli.errors import handle_errors as _handle_errors
from edgebatch.cli.fleet import fleet  # subcommands import lazily: see its docstring
from edgebatch.cli.probe_options import search_options
from edgebatch.cli.profile_text import format_profile
from edgebatch.cli.supervise import supervise
from edgebatch.errors import EdgebatchError


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgebatch")
def main() -> None:
    """Make TensorFlow training fit the device it runs on.

    \b
    edgebatch devices                 what memory and accelerators this machine has
    edgebatch probe                   find the largest safe batch (MobileNetV2 by default)
    edgebatch profile list            the cached device profiles
    edgebatch supervise -- CMD        restart a training command after a hard failure
    edgebatch fleet --help            profile, compare and plan a cluster's devices
    """


@main.command()
@search_options()
@click.option("--device", default=None, metavar="CPU:0|GPU:N", help="Device to probe. Default: GPU:0 if NVML sees one, else CPU:0.")
@click.option("--profiles-dir", default=None, metavar="DIR",
              help="Where profiles live. Default: $EDGEBATCH_PROFILES, else ./device_profiles.")
@click.option("--force", is_flag=True,
              help="Probe again even if a cached profile answers this request (same device, model, settings, budget).")
@click.option("--no-save", is_flag=True, help="Do not write the profile.")
@click.option("--json", "as_json", is_flag=True, help="Print only the profile JSON on stdout.")
@_handle_errors
def probe(model_spec, no_save, as_json, **options):
    """Find the largest training batch that fits, and cache it as a device profile."""
    from edgebatch.probing import probe as run

    # The remaining options are named exactly as edgebatch.probe's keyword arguments.
    profile = run(model_spec, save=not no_save, progress=_echo_err, **options)
    if as_json:
        click.echo(json.dumps(profile.to_dict(), indent=2))
    else:
        click.echo(format_profile(profile))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--no-tensorflow", is_flag=True, help="Do not import TensorFlow (faster; omits TF's view of devices).")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print what TensorFlow's runtime logged while it listed devices (on stderr).")
@_handle_errors
def devices(as_json, no_tensorflow, verbose):
    """Show the CPU, memory limits, pressure and GPUs edgebatch sees.

    TensorFlow's native start-up log is held back (it is shown with --verbose, and on its own where
    TensorFlow lists fewer GPUs than NVML, since it then says why).
    """
    from edgebatch.native_stderr import held_native_stderr
    from edgebatch.sensors import describe_devices, format_devices_text

    with held_native_stderr() as tensorflow_log:
        info = describe_devices(include_tensorflow=not no_tensorflow)
    missing_gpus = info["tensorflow"] is not None and len(info["tensorflow"]["gpu_devices"]) < sum(
        1 for gpu in info["gpus"] if gpu.get("index") is not None)
    if (verbose or missing_gpus) and tensorflow_log():
        if missing_gpus and not verbose:
            _echo_err("TensorFlow lists fewer GPUs than NVML; its runtime logged:")
        _echo_err(tensorflow_log().rstrip("\n"))
    click.echo(json.dumps(info, indent=2) if as_json else format_devices_text(info))


@main.group()
def profile() -> None:
    """List, show and validate cached device profiles."""


@profile.command("list")
@click.option("--profiles-dir", default=None, metavar="DIR", help="Default: $EDGEBATCH_PROFILES, else ./device_profiles.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_handle_errors
def profile_list(profiles_dir, as_json):
    """One line per cached profile."""
    from edgebatch.profiles import list_profiles, resolve_profiles_dir

    entries = list_profiles(resolve_profiles_dir(profiles_dir))
    if as_json:
        rows = [
            {"path": str(path), "error": str(item)} if isinstance(item, Exception) else
            {"path": str(path), "device": item.device["description"], "model": item.model["name"],
             "max_batch": item.max_batch, "safe_batch": item.safe_batch, "created_at": item.created_at}
            for path, item in entries
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    if not entries:
        click.echo(f"no profiles in {resolve_profiles_dir(profiles_dir)} (create one with `edgebatch probe`)")
        return
    for path, item in entries:
        if isinstance(item, Exception):
            click.echo(f"{path.name}: INVALID: {item}")
        else:
            click.echo(
                f"{path.name}: {item.model['name']} on {item.device['description']} ({item.device['kind']}): "
                f"max {item.max_batch}, safe {item.safe_batch}, knee {item.throughput_knee}, {item.created_at}"
            )


@profile.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the profile JSON.")
@_handle_errors
def profile_show(path, as_json):
    """Show one profile file."""
    from edgebatch.profiles import load_profile

    item = load_profile(path)
    click.echo(json.dumps(item.to_dict(), indent=2) if as_json else format_profile(item))


@profile.command("plot")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default=None, metavar="FILE.png", help="Default: the profile's path with .png.")
@_handle_errors
def profile_plot(path, output):
    """Plot memory and throughput against batch size for one profile (needs matplotlib)."""
    from pathlib import Path

    from edgebatch.plots import plot_profile
    from edgebatch.profiles import load_profile

    written = plot_profile(load_profile(path), output or Path(path).with_suffix(".png"))
    click.echo(f"wrote {written}")


@profile.command("validate")
@click.argument("paths", nargs=-1, type=click.Path())
@_handle_errors
def profile_validate(paths):
    """Validate profile files (default: every profile in the profiles directory). Exit 1 if any is invalid."""
    from edgebatch.profiles import list_profiles, load_profile, resolve_profiles_dir

    entries = []
    targets = [resolve_profiles_dir(p) for p in paths] or [resolve_profiles_dir(None)]  # URLs stay whole
    for target in targets:
        if target.is_dir():
            entries.extend(list_profiles(target))
        else:
            try:
                entries.append((target, load_profile(target)))
            except EdgebatchError as error:
                entries.append((target, error))
    bad = [(path, item) for path, item in entries if isinstance(item, Exception)]
    for path, item in entries:
        click.echo(f"{path}: {'INVALID: ' + str(item) if isinstance(item, Exception) else 'ok'}")
    if bad:
        raise EdgebatchError(f"{len(bad)} of {len(entries)} profiles are invalid")


main.add_command(supervise)
main.add_command(fleet)
