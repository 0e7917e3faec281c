"""The worker side of the probe's worker protocol; worker.py holds the parent side.

A worker reads one JSON line of setup (worker.WorkerSetup), builds the model and says what it is
(`identity`), traces the step and runs any prewarm (`ready`), then answers one JSON line per trial
until its input closes. Every protocol line it writes starts with PREFIX. worker_main runs those
steps and run_and_exit ends the process with its code, for `python -m edgebatch.probing.worker_main`
and a fork-server child (forkserver.py) alike. The measure names (measure_of, MEASURE_FIELDS,
BASELINE_FIELDS) and a trial's defaults live here too; worker.py re-exports what others import.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import statistics
import sys
from typing import TYPE_CHECKING, NoReturn

from edgebatch.errors import UsageError

if TYPE_CHECKING:
    from edgebatch.probing.worker import WorkerSetup

PREFIX = "@@edgebatch "

# A trial's defaults, owned by the side that runs trials; WorkerSetup and ProbeRequest (and through
# it the CLI) read them.
DEFAULT_STEPS_PER_TRIAL = 3
DEFAULT_TRIAL_SECONDS = 10.0
# TensorFlow inter-op threads in a worker (0: TensorFlow's own pool, one thread per core). With
# the pool the resident peak follows the worst overlap of ops seen so far and climbs at random
# steps, differently in every process; with one thread it is the same in every step and process,
# at the same step time (docs/tensorflow-memory.md, "Inter-op threads"; tests/support/op_schedule_check.py).
# A ceiling holds for training run with the same setting (edgebatch.set_inter_op_threads).
DEFAULT_INTER_OP_THREADS = 1

# The worker learns its parent's pid from here, to notice a parent that died before the worker
# could ask to die with it (see _die_with_parent).
PARENT_PID_ENV = "EDGEBATCH_PROBE_PARENT_PID"


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


# prctl(2) option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when the probe that started it dies; leave if it already has.

    The worker runs in its own session (Ctrl-C goes to the parent only), so a killed probe would
    otherwise leave it running a trial, holding gigabytes, until it next reads its stdin. SIGKILL,
    because a worker inside a TensorFlow kernel does not run Python signal handlers. Linux only
    (elsewhere the worker still ends at its next read of the closed stdin). The kernel sends the
    signal when the parent *thread* that started the worker ends, so the probe keeps its workers
    in the thread that runs it. The parent may have died before this call: then the parent pid
    differs from the one it passed down, and the worker leaves at once.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os._exit(1)


def _gpu_ordinal(device: str) -> int | None:
    kind, _, index = device.upper().partition(":")
    return int(index) if kind == "GPU" and index.isdigit() else None


def _gpu_details(tf, ordinal: int) -> dict:
    """TensorFlow's name and compute capability of GPU:ordinal: the device facts where NVML has none."""
    gpus = tf.config.list_physical_devices("GPU")
    if ordinal >= len(gpus):
        found = ", ".join(f"GPU:{i}" for i in range(len(gpus))) or "none"
        # tf.device() would quietly place the steps on the CPU (soft placement) and the probe would
        # measure the wrong device.
        raise UsageError(f"TensorFlow has no GPU:{ordinal} (GPUs it sees: {found}); use --device CPU:0")
    try:
        details = tf.config.experimental.get_device_details(gpus[ordinal])
    except (ValueError, RuntimeError):
        details = {}
    capability = details.get("compute_capability")
    return {
        "device_name": details.get("device_name"),
        "compute_capability": ".".join(str(part) for part in capability) if capability else None,
    }


def measure_of(device: str, baseline_device_bytes: int | None) -> str:
    """What a trial's peak is read from, so that it counts what the budget counts.

    CPU: the worker's resident peak (the budget is RAM). GPU: the worker's footprint on the device
    through NVML (CUDA context, cuDNN/cuBLAS workspaces and the allocator's reservation), because
    the default budget is NVML's free memory, and the allocator's peak alone leaves the context
    and workspaces out. Without NVML (Jetson, ROCm: only with an explicit budget) the allocator's
    peak, the one figure left, and the profile's `measure` says so.
    """
    if _gpu_ordinal(device) is None:
        return "process_peak"
    return "device_used" if baseline_device_bytes is not None else "allocator_peak"


