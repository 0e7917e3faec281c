"""Kill a child process and reap it, even where an interrupt broke subprocess.Popen's own lock.

`Popen.poll()` takes a private lock (`_waitpid_lock`) with `acquire(False)` and only then enters
the `try` whose `finally` releases it. A KeyboardInterrupt, or the Terminated that SIGTERM raises
under `edgebatch` (cli_errors.sigterm_raises), can land between those two bytecodes: Python runs a
signal handler between any two of them. The lock then stays held for good. From then on `poll()`
answers None ("something else is waiting on it") for a process that may have exited, and
`wait()` without a timeout blocks on the lock for ever, in a program with no other thread to
release it.

A probe meets that window more often than chance would have it. It polls its worker right after
printing a trial's line (Worker.can_run), and a user, or a test, sends Ctrl-C or SIGTERM when it
sees a line. tests/test_probe_models.py's Ctrl-C/SIGTERM test, which signals on the first trial's
line, hung in 2 of 19 runs of that module on an AMD EPYC host (2026-12-06), and once in six suite
runs before. The second hang's faulthandler dump showed the stopping probe in Worker.close, at
`with self._waitpid_lock` inside `Popen.wait()`, after its SIGKILL to the scout.

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
