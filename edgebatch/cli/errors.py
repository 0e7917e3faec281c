"""How every `edgebatch` command turns library errors into one line and an exit code (2 usage, 1 runtime),
and Ctrl-C or SIGTERM into a clean stop (130 and 143, as a shell reports those signals)."""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

import click

from edgebatch.errors import EdgebatchError, UsageError


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, as Ctrl-C raises KeyboardInterrupt.

    A subclass of KeyboardInterrupt, so every cleanup that runs on Ctrl-C runs on SIGTERM too: probe
    workers and the fork server are stopped, a profile write in progress removes its temporary file
    (profiles/store.py). Without it SIGTERM, what schedulers and `kill` send, ends the process at once:
    the workers still die with it (PR_SET_PDEATHSIG), but a write cut short can leave its temporary
    file behind.
    """


def _raise_terminated(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises():
    """While active, SIGTERM raises Terminated in the main thread.

    Only where SIGTERM has its default action: a parent that set it ignored meant it, and a handler
    someone else installed is theirs. The previous handler is restored afterwards. `edgebatch supervise`
    installs its own handler while its child runs (it forwards the signal), and restores this one.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def handle_errors(function):
    """Library errors become one line and the right exit code (2 usage, 1 runtime), no traceback;
    Ctrl-C exits with 130 and SIGTERM with 143, each after the same cleanup and with one line."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            with sigterm_raises():
                return function(*args, **kwargs)
        except UsageError as error:
            raise click.UsageError(str(error)) from None
        except EdgebatchError as error:
            exception = click.ClickException(str(error))
            exception.exit_code = error.exit_code
            raise exception from None
        except Terminated:
            click.echo("edgebatch: terminated (SIGTERM); nothing was written", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            click.echo("edgebatch: interrupted; nothing was written", err=True)
            sys.exit(130)

    return wrapper
