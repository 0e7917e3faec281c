"""Probe trials run in worker processes; this module is the parent side (worker_child.py the other).

On CPU a process's resident memory never shrinks after TensorFlow grew it, a real OOM can
segfault the process (oneDNN convolutions) or get it SIGKILLed (cgroup limit), and memory held
after a failed trial makes every later trial near the boundary fail (docs/tensorflow-memory.md).
So each trial runs in a worker process; `Worker` says when a worker's reading is right, when it
prewarms, and what a worker that dies, hangs or garbles its reply means.

The protocol: the parent writes one JSON line of setup, then one JSON line per trial; the worker
answers each with one line prefixed by `@@edgebatch ` (TensorFlow and user code may print too).
To the setup it answers twice: `identity` once the model is built (what a cached profile's key needs,
await_identity), `ready` once the step is traced and any prewarm ran (await_ready).
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from edgebatch.errors import ProbeError, UsageError
from edgebatch.probing.reaping import kill_and_reap
from edgebatch.probing.trial import swap_grew

# The worker side's names, which other modules import from here too.
from edgebatch.probing.worker_child import (  # noqa: F401
    BASELINE_FIELDS, DEFAULT_INTER_OP_THREADS, DEFAULT_STEPS_PER_TRIAL, DEFAULT_TRIAL_SECONDS,
    MEASURE_FIELDS, PARENT_PID_ENV, PREFIX, measure_of, run_and_exit, worker_main,
)

# How long the parent waits for a worker's "ready": a TensorFlow import, the model build, the
# trace and the prewarm take 10-30 s on the 2-core build machines (8-20 s of it the import); a
# small ARM board can take minutes. Generous on purpose: this catches a hang, not a slow start.
STARTUP_DEADLINE_SECONDS = 600.0
# How long the parent waits for one trial's reply (see trial_deadline_seconds).
TRIAL_DEADLINE_FLOOR_SECONDS = 120.0
TRIAL_DEADLINE_PER_TRIAL_SECONDS = 20
TRIAL_DEADLINE_PER_STEP = 10

# How long Worker.close waits for a worker to exit by itself once its input is closed: an idle one
# exits at once; one in the middle of a trial finishes it first.
CLOSE_WAIT_SECONDS = 5.0


def trial_deadline_seconds(trial_seconds: float, expected_step_seconds: float | None = None) -> float:
    """How long a trial may go without a reply before the parent takes its worker for hung.

    A trial runs a warm-up step, then steps until `trial_seconds` have passed (the last one may run
    over), so it lasts about trial_seconds + 2 steps. The deadline is at least 120 s and 20 x
    trial_seconds, and 10 steps more than trial_seconds when the step time can be foreseen
    (from the worker's earlier steps): a slow device gets the time its steps need, a hang does not
    hold the probe for ever.
    """
    deadline = max(TRIAL_DEADLINE_FLOOR_SECONDS, TRIAL_DEADLINE_PER_TRIAL_SECONDS * trial_seconds)
    if expected_step_seconds is not None and expected_step_seconds > 0:
        deadline = max(deadline, trial_seconds + TRIAL_DEADLINE_PER_STEP * expected_step_seconds)
    return deadline


@dataclass(frozen=True, kw_only=True)
class WorkerSetup:
    model_spec: str
    precision: str = "float32"
    optimizer: str = "adam"
    # "qat" or "prune": wrap the model with TFMOT (zoo.optimize_model); only then does the worker
    # import tensorflow_model_optimization.
    optimize: str = "none"
    device: str = "CPU:0"
    steps_per_trial: int = DEFAULT_STEPS_PER_TRIAL
    trial_seconds: float = DEFAULT_TRIAL_SECONDS
    prewarm_batch: int | None = None
    prewarm_steps: int = 0
    # Tokens per example for a model with a variable sequence axis (a probe per length); None otherwise.
    sequence_length: int | None = None
    # tf.config.threading's inter-op parallelism, set before the model is built (0: TensorFlow's pool).
    inter_op_threads: int = DEFAULT_INTER_OP_THREADS
    # Cap the worker's address space at (its size after setup + this many bytes), so that an
    # over-budget allocation fails as a clean ResourceExhaustedError
    # (docs/tensorflow-memory.md#address-space-caps).
    address_space_headroom_bytes: int | None = None
    # Reply deadlines (parent side): the start-up's, and a trial's (None: trial_deadline_seconds).
    startup_deadline_seconds: float = STARTUP_DEADLINE_SECONDS
    trial_deadline_seconds: float | None = None


class _ReplyTimeout(Exception):
    """No protocol line came before the deadline."""


class _LineReader:
    """Lines from the worker's stdout, read straight from the pipe so that a deadline can apply.

    (Iterating `process.stdout` blocks without limit; waiting on its descriptor would miss lines
    already sitting in the file object's buffer, so this keeps its own.) poll(), not select():
    select() fails on descriptors above 1023, which a long-lived program that probes can reach.
    """

    def __init__(self, stream):
        self.fd = stream.fileno()
        self.buffer = b""
        self.at_end = False
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def next_line(self, deadline_monotonic: float) -> bytes | None:
        """The next line (with its newline, or the unterminated rest at the end); None at the end."""
        while True:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                line, self.buffer = self.buffer[: newline + 1], self.buffer[newline + 1 :]
                return line
            if self.at_end:
                line, self.buffer = self.buffer, b""
                return line or None
            # Past the deadline, what the pipe already holds is still read (a worker started ahead
            # may have said it was ready long before it is asked): poll(0) looks without waiting.
            remaining = deadline_monotonic - time.monotonic()
            if not self.poller.poll(max(0, math.ceil(remaining * 1000))):
                raise _ReplyTimeout()
            chunk = os.read(self.fd, 65536)
            if chunk:
                self.buffer += chunk
            else:
                self.at_end = True


@dataclass
class Worker:
    """Parent-side handle of one worker process.

    - Its readings stay right only while its batches grow: `can_run(batch)` is True for a batch
      above every batch it ran, and never after an OOM. The probe keeps one "scout" worker for the
      growing phase and starts a fresh worker whenever the search steps back down. Memory retained
      from earlier trials still lifts a scout's readings a little, on the safe side (small_cnn's
      answer 338 against a fresh-process truth of 342; dense_wide's 290 against 332: BENCHMARKS.md).
    - A fresh worker may first run a few cheap steps at a small batch (`prewarm`;
      fresh_workers.prewarm_of says when): fork-server children and workers under TensorFlow's inter-op pool do, whose
      resident peak climbs for 5-11 steps otherwise
      (docs/tensorflow-memory.md#peak-climbs-over-the-first-steps); new processes with one
      inter-op thread and capped workers do not, as training does not. An address-space cap
      (`address_space_headroom_bytes`) is set after any prewarm, over the worker's size then.
    - A worker that dies (segfault, SIGKILL) is an OOM outcome, and the probe goes on.
    - A worker that does not answer in time (`trial_deadline_seconds`, `STARTUP_DEADLINE_SECONDS`)
      is killed. If its swap grew meanwhile the trial failed ("swapped": thrashing is how a batch
      too big for RAM can look); otherwise the probe stops with a ProbeError: a hang says nothing
      about memory, and counted as a failure it would pull the answer below batches that fit.
    - A worker dies with the probe (worker_child._die_with_parent), and a garbled reply is a ProbeError.
    """

    setup: WorkerSetup
    process: subprocess.Popen
    stderr_file: object
    facts: dict = field(default_factory=dict)
    largest_batch: int = 0
    healthy: bool = True
    trials_run: int = 0
    # Step seconds per sample at the largest batch seen (prewarm or trial): foresees the next
    # trial's step time for its deadline. Small batches overstate it, which only lengthens it.
    step_seconds_per_sample: float | None = None
    reader: _LineReader | None = None
    # Forked from the fork server (forkserver.py) rather than started as a new Python: on some
    # hosts such children read above new processes (outcomes.peak_spread_fraction).
    forked: bool = False
    # What the worker said the model is once it was built (await_identity); None until then.
    identity: dict | None = None
    # Spawned ahead of need as a spare (spares.py), not when its trial was asked for.
    started_ahead: bool = False
    # When it was started (time.monotonic()): its start-up deadline counts from here.
    started_monotonic: float = field(default_factory=time.monotonic)
    # (batch, swap bytes before, reply deadline on time.monotonic(), request sent) between
    # begin_trial and finish_trial.
    _pending: tuple | None = None

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = _LineReader(self.process.stdout)

    def can_run(self, batch: int) -> bool:
        """Whether this worker's reading at `batch` would be right (see the class docstring)."""
        return self.healthy and self.process.poll() is None and batch > self.largest_batch

    def run_trial(self, batch: int) -> dict:
        """One trial's reply; a failed trial when the worker died; ProbeError when it hung or garbled."""
        self.begin_trial(batch)
        return self.finish_trial()

    def begin_trial(self, batch: int) -> None:
        """Ask for a trial at `batch` and return at once; finish_trial() waits for its reply. Several
        workers can so run their trials side by side from one thread (fresh_workers.repeats_side_by_side)."""
        self.largest_batch = max(self.largest_batch, batch)
        self.trials_run += 1
        swap_before = _process_swap_bytes(self.process.pid)
        deadline = time.monotonic() + self.trial_deadline(batch)
        try:
            self.process.stdin.write((json.dumps({"batch": batch}) + "\n").encode())
            self.process.stdin.flush()
            sent = True
        except (BrokenPipeError, OSError):
            sent = False  # it died: finish_trial says how
        self._pending = (batch, swap_before, deadline, sent)

    def finish_trial(self) -> dict:
        """The reply to the trial begin_trial() asked for (see run_trial)."""
        batch, swap_before, deadline, sent = self._pending
        self._pending = None
        try:
            reply = read_reply(self.reader, deadline) if sent else None
        except _ReplyTimeout:
            self.healthy = False
            return self._hung_trial(batch, swap_before)
        if reply is None:
            self.healthy = False
            return {"batch": batch, "ok": False, "error": "worker_killed", "detail": self._death_reason()}
        if not reply.get("ok"):
            self.healthy = False  # memory held after an OOM would distort every later reading
        elif reply.get("step_seconds"):
            self.step_seconds_per_sample = reply["step_seconds"] / batch
        return reply

    def trial_deadline(self, batch: int) -> float:
        if self.setup.trial_deadline_seconds is not None:
            return self.setup.trial_deadline_seconds
        expected = None if self.step_seconds_per_sample is None else self.step_seconds_per_sample * batch
        return trial_deadline_seconds(self.setup.trial_seconds, expected)

    def _hung_trial(self, batch: int, swap_before: int | None) -> dict:
        """A trial that outran its deadline: a failed trial if it was swapping, else a ProbeError.

        A batch too big for RAM can thrash in swap for ever, and that is an answer ("does not
        fit"). Anything else that hangs (a deadlock, a stuck device) says nothing about memory:
        recorded as a failure it would put the ceiling below a batch that fits, so it stops the probe.
        """
        deadline = self.trial_deadline(batch)
        swap_after = _process_swap_bytes(self.process.pid)
        _kill(self.process)
        if swap_grew(swap_before, swap_after):
            return {
                "batch": batch,
                "ok": False,
                "error": "swapped",
                "detail": f"no reply within {deadline:.0f} s while its swap grew from {swap_before} to {swap_after} bytes",
            }
        tail = self._stderr_tail()
        why = "hung, not out of memory: its swap did not grow" if swap_after is not None else "hung"
        raise ProbeError(
            f"probe worker gave no reply within {deadline:.0f} s at batch {batch} and was stopped "
            f"({why}){': ' + tail if tail else ''}"
        )

    def _stderr_tail(self) -> str:
        self.stderr_file.flush()
        self.stderr_file.seek(0)
        lines = [line.strip() for line in self.stderr_file.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def _death_reason(self) -> str:
        code = self.process.wait()
        if code < 0:
            return f"worker killed by signal {signal.Signals(-code).name}"
        return f"worker exited with code {code}"

    def close(self, *, at_once: bool = False) -> None:
        """End the worker: it exits by itself when its input closes (within CLOSE_WAIT_SECONDS, or
        it is killed); `at_once` kills it without waiting, for a probe that is stopping on an
        error or an interrupt (a worker in the middle of a trial would finish it first)."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
            try:
                if not at_once:
                    self.process.wait(timeout=CLOSE_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if self.process.poll() is None:
                _kill(self.process)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.stderr_file.close()


def _process_swap_bytes(pid: int) -> int | None:
    from edgebatch.sensors import process_swap_bytes

    return process_swap_bytes(pid=pid)


def parse_reply(line: bytes) -> dict | None:
    """A worker's output line as a protocol message: None for other output (TensorFlow's, the user's).

    A protocol line that is cut short or garbled is a ProbeError with one line of explanation.
    """
    text = line.decode("utf-8", "replace")
    if not text.startswith(PREFIX):
        return None
    body = text[len(PREFIX) :].rstrip("\n")
    try:
        reply = json.loads(body)
    except json.JSONDecodeError as error:
        shown = body if len(body) <= 120 else body[:120] + "..."
        raise ProbeError(f"probe worker sent an unreadable reply ({error.msg} at character {error.pos}): {shown!r}") from None
    if not isinstance(reply, dict):
        raise ProbeError(f"probe worker sent a reply that is not a JSON object: {body[:120]!r}")
    return reply


def read_reply(reader: _LineReader, deadline_monotonic: float) -> dict | None:
    """The next protocol message from the worker; None when it died.

    Raises ProbeError/UsageError on a fatal error it reports or a garbled reply, and _ReplyTimeout
    when no message came before `deadline_monotonic` (time.monotonic()).
    """
    while True:
        line = reader.next_line(deadline_monotonic)
        if line is None:
            return None
        reply = parse_reply(line)
        if reply is None:
            continue
        if "fatal" in reply:
            error_class = UsageError if reply.get("usage") else ProbeError
            raise error_class(reply["fatal"])
        return reply


def worker_environment(device: str) -> dict[str, str]:
    """The environment a worker (or the fork server its workers come from) starts with."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env[PARENT_PID_ENV] = str(os.getpid())
    if device.upper().startswith("CPU"):
        # A CPU probe must not touch (or reserve memory on) a GPU that happens to be present.
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    return env


def spawn_worker(setup: WorkerSetup, command: list[str] | None = None, server=None) -> Worker:
    """Start a worker process and send it the setup; do not wait for it (see start_worker).

    `command` runs the worker side (default: this module); tests pass a stand-in. With `server`
    (a forkserver.ForkServer) the worker is forked from it instead of started as a new Python.
    """
    env = worker_environment(setup.device)
    stderr_file = tempfile.TemporaryFile(mode="w+")
    if server is not None and command is None:
        process = server.spawn(env, stderr_file.fileno())  # in a session of its own, like the Popen below
    else:
        process = subprocess.Popen(
            command or [sys.executable, "-m", "edgebatch.probing.worker_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the parent only; the parent stops the workers
        )
    worker = Worker(setup, process, stderr_file, forked=server is not None and command is None)
    try:
        process.stdin.write((json.dumps(setup.__dict__) + "\n").encode())
        process.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # it died at once: start_worker reads its last words
    return worker


def start_worker(setup: WorkerSetup, command: list[str] | None = None, server=None) -> Worker:
    """Start a worker, send the setup, wait until the model is built and the step traced."""
    return await_ready(spawn_worker(setup, command, server))


def await_identity(worker: Worker) -> dict:
    """Wait until a spawned worker (spawn_worker) has built the model, and return what it says the
    model is (its name, architecture hash, inputs, TensorFlow version: what a profile's key needs),
    before the step is traced. await_ready afterwards waits for the rest. A worker that cannot
    build the model is closed and a ProbeError says why."""
    if worker.identity is None:
        _await_message(worker, "identity")
    return worker.identity


def await_ready(worker: Worker) -> Worker:
    """Wait until a spawned worker (spawn_worker) has built the model and traced the step; a worker
    that cannot is closed and a ProbeError says why."""
    setup = worker.setup
    ready = _await_message(worker, "ready")
    worker.facts = ready
    worker.largest_batch = setup.prewarm_batch or 0
    if ready.get("prewarm_step_seconds") and setup.prewarm_batch:
        worker.step_seconds_per_sample = ready["prewarm_step_seconds"] / setup.prewarm_batch
    return worker


def _await_message(worker: Worker, kind: str) -> dict:
    """The worker's next start-up message of `kind` ("identity" or "ready"); an identity message
    on the way is kept in worker.identity, and a ready message holds the identity too."""
    setup, process = worker.setup, worker.process
    deadline = worker.started_monotonic + setup.startup_deadline_seconds
    while True:
        try:
            message = read_reply(worker.reader, deadline)
        except _ReplyTimeout:
            _kill(process)
            tail = worker._stderr_tail()
            worker.close()
            raise ProbeError(
                f"probe worker was not ready within {setup.startup_deadline_seconds:.0f} s (building "
                f"{setup.model_spec!r}) and was stopped{': ' + tail if tail else ''}"
            ) from None
        except BaseException:
            if process.poll() is None:
                _kill(process)
            worker.close()
            raise
        if message is None:
            reason = worker._death_reason()
            tail = worker._stderr_tail()
            worker.close()
            raise ProbeError(f"probe worker failed to start ({reason}): {tail or 'no output'}")
        if message.get("identity") or message.get("ready"):
            worker.identity = worker.identity or {k: v for k, v in message.items() if k not in ("identity", "ready")}
        if message.get(kind):
            return message


def _kill(process) -> None:
    """SIGKILL `process` and reap it: a new process without Popen's own lock, which an interrupt can
    leave held (reaping.kill_and_reap); a fork server's child through its server."""
    if isinstance(process, subprocess.Popen):
        kill_and_reap(process)
    else:
        process.kill()
        process.wait()
