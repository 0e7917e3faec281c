"""Whether the supervisor restarts a training child that ended, and what it reports: pure, no I/O.

The supervisor (supervisor.py) runs training in a child process because the failures it exists
for cannot be caught inside that process: a cgroup limit SIGKILLs it, and oneDNN out of address
space crashes it with SIGSEGV or SIGABRT (docs/tensorflow-memory.md, "oneDNN convolutions can
crash" and "cgroup limits kill"). A crash like that is retried from the last checkpoint.
Anything else is the program's own answer and is passed through: exit 0 is success, a non-zero
exit is a Python exception or a deliberate `sys.exit`, and a death by SIGTERM, SIGINT or SIGHUP is
someone stopping the job, so restarting any of those would only repeat the failure or fight the
user.

Return codes follow `subprocess.Popen`: a negative code -N means the child died by signal N. A
wrapper shell (`sh -c ...`, a launcher script) reports its own child's death by signal N as exit
code 128 + N, so 128 + N for the crash signals counts as that death too.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass

__all__ = [
    "CRASH_SIGNALS",
    "ChildRun",
    "RestartDecision",
    "SupervisorReport",
    "death_signal_of",
    "restart_decision",
]

# Deaths that mean "the process crashed" (out of memory, or memory corruption), not "was stopped".
CRASH_SIGNALS = frozenset({signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS})

# The shell's convention for "killed by signal N": exit code 128 + N.
SHELL_SIGNAL_BASE = 128


@dataclass(frozen=True, kw_only=True)
class RestartDecision:
    """What to do after a child ended: `restart` it, or stop and exit with `exit_code`, and why."""

    restart: bool
    exit_code: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    """One child process, from start to end.

    `returncode` is Popen's (negative: killed by that signal); `signal_name` names the signal when
    it died by one (directly or as reported by a wrapper shell); `running_micro_batch` is the
    micro-batch `fit` had last recorded as running when the child died (None when unknown or when
    it exited normally); `seconds` is its wall time; `restarted` says whether another child followed.
    """

    attempt: int
    returncode: int
    signal_name: str | None
    running_micro_batch: int | None
    seconds: float
    restarted: bool


@dataclass(frozen=True, kw_only=True)
class SupervisorReport:
    """The whole supervised run: every child, the restarts, the exit code and why it stopped."""

    command: tuple[str, ...]
    exit_code: int
    restarts: int
    max_restarts: int
    reason: str
    runs: tuple[ChildRun, ...]

    @property
    def signals(self) -> tuple[str, ...]:
        """The signals the children died by, in order."""
        return tuple(run.signal_name for run in self.runs if run.signal_name is not None)

    def to_dict(self) -> dict:
        return {**asdict(self), "command": list(self.command), "signals": list(self.signals)}

    def summary(self) -> str:
        """The final report, a few lines of text."""
        lines = [
            f"edgebatch supervise: {self.reason}",
            f"  exit code {self.exit_code}; {self.restarts} restart(s) of at most {self.max_restarts}; "
            f"signals: {', '.join(self.signals) or 'none'}",
        ]
        for run in self.runs:
            died = f"died by {run.signal_name}" if run.signal_name else f"exited with {run.returncode}"
            running = f", micro-batch {run.running_micro_batch} running" if run.running_micro_batch is not None else ""
            then = ", restarted" if run.restarted else ""
            lines.append(f"  child {run.attempt}: {died} after {run.seconds:.1f} s{running}{then}")
        return "\n".join(lines)


def death_signal_of(returncode: int) -> signal.Signals | None:
    """The signal a return code reports a death by (Popen's -N, or a shell's 128 + N for a crash
    signal), or None for a normal exit. Only crash signals are read from 128 + N: a program may
    exit with 130 on purpose, but 137 (SIGKILL) is not an exit status a program chooses."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode)
        except ValueError:  # a real-time signal has no name in the enum
            return None
    return next((crash for crash in CRASH_SIGNALS if crash == returncode - SHELL_SIGNAL_BASE), None)


def restart_decision(
    *, returncode: int, restarts_done: int, max_restarts: int, stop_requested: bool
) -> RestartDecision:
    """Restart the child, or stop with which exit code.

    Args:
        returncode: the child's Popen return code (negative: killed by that signal).
        restarts_done: restarts already made in this supervised run.
        max_restarts: the most restarts allowed.
        stop_requested: the supervisor forwarded SIGINT/SIGTERM/SIGHUP to the child (someone is stopping it).

    Returns:
        A RestartDecision; `exit_code` is the child's own on a normal exit, 128 + N after a death by
        signal N (the shell's convention).
    """
    died_by = death_signal_of(returncode)
    if returncode < 0 and died_by is None:  # an unnamed signal: still a death, not an exit status
        reason = f"the child died by signal {-returncode}, which is not a crash edgebatch restarts"
        return RestartDecision(restart=False, exit_code=SHELL_SIGNAL_BASE - returncode, reason=reason)
    if returncode == 0:
        return RestartDecision(restart=False, exit_code=0, reason="the child finished (exit code 0)")
    if died_by is None:
        reason = f"the child exited with code {returncode} (an error in the program, not restarted)"
        return RestartDecision(restart=False, exit_code=returncode, reason=reason)
    exit_code = SHELL_SIGNAL_BASE + int(died_by)
    if stop_requested:
        reason = f"the child died by {died_by.name} after it was asked to stop (not restarted)"
        return RestartDecision(restart=False, exit_code=exit_code, reason=reason)
    if died_by not in CRASH_SIGNALS:
        reason = f"the child was stopped by {died_by.name}, which is not a crash edgebatch restarts"
        return RestartDecision(restart=False, exit_code=exit_code, reason=reason)
    if restarts_done >= max_restarts:
        return RestartDecision(restart=False, exit_code=exit_code,
                               reason=f"the child died by {died_by.name} and all {max_restarts} restart(s) are spent")
    return RestartDecision(restart=True, exit_code=exit_code,
                           reason=f"the child died by {died_by.name}: restart {restarts_done + 1} of {max_restarts}")
