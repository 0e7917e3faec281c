"""`edgebatch supervise -- COMMAND...`: run training in a child and restart it when it is killed.

Kept apart from root.py so the probe commands and this one change independently; root.py only
registers it. Thin: parse, call `edgebatch.training.supervisor.supervise`, exit with its code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from edgebatch.cli.errors import handle_errors
from edgebatch.errors import EdgebatchError
from edgebatch.files import write_atomically
from edgebatch.training.supervisor import DEFAULT_MAX_RESTARTS


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--max-restarts", type=click.IntRange(min=0), default=DEFAULT_MAX_RESTARTS, show_default=True,
              help="Restart the command at most this many times after a crash kills it "
                   "(SIGKILL, SIGABRT, SIGSEGV, SIGBUS).")
@click.option("--checkpoint-dir", default=None, metavar="DIR",
              help="The checkpoint_dir the command passes to edgebatch.fit: the supervisor reads there which "
                   "micro-batch was running when the child died, and tells the restarted child's governor.")
@click.option("--report", "report_path", default=None, metavar="FILE.json",
              help="Also write the final report (every child's end, restarts, signals, exit code) as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def supervise(max_restarts, checkpoint_dir, report_path, command):
    """Run COMMAND (after --) and restart it from its last checkpoint when it is killed.

    \b
    edgebatch supervise --checkpoint-dir ckpt -- python train.py --epochs 3

    A normal exit ends supervision with the command's exit code (a Python exception is not
    restarted); SIGINT/SIGTERM/SIGHUP are forwarded to the command. The report goes to stderr
    (and, with --report, to a JSON file).
    """
    from edgebatch.training.supervisor import supervise as run

    if report_path is not None and not Path(report_path).resolve().parent.is_dir():
        raise click.UsageError(f"--report {report_path!r}: its folder does not exist")
    report = run(list(command), checkpoint_dir=checkpoint_dir, max_restarts=max_restarts,
                 progress=lambda line: click.echo(line, err=True))
    if report_path is not None:
        _write_json(report_path, report.to_dict())
    sys.exit(report.exit_code)


def _write_json(path: str, data: dict) -> None:
    """Replace `path` atomically: a reader never sees half a report (files.write_atomically)."""
    try:
        write_atomically(Path(path), json.dumps(data, indent=2) + "\n")
    except EdgebatchError as error:
        raise click.ClickException(f"cannot write the report: {error}") from None