# Reply fields that hold each measure, in trial replies and in the "ready" reply before any trial.
MEASURE_FIELDS = {"process_peak": "process_peak_bytes", "allocator_peak": "allocator_peak_bytes", "device_used": "device_used_bytes"}
BASELINE_FIELDS = {
    "process_peak": "baseline_process_bytes",
    "allocator_peak": "baseline_allocator_bytes",
    "device_used": "baseline_device_bytes",
}


def _base_model_facts(base_model, optimize: str) -> dict:
    """For a TFMOT-wrapped model: the name and architecture hash of the model before wrapping.

    The model key records the optimisation itself; the wrapped model's config carries TFMOT's
    quantize configs and schedules, whose text is TFMOT's business, not the architecture's.
    """
    if optimize == "none":
        return {"optimize": "none"}
    from edgebatch.probing.trial import architecture_description
    from edgebatch.profiles.fingerprint import config_hash

    return {"optimize": optimize, "name": base_model.name, "config_hash": config_hash(architecture_description(base_model))}


def worker_main() -> int:
    """The worker: set up, build the model, answer trials until its input closes; the exit code.

    0 once its input closes, 2 for a usage error (a missing GPU, say), 1 for any other failure to
    build the model or run a step, each said to the parent first as one `fatal` line.
    """
    _die_with_parent()
    setup = _read_setup()
    _volunteer_for_the_oom_killer()
    ordinal = _gpu_ordinal(setup.device)
    meter = _start_meter(ordinal)
    try:
        runner, identity = _build_and_identify(setup, ordinal)
        baseline_device = _trace_and_ready(setup, runner, identity, meter)
    except UsageError as error:
        _send({"fatal": str(error), "usage": True})
        return 2
    except Exception as error:  # noqa: BLE001 - reported to the parent as one line
        _send({"fatal": f"could not build the model for {setup.model_spec!r}: {type(error).__name__}: {error}"})
        return 1
    return _run_trials(setup, runner, meter, baseline_device)


def _read_setup() -> WorkerSetup:
    """The setup, the first line the parent writes."""
    # Imported here, not at the top: worker.py imports this module.
    from edgebatch.probing.worker import WorkerSetup

    return WorkerSetup(**json.loads(sys.stdin.readline()))


