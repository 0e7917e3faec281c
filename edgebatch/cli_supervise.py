"""`edgebatch supervise -- COMMAND...`: run training in a child and restart it when it is killed.

Kept apart from cli.py so the probe commands and this one change independently; cli.py only
registers it. Thin: parse, call `edgebatch.training.supervisor.supervise`, exit with its code.
"""

from __future__ import annotations

import sys

import click

from edgebatch.errors import EdgebatchError, UsageError
from edgebatch.training.supervisor import DEFAULT_MAX_RESTARTS


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--max-restarts", type=click.IntRange(min=0), default=DEFAULT_MAX_RESTARTS, show_default=True,
              help="Restart the command at most this many times after a crash kills it "
                   "(SIGKILL, SIGABRT, SIGSEGV, SIGBUS).")
@click.option("--checkpoint-dir", default=None, metavar="DIR",
              help="The checkpoint_dir the command passes to edgebatch.fit: the supervisor reads there which "
                   "micro-batch was running when the child died, and tells the restarted child's governor.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def supervise(max_restarts, checkpoint_dir, command):
    """Run COMMAND (after --) and restart it from its last checkpoint when it is killed.

    \b
    edgebatch supervise --checkpoint-dir ckpt -- python train.py --epochs 3

    A normal exit ends supervision with the command's exit code (a Python exception is not
    restarted); SIGINT/SIGTERM are forwarded to the command. The report goes to stderr.
    """
    from edgebatch.training.supervisor import supervise as run

    try:
        report = run(list(command), checkpoint_dir=checkpoint_dir, max_restarts=max_restarts,
                     progress=lambda line: click.echo(line, err=True))
    except UsageError as error:
        raise click.UsageError(str(error)) from None
    except EdgebatchError as error:
        exception = click.ClickException(str(error))
        exception.exit_code = error.exit_code
        raise exception from None
    sys.exit(report.exit_code)
