"""Probe trials run in worker processes; this module is both sides of that.

Why workers (FACTS.md): on CPU a process's resident memory never shrinks after TensorFlow grew it,
a real OOM can segfault the process (oneDNN convolutions) or get it SIGKILLed (cgroup limit), and
memory held after a failed trial makes every later trial near the boundary fail. So:

- a worker's readings stay right only while its batches grow: `Worker.can_run(batch)` is True for a
  batch above every batch it ran, and never after an OOM. The probe keeps one "scout" worker for
  the growing phase and starts a fresh worker whenever the search steps back down. Memory
  retained from earlier trials still lifts a scout's readings a little (conservative: on
  small_cnn the answer was 338 against a fresh-process truth of 342; on dense_wide 290 against
  332, see BENCHMARKS.md);
- a fresh worker first runs a few cheap steps at the start batch (`prewarm`), so that the resident
  peak has climbed as it does over the first steps of real training (FACTS.md: it climbs for 5-11
  steps) before the trial batch is measured; an address-space cap (`address_space_headroom_bytes`)
  is set after the prewarm, over the worker's size then;
- a worker that dies (segfault, SIGKILL) is an OOM outcome, and the probe goes on.

The protocol: the parent writes one JSON line of setup, then one JSON line per trial; the worker
answers each with one line prefixed by `@@edgebatch ` (TensorFlow and user code may print too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from edgebatch.errors import ProbeError, UsageError

PREFIX = "@@edgebatch "


@dataclass(frozen=True)
class WorkerSetup:
    model_spec: str
    precision: str = "float32"
    optimizer: str = "adam"
    device: str = "CPU:0"
    steps_per_trial: int = 3
    trial_seconds: float = 10.0
    prewarm_batch: int | None = None
    prewarm_steps: int = 0
    # Cap the worker's address space at (its size after setup + this many bytes), so that an
    # over-budget allocation fails as a clean ResourceExhaustedError (FACTS.md: RLIMIT_AS).
    address_space_headroom_bytes: int | None = None


@dataclass
class Worker:
    """Parent-side handle of one worker process."""

    setup: WorkerSetup
    process: subprocess.Popen
    stderr_file: object
    facts: dict = field(default_factory=dict)
    largest_batch: int = 0
    healthy: bool = True
    trials_run: int = 0

    def can_run(self, batch: int) -> bool:
        """Whether this worker's reading at `batch` would be right (see the module docstring)."""
        return self.healthy and self.process.poll() is None and batch > self.largest_batch

    def run_trial(self, batch: int) -> dict:
        self.largest_batch = max(self.largest_batch, batch)
        self.trials_run += 1
        reply = self._request({"batch": batch})
        if reply is None:
            self.healthy = False
            return {"batch": batch, "ok": False, "error": "worker_killed", "detail": self._death_reason()}
        if not reply.get("ok"):
            self.healthy = False  # memory held after an OOM would distort every later reading
        return reply

    def _request(self, message: dict) -> dict | None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return read_reply(self.process, self._stderr_tail)

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

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr_file.close()


def read_reply(process: subprocess.Popen, stderr_tail) -> dict | None:
    """The next protocol line from the worker; None when it died; ProbeError/UsageError on a fatal error."""
    for line in process.stdout:
        if not line.startswith(PREFIX):
            continue
        reply = json.loads(line[len(PREFIX) :])
        if "fatal" in reply:
            error_class = UsageError if reply.get("usage") else ProbeError
            raise error_class(reply["fatal"])
        return reply
    return None


