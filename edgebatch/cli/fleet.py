"""`edgebatch fleet ...`: profile a cluster's devices, compare the profiles, plan a mixed fleet.

Each subcommand lives in its own module here (fleet_probe.py, fleet_report.py, fleet_plan.py) and
is imported only when it runs, so `edgebatch --help` stays instant and a missing optional
dependency (Ray, matplotlib) only matters to the subcommand that needs it.
"""

from __future__ import annotations

import importlib

import click

# name -> (module, attribute, one-line help shown by `edgebatch fleet --help`)
_COMMANDS = {
    "probe": ("edgebatch.cli.fleet_probe", "probe", "Probe every device of a Ray cluster, one task per node."),
    "report": ("edgebatch.cli.fleet_report", "report", "Merge profiles from many devices into one table and HTML page."),
    "plan": ("edgebatch.cli.fleet_plan", "plan", "Split an effective batch across profiled devices for the shortest update."),
}


class _LazyGroup(click.Group):
    """A click group whose commands are imported on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module_name, attribute, _help = _COMMANDS[name]
        return getattr(importlib.import_module(module_name), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help must not import every subcommand's module: show the short help kept above.
        rows = [(name, _COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup)
def fleet() -> None:
    """Profile a cluster's CPUs and GPUs, compare the profiles, plan a mixed fleet.

    \b
    edgebatch fleet probe --address auto --model SPEC    one probe per node of a Ray cluster
    edgebatch fleet report DIR_OR_URL... --html fleet.html
    edgebatch fleet plan --model KEY --effective-batch N DIR_OR_URL...
    """