def _start_meter(ordinal: int | None):
    """The GPU's NVML meter for this process (sensors.GpuProcessMeter); None on a CPU."""
    if ordinal is None:
        return None
    from edgebatch.sensors import GpuProcessMeter

    # Before TensorFlow touches the GPU: the fallback measure is the device's use over this.
    return GpuProcessMeter.start(ordinal, os.getpid(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def _build_and_identify(setup: WorkerSetup, ordinal: int | None) -> tuple:
    """Build the model and its TrialRunner, and send the `identity` message; (runner, identity)."""
    import tensorflow as tf

    # Before anything runs: TensorFlow fixes its thread pools when its context starts.
    tf.config.threading.set_inter_op_parallelism_threads(setup.inter_op_threads)
    from edgebatch.probing.trial import TrialRunner
    from edgebatch.sensors import enable_memory_growth
    from edgebatch.models.zoo import (
        build_base_model,
        optimize_model,
        parse_model_spec,
        training_callbacks,
    )

    gpu_details = {}
    if ordinal is not None:
        enable_memory_growth()
        gpu_details = _gpu_details(tf, ordinal)
    with tf.device(setup.device):
        base_model = build_base_model(parse_model_spec(setup.model_spec), setup.precision, setup.optimize)
        model = optimize_model(base_model, setup.optimize)
    runner = TrialRunner(model, optimizer=setup.optimizer, device=setup.device,
                         callbacks=training_callbacks(model, setup.optimize), sequence_length=setup.sequence_length)
    identity = {
        "tensorflow": tf.__version__,
        "gpu": gpu_details or None,
        **runner.model_facts(),
        **_base_model_facts(base_model, setup.optimize),
    }
    # What the model is, before the trace: enough for the probe to find a cached profile and
    # stop this worker without waiting for the trace (await_identity).
    _send({"identity": True, **identity})
    return runner, identity


def _trace_and_ready(setup: WorkerSetup, runner, identity: dict, meter) -> int | None:
    """Trace the step, run any prewarm, set any cap, and send the `ready` message; the device's
    baseline footprint (None without a meter, or where NVML reads none)."""
    import tensorflow as tf

    # Trace now, at batch 1, so that no trial pays for tracing (the signature has batch None).
    runner.run_steps(1, 1)
    prewarm_seconds = []
    if setup.prewarm_batch:
        prewarm_seconds = runner.run_steps(setup.prewarm_batch, setup.prewarm_steps)
    # The cap comes after the prewarm: capped first, the prewarm's small steps left address
    # space that later big batches could not use (docs/probe-rules.md, "worker_main: the cap
    # after the prewarm").
    if setup.address_space_headroom_bytes:
        _cap_address_space(setup.address_space_headroom_bytes)
    from edgebatch.sensors import process_rss_bytes, read_allocator

    allocator = read_allocator(setup.device)
    baseline_device = meter.footprint_bytes() if meter else None
    _send(
        {
            "ready": True,
            **identity,
            # What TensorFlow took (the probe checks it against what it asked for).
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "measure": measure_of(setup.device, baseline_device),
            # Memory before any trial batch: what one-shot estimators (tools/bench) start from.
            "baseline_process_bytes": process_rss_bytes(),
            "baseline_allocator_bytes": allocator.current_bytes if allocator else None,
            "baseline_device_bytes": baseline_device,
            # For the next trial's reply deadline: small-batch steps, so an overestimate.
            "prewarm_step_seconds": statistics.median(prewarm_seconds) if prewarm_seconds else None,
        }
    )
    return baseline_device


def _run_trials(setup: WorkerSetup, runner, meter, baseline_device: int | None) -> int:
    """Answer one trial per input line until the input closes (0); 1 after a fatal error."""
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = runner.run_trial(request["batch"], setup.steps_per_trial, setup.trial_seconds)
        except Exception as error:  # noqa: BLE001 - a non-memory failure stops the probe
            _send({"fatal": f"training step failed at batch {request['batch']}: {type(error).__name__}: {error}"})
            return 1
        result["trace_count"] = runner.trace_count
        if baseline_device is not None and result.get("ok"):
            # The allocator never hands memory back to the driver (memory growth), so the
            # footprint after the trial is the most the worker held during it.
            result["device_used_bytes"] = meter.footprint_bytes()
            if result["device_used_bytes"] is None:
                _send({"fatal": f"NVML stopped reporting {setup.device}'s memory at batch {request['batch']} (it did at the start): probe again"})
                return 1
        _send(result)
    return 0


def run_and_exit() -> NoReturn:
    """Run worker_main and end the process with its code, without Python's interpreter shutdown.

    How every worker ends, a new process (`python -m edgebatch.probing.worker`) and a fork-server
    child alike. A SystemExit (from a user's model code, say) keeps its code and message, as Python's
    own exit gives them; any other error prints its traceback and ends the worker with 1. Nothing
    escapes: a fork-server child must never return into the server's loop.

    The output is flushed and the process ends with os._exit. Everything a worker has to say is sent
    by then, and nothing it holds needs an orderly end: the kernel frees its memory and descriptors
    either way. The shutdown was costly: a median 1.27-1.68 s through `sys.exit` (TensorFlow's
    teardown) against 0.11-0.16 s this way, paid once per new process on the probe's critical path
    (docs/probe-evidence.md, "What a probe costs, and why").
    """
    code = 1
    try:
        code = worker_main()
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - an unexpected error still prints its traceback
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