def start_worker(setup: WorkerSetup) -> Worker:
    """Start a worker, send the setup, wait until the model is built and the step traced."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if setup.device.upper().startswith("CPU"):
        # A CPU probe must not touch (or reserve memory on) a GPU that happens to be present.
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    stderr_file = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "edgebatch.probe.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
        env=env,
        start_new_session=True,  # Ctrl-C reaches the parent only; the parent stops the workers
    )
    worker = Worker(setup, process, stderr_file)
    try:
        process.stdin.write(json.dumps(setup.__dict__) + "\n")
        process.stdin.flush()
        ready = read_reply(process, worker._stderr_tail)
    except BaseException:
        worker.close() if process.poll() is not None else _kill(process)
        raise
    if ready is None:
        reason = worker._death_reason()
        tail = worker._stderr_tail()
        stderr_file.close()
        raise ProbeError(f"probe worker failed to start ({reason}): {tail or 'no output'}")
    worker.facts = ready
    worker.largest_batch = setup.prewarm_batch or 0
    return worker


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


# ---- the worker side -------------------------------------------------------------------------


def _send(message: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def _cap_address_space(headroom_bytes: int) -> None:
    import resource

    from edgebatch.sensors import process_virtual_bytes

    limit = process_virtual_bytes() + headroom_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


def _volunteer_for_the_oom_killer() -> None:
    """If a trial exhausts host RAM, the kernel should kill this worker, not another process.

    The search refuses trials the memory model puts over budget, but the budget is what was free at
    the start; other processes can take memory meanwhile. A killed worker is just a failed trial.
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def worker_main() -> int:
    setup = WorkerSetup(**json.loads(sys.stdin.readline()))
    _volunteer_for_the_oom_killer()
    try:
        import tensorflow as tf

        from edgebatch.probe.trial import TrialRunner
        from edgebatch.sensors import enable_memory_growth
        from edgebatch.zoo import build_model, parse_model_spec

        if setup.device.upper().startswith("GPU"):
            enable_memory_growth()
        with tf.device(setup.device):
            model = build_model(parse_model_spec(setup.model_spec), setup.precision)
        runner = TrialRunner(model, optimizer=setup.optimizer, device=setup.device)
        # Trace now, at batch 1, so that no trial pays for tracing (the signature has batch None).
        runner.run_steps(1, 1)
        if setup.prewarm_batch:
            runner.run_steps(setup.prewarm_batch, setup.prewarm_steps)
        # The cap comes after the prewarm. Capped first, the prewarm's small steps left address
        # space that later big batches could not use: dense_wide under a 300 MiB cap aborted with
        # std::bad_alloc at batch 110 in 3 runs of 6, at 66-122 in probes, while a fresh process
        # (tests/support/fresh_step.py, no prewarm) ran 128 every time. Capped after it, 128 ran
        # 4 of 4 and 129, 130 and 132 failed 10 of 10, the fresh process's edge. Recount with
        # `python tools/capped_edge.py tests/models/dense_wide.py:build --batches 110,128,129`.
        if setup.address_space_headroom_bytes:
            _cap_address_space(setup.address_space_headroom_bytes)
        from edgebatch.sensors import process_rss_bytes, read_allocator

        allocator = read_allocator(setup.device)
        _send(
            {
                "ready": True,
                "tensorflow": tf.__version__,
                # Memory before any trial batch: what one-shot estimators (tools/bench) start from.
                "baseline_process_bytes": process_rss_bytes(),
                "baseline_allocator_bytes": allocator.current_bytes if allocator else None,
                **runner.model_facts(),
            }
        )
    except UsageError as error:
        _send({"fatal": str(error), "usage": True})
        return 2
    except Exception as error:  # noqa: BLE001 - reported to the parent as one line
        _send({"fatal": f"could not build the model for {setup.model_spec!r}: {type(error).__name__}: {error}"})
        return 1
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = runner.run_trial(request["batch"], setup.steps_per_trial, setup.trial_seconds)
        except Exception as error:  # noqa: BLE001 - a non-memory failure stops the probe
            _send({"fatal": f"training step failed at batch {request['batch']}: {type(error).__name__}: {error}"})
            return 1
        result["trace_count"] = runner.trace_count
        _send(result)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
