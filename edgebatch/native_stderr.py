"""Hold back what native code (TensorFlow's C++ runtime) writes to file descriptor 2.

`import tensorflow` on a CPU-only host prints a dozen lines to stderr before Python sees
anything (absl's "log messages before InitializeLog", oneDNN's round-off notice, "Could not find
cuda drivers", and an `E0000 ... failed call to cuInit` that reads like a fault and is not).
TF_CPP_MIN_LOG_LEVEL does not silence the ones written before absl starts, and the level that
would silence the cuInit line (3) silences real errors too. So `edgebatch devices` sends fd 2 to a
temporary file while it asks TensorFlow about devices, and shows it only where it is wanted:
on --verbose, where TensorFlow sees fewer GPUs than NVML (the log then says why), or where the
block raised.

Only the process's own fd 2 is redirected, for the length of the block: the CLI's own messages
come after it. Child processes started inside the block would inherit the redirect; none are.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["held_native_stderr"]


@contextmanager
def held_native_stderr() -> Iterator[Callable[[], str]]:
    """Redirect fd 2 to a temporary file for the block; yield a function that returns what was written.

    If the block raises, what was held is written to the real stderr before the error goes on, so
    a failed import still shows TensorFlow's reasons.
    """
    sys.stderr.flush()
    saved_fd = os.dup(2)
    held = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finally, read after the block
    text = ""

    def read() -> str:
        return text

    try:
        os.dup2(held.fileno(), 2)
        try:
            yield read
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            held.seek(0)
            text = held.read().decode("utf-8", errors="replace")
    except BaseException:
        if text:
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
            sys.stderr.flush()
        raise
    finally:
        os.close(saved_fd)
        held.close()
