"""`edgebatch.fleet.fleet_probe(...)`: one probe task per alive node of a Ray cluster, profiles collected.

The driver (this process) connects to the cluster, lists its alive nodes (nodes.py), and starts
one task pinned to each node (Ray's NodeAffinitySchedulingStrategy, not soft: a task never runs
anywhere else). Each task probes its node's GPUs, or its CPU (remote.py), and streams progress
lines back through a Ray queue. The driver prints them as they come, and writes each profile it
gets back under `<profiles>/nodes/<node-label>/`. A node whose task fails, dies or runs past
`node_timeout_seconds` gets its error in the results; the other nodes carry on.

Ray is imported only here and only when a fleet probe runs (the `fleet` extra installs it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgebatch.errors import EdgebatchError, UsageError
from edgebatch.fleet.nodes import DeviceResult, NodeTarget, node_done_line, targets_from_ray_nodes
from edgebatch.fleet.remote import ShippedModel, ship_model

# How often the driver wakes to print progress and check deadlines.
POLL_SECONDS = 0.5
# A probe of MobileNetV2 on 2 CPU cores takes ~4 minutes; a slow node probing several GPUs, far more.
DEFAULT_NODE_TIMEOUT_SECONDS = 3600.0
NODES_SUBDIR = "nodes"
# How long the driver waits for a TCP answer from the cluster's address before saying nothing is there.
CONNECT_TIMEOUT_SECONDS = 10.0
# How long ray.init may take once the port answered (it starts no process when given an address;
# a local one-node Ray starts in ~10 s on 2 cores).
RAY_INIT_TIMEOUT_SECONDS = 60.0

Progress = Callable[[str], None]


class FleetError(EdgebatchError):
    """The fleet probe as a whole could not run (no cluster, no usable node); exit code 1."""


def node_directory(profiles_dir: str | Path, label: str):
    """Where one node's profiles go: `<profiles_dir>/nodes/<label>`, for a local path or an fsspec URL."""
    from edgebatch.profiles.location import as_location

    return as_location(profiles_dir) / NODES_SUBDIR / label


def fleet_probe(
    model_spec: str,
    *,
    address: str = "auto",
    profiles_dir: str | Path | None = None,
    options: dict | None = None,
    node_timeout_seconds: float = DEFAULT_NODE_TIMEOUT_SECONDS,
    cpus_per_task: float = 1.0,
    save: bool = True,
    progress: Progress | None = None,
) -> list[DeviceResult]:
    """Probe `model_spec` on every alive node of the Ray cluster at `address`; one result per (node, device).

    `address` is what `ray.init` takes: "auto" (the cluster this machine belongs to), "HOST:PORT",
    "ray://HOST:10001", or "local" to start a one-node Ray here. `options` are edgebatch.probe's
    keyword options except device and profiles_dir. Every node probes afresh (cached profiles are
    not consulted: the point is to measure each node now). Raises FleetError only when nothing can
    run at all; a node's failure is a result with ok=False.
    """
    if node_timeout_seconds <= 0:
        raise UsageError(f"--node-timeout must be positive, got {node_timeout_seconds!r}")
    if cpus_per_task < 0:
        raise UsageError(f"--cpus-per-task must be >= 0, got {cpus_per_task!r}")
    options = dict(options or {})
    if "device" in options:
        raise UsageError("a fleet probe chooses devices per node (each GPU, else the CPU): do not pass device")
    say = progress or (lambda line: None)
    from edgebatch.profiles import resolve_profiles_dir

    shipped = ship_model(model_spec)  # a wrong name fails here, not on every node

    collection = resolve_profiles_dir(profiles_dir)
    ray = connect(address)  # a no-op where the caller connected first (connect's own timeout)
    targets = targets_from_ray_nodes(ray.nodes())
    runnable = [target for target in targets if target.cpus > 0 or target.gpus > 0]
    for target in targets:
        if target not in runnable:
            say(f"[{target.label}] skipped: the node offers no CPU or GPU to tasks (started with --num-cpus=0?)")
    if not runnable:
        raise FleetError(
            f"the Ray cluster at {address} has no alive node that offers a CPU or GPU to tasks: "
            "start workers with `ray start --address=HEAD:6379`"
        )
    say(f"probing {model_spec} on {len(runnable)} node(s): " + ", ".join(t.label for t in runnable))
    results = _run_tasks(ray, runnable, TaskSpec(model_spec, shipped, options, cpus_per_task),
                         node_timeout_seconds, say)
    if save:
        results = [_save(result, collection, say) for result in results]
    return results


