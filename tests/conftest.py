"""Shared test setup: keep Keras's home out of the user's, quiet TensorFlow's C++ logs; the
`terminal_signals` fixture for tests that stop a child with a signal."""

import os
import signal
import tempfile

import pytest

# Keras writes ~/.keras/keras.json on first import (docs/tensorflow-memory.md#installing):
# point it at a throwaway folder before any test imports keras or tensorflow.
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="edgebatch-keras-home-"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _stop_signals_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT's and SIGTERM's defaults, as a command run from a terminal has them.

    A job a non-interactive shell starts in the background (`pytest ... &`) inherits SIGINT
    ignored; Python then installs no KeyboardInterrupt handler, and the child, like any program,
    rightly ignores the signal: a test that sends it then waits 60 s for an exit that cannot come
    (CI's run at 3fb105c; a fresh-clone run of tests/test_fleet_probe.py started with `&`). `edgebatch`
    likewise leaves an ignored SIGTERM ignored (cli/errors.sigterm_raises).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def terminal_signals():
    """A `preexec_fn` for subprocess.Popen: the child gets SIGINT's and SIGTERM's defaults."""
    return _stop_signals_as_at_a_terminal
