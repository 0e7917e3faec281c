"""Kill a child process and reap it, even where an interrupt broke subprocess.Popen's own lock.

`Popen.poll()` takes a private lock (`_waitpid_lock`) with `acquire(False)` and only then enters
the `try` whose `finally` releases it. A KeyboardInterrupt, or the Terminated that SIGTERM raises
under `edgebatch` (cli.errors.sigterm_raises), can land between those two bytecodes, and the lock
then stays held for good: `poll()` answers None for a process that may have exited, and `wait()`
without a timeout blocks for ever. A probe meets that window more often than chance would have it:
it polls its worker right after printing a trial's line, when a user or a test sends Ctrl-C
(docs/probe-rules.md, "reaping.kill_and_reap").

`kill_and_reap` does what `kill(); wait()` do, with os.kill and os.waitpid, and never touches the
lock.
"""

from __future__ import annotations

import os
import signal
import subprocess


def kill_and_reap(process: subprocess.Popen) -> int:
    """SIGKILL `process` unless it is known to have ended, wait for it, and return its return code.

    Without Popen's lock (module docstring). A child whose code Popen stored is not signalled, and
    an unreaped child's pid cannot go to another process. One gap is left: an interrupt after
    Popen's own waitpid reaped the child and before Popen stored its code. Then the pid is free, the
    SIGKILL finds no process (or, were the pid reused in that moment, another one), os.waitpid finds
    no child, and this returns -SIGKILL.
    """
    if process.returncode is not None:
        return process.returncode
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # a zombie still takes the signal, so this means someone reaped it
    try:
        _, status = os.waitpid(process.pid, 0)
    except ChildProcessError:
        process.returncode = -signal.SIGKILL
    else:
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode
