"""`supervise`: run training in a child process and restart it when it is killed.

A child killed by SIGKILL, SIGABRT, SIGSEGV or SIGBUS is started again (at most `max_restarts`
times) and `edgebatch.fit(..., checkpoint_dir=...)` resumes from the last checkpoint, its governor
told the micro-batch that was running (hard_failure.py); any other end is final. The decision
itself is pure, in restart_policy.py; `supervise` gives the recipe. Every update since the last
checkpoint is re-run after a kill; none is lost or counted twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping, Sequence

from edgebatch.errors import UsageError
from edgebatch.training.hard_failure import (
    ENV_HARD_FAILURE_MICRO_BATCH,
    clear_running_marker,
    read_running_micro_batch,
)
from edgebatch.training.restart_policy import ChildRun, SupervisorReport, death_signal_of, restart_decision

__all__ = ["DEFAULT_MAX_RESTARTS", "ENV_RESTART", "supervise"]

DEFAULT_MAX_RESTARTS = 3
# Tells the child which start it is (0 for the first), for its logs.
ENV_RESTART = "EDGEBATCH_SUPERVISOR_RESTART"
# SIGHUP too: the child has its own session, so a closed terminal reaches it only through here.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def supervise(
    argv: Sequence[str],
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = _print_to_stderr,
) -> SupervisorReport:
    """Run `argv` (e.g. `["python", "train.py"]`) as a child; restart it when a crash signal kills it.

    1. Delete the running-micro-batch record in `checkpoint_dir` (hard_failure.py).
    2. Start the command as a child in its own session (process group), with
       `EDGEBATCH_HARD_FAILURE_MICRO_BATCH` set to the size the previous child was running when it
       died (not set for the first child).
    3. Wait; SIGINT/SIGTERM/SIGHUP to the supervisor go to the child, which is then not restarted.
    4. A death by SIGKILL, SIGABRT, SIGSEGV or SIGBUS is restarted (at most `max_restarts` times):
       the command runs again and `edgebatch.fit(..., checkpointing=Checkpointing(dir=...))` resumes from the last
       checkpoint, its governor told the size that was running; any other end is final.

    After a kill, the updates since the last checkpoint run again; none before it does. The child
    has its own session, so a terminal's Ctrl-C reaches it once, through the supervisor; a
    supervisor that is itself SIGKILLed leaves it running (docs/training-design.md, "Supervisor").

    Args:
        argv: the command and its arguments (no shell).
        checkpoint_dir: the checkpoint folder the command gives `edgebatch.fit`: where the
            supervisor reads which micro-batch was running when the child died. Without it
            restarts still resume from the checkpoint, but the governor is not told the size.
        max_restarts: the most restarts (>= 0).
        env: the child's environment (default: this process's).
        progress: called with a line when a child ends and with the final summary; None is quiet.

    Returns:
        A SupervisorReport; its `exit_code` is the last child's (128 + N after a death by signal N).

    Raises:
        UsageError: an empty command, a bad `max_restarts`, or a program that cannot be started.

    Example (runs in tests/test_docstring_examples.py):
        >>> import sys
        >>> from edgebatch import supervise
        >>> supervise([sys.executable, "-c", "pass"], progress=None).exit_code
        0
    """
    command = _check_command(argv)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise UsageError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    say = progress or (lambda line: None)
    runs: list[ChildRun] = []
    running_micro_batch: int | None = None
    with _SignalForwarder() as forwarder:
        while True:
            if checkpoint_dir is not None:
                clear_running_marker(checkpoint_dir)
            child_env = _child_env(env, restart=len(runs), hard_failure_micro_batch=running_micro_batch)
            started = time.monotonic()
            try:
                child = subprocess.Popen(command, env=child_env, start_new_session=True)
            except OSError as exc:
                raise UsageError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
            returncode = forwarder.wait(child)
            seconds = time.monotonic() - started
            died_by = death_signal_of(returncode)
            running_micro_batch = (
                read_running_micro_batch(checkpoint_dir) if died_by is not None and checkpoint_dir is not None else None
            )
            decision = restart_decision(returncode=returncode, restarts_done=len(runs),
                                        max_restarts=max_restarts, stop_requested=forwarder.stop_requested)
            runs.append(ChildRun(attempt=len(runs) + 1, returncode=returncode,
                                 signal_name=died_by.name if died_by is not None else None,
                                 running_micro_batch=running_micro_batch, seconds=seconds,
                                 restarted=decision.restart))
            if not decision.restart:
                break
            say(f"edgebatch supervise: {decision.reason}" + (
                f"; the governor will be told micro-batch {running_micro_batch} failed" if running_micro_batch else ""))
    report = SupervisorReport(command=tuple(command), exit_code=decision.exit_code, restarts=len(runs) - 1,
                              max_restarts=max_restarts, reason=decision.reason, runs=tuple(runs))
    say(report.summary())
    return report


def _check_command(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise UsageError(f"the command must be a list of arguments like ['python', 'train.py'], got {argv!r}")
    command = [os.fspath(part) for part in argv]
    if not command or not command[0]:
        raise UsageError(f"the command to supervise is empty, got {argv!r}: pass it after `--` (-- python train.py)")
    return command


def _child_env(env: Mapping[str, str] | None, *, restart: int, hard_failure_micro_batch: int | None) -> dict[str, str]:
    child_env = dict(os.environ if env is None else env)
    # An inherited value is some earlier run's: only the size this supervisor read may be passed on.
    child_env.pop(ENV_HARD_FAILURE_MICRO_BATCH, None)
    if hard_failure_micro_batch is not None:
        child_env[ENV_HARD_FAILURE_MICRO_BATCH] = str(hard_failure_micro_batch)
    child_env[ENV_RESTART] = str(restart)
    return child_env


class _SignalForwarder:
    """While active, SIGINT/SIGTERM/SIGHUP to this process are sent on to the running child.

    Handlers can only be installed from the main thread; elsewhere the child is still supervised
    but nothing is forwarded.
    """

    def __init__(self) -> None:
        self.stop_requested = False
        self._child: subprocess.Popen | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "_SignalForwarder":
        if threading.current_thread() is threading.main_thread():
            for signum in FORWARDED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._forward)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._child is not None and self._child.poll() is None:  # an error left it running
            self._child.kill()
            self._child.wait()

    def _forward(self, signum: int, frame) -> None:
        self.stop_requested = True
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def wait(self, child: subprocess.Popen) -> int:
        self._child = child
        if self.stop_requested:  # the signal came while the child was starting
            child.send_signal(signal.SIGTERM)
        returncode = child.wait()
        self._child = None
        return returncode
