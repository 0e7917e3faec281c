"""edgebatch.cli.errors.sigterm_raises: SIGTERM becomes an exception the commands' cleanup sees, only where its action is the default."""

import os
import signal

import click
import pytest
from click.testing import CliRunner

from edgebatch.cli.errors import Terminated, handle_errors, sigterm_raises


def deliver_sigterm():
    """What the kernel does on SIGTERM, done by calling the installed handler: where a bug left the
    default action in place, this fails the test instead of killing the test run (a real signal to
    a real probe is tests/test_probe_models.py's)."""
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler), f"SIGTERM's action is {handler!r}, not a handler"
    handler(signal.SIGTERM, None)


@pytest.fixture
def sigterm_default():
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_raises_inside_and_the_default_is_back_after(sigterm_default):
    cleaned = []
    with pytest.raises(Terminated), sigterm_raises():
        try:
            deliver_sigterm()
        finally:
            cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_an_ignored_or_handled_sigterm_is_left_as_it_was(sigterm_default):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with sigterm_raises():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing happens
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    with sigterm_raises():
        os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM]


def test_a_command_stopped_by_sigterm_says_so_in_one_line_and_exits_143(sigterm_default):
    @click.command()
    @handle_errors
    def slow():
        deliver_sigterm()

    result = CliRunner().invoke(slow, [])
    assert result.exit_code == 143
    assert result.output.strip() == "edgebatch: terminated (SIGTERM); nothing was written"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