def connect(address: str, needs: str = "a fleet probe", timeout_seconds: float = RAY_INIT_TIMEOUT_SECONDS):
    """The `ray` module, connected to the cluster at `address` (fleet_probe's `address`); FleetError
    when Ray is missing, nothing answers there, or Ray has not connected within `timeout_seconds`
    (then Ray's abandoned connection is left running and its native log lines are muted: see
    `_mute_native_stderr`). `needs` names the caller in the error."""
    try:
        import ray
    except ImportError as error:
        raise FleetError(
            f"{needs} needs Ray, which is not installed: pip install 'edgebatch[fleet]'"
        ) from error
    if ray.is_initialized():
        return ray
    problem = address_problem(address)
    if problem is not None:
        raise FleetError(problem)
    error = _init_within(ray, None if address == "local" else address, timeout_seconds)
    if error is None:
        return ray
    if isinstance(error, TimeoutError):
        _mute_native_stderr()
    if isinstance(error, TimeoutError) and address == "local":
        raise FleetError(f"a one-node Ray did not start here within {timeout_seconds:g} s (--connect-timeout)")
    if isinstance(error, TimeoutError):
        raise FleetError(
            f"Ray did not connect to the cluster at {address!r} within {timeout_seconds:g} s (--connect-timeout): "
            f"the port answers, but Ray tried {_address_ray_tries(ray, address)} (this machine's address as Ray "
            "sees it) and no Ray head answered there; pass the address `ray start --head` printed, or start the "
            "head with --node-ip-address set to an address this machine reaches"
        )
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise FleetError(
        f"cannot connect to a Ray cluster at {address!r} ({first}): start one with `ray start --head`, "
        "pass its address with --address HOST:PORT, or use --address local for a one-node Ray here"
    ) from error


def _init_within(ray, init_address: str | None, timeout_seconds: float) -> Exception | None:
    """ray.init, given `timeout_seconds`: None once connected, else the error (TimeoutError if it
    had not returned). ray.init retries an address whose port answers but whose nodes Ray cannot
    reach for minutes, deaf to Ctrl-C; in a daemon thread it can be abandoned, and the wait here
    stops at Ctrl-C at once."""
    import logging
    import threading

    outcome: dict[str, Exception | None] = {}

    def init() -> None:
        try:
            ray.init(address=init_address, logging_level="WARNING", log_to_driver=False)
            outcome["error"] = None
        except Exception as error:  # Ray's own error types too: each becomes one line
            outcome["error"] = error

    quiet = _DropLine("SIGTERM handler is not set")  # Ray's note about a driver off the main thread
    logging.getLogger("ray").addFilter(quiet)
    logging.getLogger("ray._private.worker").addFilter(quiet)
    connecting = threading.Thread(target=init, name="edgebatch-ray-init", daemon=True)
    connecting.start()
    connecting.join(timeout_seconds)
    return outcome["error"] if "error" in outcome else TimeoutError()


