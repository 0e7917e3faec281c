"""How every `edgebatch` command turns library errors into one line and an exit code (2 usage, 1 runtime)."""

from __future__ import annotations

import functools
import sys

import click

from edgebatch.errors import EdgebatchError, UsageError


def handle_errors(function):
    """Library errors become one line and the right exit code (2 usage, 1 runtime), no traceback."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except UsageError as error:
            raise click.UsageError(str(error)) from None
        except EdgebatchError as error:
            exception = click.ClickException(str(error))
            exception.exit_code = error.exit_code
            raise exception from None
        except KeyboardInterrupt:
            click.echo("edgebatch: interrupted; nothing was written", err=True)
            sys.exit(130)

    return wrapper
