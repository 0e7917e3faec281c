"""`edgebatch fleet probe`: one probe task per alive node of a Ray cluster; a table of what each saved."""

from __future__ import annotations

import dataclasses
import json

import click

from edgebatch.cli.errors import handle_errors
from edgebatch.cli.probe_options import search_options
from edgebatch.fleet.cluster import DEFAULT_NODE_TIMEOUT_SECONDS, NODES_SUBDIR, RAY_INIT_TIMEOUT_SECONDS
from edgebatch.probing.budget import MEMORY_BUDGET_ENV

_FLEET_BUDGET_HELP = (
    f"Budget for every node's devices (e.g. 6GiB). Default: each node's own ${MEMORY_BUDGET_ENV} if its environment sets it "
    f"(e.g. `{MEMORY_BUDGET_ENV}=6GiB ray start ...`), else its device default (available RAM or cgroup room on CPU, "
    "NVML free memory on GPU)."
)


@click.command()
@click.option("--address", default="auto", show_default=True, metavar="ADDR|auto|local",
              help="Ray cluster: 'auto' (the one this machine joined), HOST:PORT, ray://HOST:10001, or 'local' "
                   "for a one-node Ray started here.")
@search_options(budget_help=_FLEET_BUDGET_HELP, budget_envvar=None)
@click.option("--profiles-dir", default=None, metavar="DIR|URL",
              help=f"Where the profiles are collected, one subdirectory per node ({NODES_SUBDIR}/<node>/). "
                   "A local directory or an fsspec URL. Default: $EDGEBATCH_PROFILES, else ./device_profiles.")
@click.option("--node-timeout", "node_timeout_seconds", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_NODE_TIMEOUT_SECONDS, show_default=True,
              help="Seconds to wait for the slowest node; a node still probing then is cancelled and reported.")
@click.option("--connect-timeout", "connect_timeout_seconds", type=click.FloatRange(min=0, min_open=True),
              default=RAY_INIT_TIMEOUT_SECONDS, show_default=True,
              help="Seconds Ray may take to connect to the cluster (or start a local one) before the probe gives up.")
@click.option("--cpus-per-task", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="CPUs each node's probe task reserves in Ray (at most what the node has).")
@click.option("--no-save", is_flag=True, help="Do not write the profiles; only print what each node found.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per (node, device) on stdout.")
@handle_errors
def probe(model_spec, address, profiles_dir, node_timeout_seconds, connect_timeout_seconds, cpus_per_task, no_save,
          as_json, **options):
    """Probe every alive node of a Ray cluster (each GPU of a GPU node, else its CPU) and collect the profiles.

    Progress lines from every node stream to stderr as `[node device] ...`, and one line as each
    node finishes. A node that fails or disappears shows its error in the result column; the
    others carry on. A FILE.py or FILE.keras model is sent with the tasks, so it need not exist on
    the nodes (modules a FILE.py imports must be installed there). Exit status 1 if any device
    probe failed.
    """
    from edgebatch.errors import EdgebatchError
    from edgebatch.fleet.cluster import connect, fleet_probe
    from edgebatch.fleet.nodes import format_results

    from edgebatch.models.zoo import parse_model_spec

    parse_model_spec(model_spec)  # a wrong name or a missing file is said before Ray starts
    connect(address, timeout_seconds=connect_timeout_seconds)
    results = fleet_probe(
        model_spec,
        address=address,
        profiles_dir=profiles_dir,
        options=options,
        node_timeout_seconds=node_timeout_seconds,
        cpus_per_task=cpus_per_task,
        save=not no_save,
        progress=lambda line: click.echo(line, err=True),
    )
    if as_json:
        rows = [{key: value for key, value in dataclasses.asdict(result).items() if key != "profile"}
                for result in results]
        click.echo(json.dumps(rows, indent=2))
    else:
        click.echo(format_results(results))
    failed = [result for result in results if not result.ok]
    if failed:
        raise EdgebatchError(f"{len(failed)} of {len(results)} device probes failed (see the table above)")