def _mute_native_stderr() -> None:
    """Ray's abandoned ray.init keeps logging each failed try to fd 2 until the process ends: fd 2
    goes to /dev/null, and Python's sys.stderr (where the error line goes) to a copy of the old fd 2."""
    import sys

    sys.stderr.flush()
    kept = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = open(kept, "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115


class _DropLine:
    """A logging filter that drops records containing `text`."""

    def __init__(self, text: str):
        self.text = text

    def filter(self, record) -> bool:
        return self.text not in record.getMessage()


def _address_ray_tries(ray, address: str) -> str:
    """The address ray.init dials for `address`: a loopback host becomes this machine's node address."""
    port = address.rstrip("/").rpartition(":")[2]
    try:
        return f"{ray.util.get_node_ip_address()}:{port}"
    except Exception:  # the message still names the cluster's address
        return f"this machine's own address at port {port}"


def address_problem(address: str, timeout_seconds: float = CONNECT_TIMEOUT_SECONDS) -> str | None:
    """Why `address` (HOST:PORT or ray://HOST:PORT) cannot be a Ray cluster, or None if its port answers.

    An address of neither form is a UsageError.

    Checked before `ray.init`, which keeps retrying an address where nothing listens for many
    minutes (13 measured here for 127.0.0.1:1) instead of saying so. "auto" and "local" are
    Ray's to resolve and pass unchecked.
    """
    import socket

    if address in ("auto", "local"):
        return None
    host_port = address.split("://", 1)[1] if "://" in address else address
    host, _, port_text = host_port.rstrip("/").rpartition(":")
    if not host or not port_text.isdigit():
        raise UsageError(f"--address {address!r} is not HOST:PORT, ray://HOST:PORT, auto or local "
                         "(the head prints its address when `ray start --head` starts it)")
    try:
        with socket.create_connection((host.strip("[]"), int(port_text)), timeout=timeout_seconds):
            return None
    except OSError as error:
        return (f"nothing answers at {address} ({error.strerror or error}): is the Ray head running "
                "(`ray start --head`), and is this its address?")


@dataclass(frozen=True)
class TaskSpec:
    """What every node's task probes, and how much CPU it reserves."""

    model_spec: str
    shipped: ShippedModel | None
    options: dict
    cpus_per_task: float


def _run_tasks(ray, targets: list[NodeTarget], task: TaskSpec, node_timeout_seconds: float,
               say: Progress) -> list[DeviceResult]:
    from ray.util.queue import Empty, Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from edgebatch.fleet.remote import probe_devices

    # The queue is an actor: it takes no CPU (on one-CPU nodes it would keep a probe from starting),
    # and it lives on the driver's node, so that a probed node going away takes no progress line
    # of the other nodes with it.
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    lines = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": driver_node})

    def node_task(label, devices):
        def send(device, line):
            try:
                lines.put((label, device, line))
            except Exception:  # the driver's queue is gone; the probe's result still travels back
                pass

        return probe_devices(task.model_spec, devices, task.options, send, node_label=label, shipped=task.shipped)

    remote_task = ray.remote(node_task)
    pending = {}
    started = time.monotonic()
    for target in targets:
        ref = remote_task.options(
            num_cpus=min(task.cpus_per_task, target.cpus),
            num_gpus=target.gpus,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=target.node_id, soft=False),
        ).remote(target.label, target.devices)
        pending[ref] = target

    results: list[DeviceResult] = []
    streaming = True
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            streaming = streaming and _drain(lines, Empty, say)
            for ref in ready:
                target = pending.pop(ref)
                finished = _collect(ray, ref, target, started)
                say(node_done_line(target.label, finished))
                results.extend(finished)
            if time.monotonic() - started > node_timeout_seconds:
                for ref, target in list(pending.items()):
                    ray.cancel(ref, force=True)
                    message = f"no answer within --node-timeout {node_timeout_seconds:g} s; its task was cancelled"
                    results.extend(_node_failure(target, message, started))
                    say(f"[{target.label}] {message}")
                pending.clear()
        if streaming:
            _drain(lines, Empty, say)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return results


def _drain(lines, empty_error, say: Progress) -> bool:
    """Print the progress lines waiting in the queue; False once the queue is gone."""
    while True:
        try:
            label, device, line = lines.get_nowait()
        except empty_error:
            return True
        except Exception as error:  # the queue's node went away: results still come, progress does not
            say(f"progress lines from the nodes are lost ({type(error).__name__}); waiting for the results")
            return False
        say(f"[{label} {device}] {line}")


def _collect(ray, ref, target: NodeTarget, started: float) -> list[DeviceResult]:
    try:
        answers = ray.get(ref)
    except Exception as error:  # RayTaskError, NodeDiedError, WorkerCrashedError, TaskUnschedulableError, ...
        return _node_failure(target, _ray_error_line(error), started)
    results = []
    for answer in answers:
        if answer["ok"]:
            profile = answer["profile"]
            results.append(DeviceResult(
                label=target.label, device=answer["device"], ok=True, seconds=answer["seconds"],
                max_batch=profile["max_batch"], safe_batch=profile["safe_batch"], profile=profile,
            ))
        else:
            results.append(DeviceResult(
                label=target.label, device=answer["device"], ok=False, seconds=answer["seconds"],
                error=answer["error"],
            ))
    return results


def _node_failure(target: NodeTarget, message: str, started: float) -> list[DeviceResult]:
    elapsed = time.monotonic() - started
    return [DeviceResult(label=target.label, device=device, ok=False, error=message, seconds=elapsed)
            for device in target.devices]


def _ray_error_line(error: Exception) -> str:
    """One line for a task that did not return: the node died, the task crashed, or it raised."""
    cause = getattr(error, "cause", None)
    if cause is not None and not isinstance(cause, type):
        text = f"{type(cause).__name__}: {cause}"
        if isinstance(cause, ModuleNotFoundError) and "edgebatch" in str(cause):
            text += " (install edgebatch on every node, e.g. with the edgebatch images)"
    else:
        text = f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _save(result: DeviceResult, collection, say: Progress) -> DeviceResult:
    if not result.ok:
        return result
    from dataclasses import replace

    from edgebatch.profiles import DeviceProfile, save_profile

    try:
        path = save_profile(DeviceProfile.from_dict(result.profile), node_directory(collection, result.label))
    except EdgebatchError as error:
        say(f"[{result.label} {result.device}] could not save its profile: {error}")
        return replace(result, ok=False, error=f"profile not saved: {error}")
    return replace(result, profile_location=str(path))
