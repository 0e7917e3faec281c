"""Which device to probe, what it is, and how much memory a probe may plan for on it.

`Budget` is that figure worked out once per probe (or read back from a saved profile): the bytes
a profile records, where they came from, and the figure a trial's peak must stay under.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from edgebatch.errors import ProbeError, UsageError
from edgebatch.probing.margins import fit_budget_bytes
from edgebatch.units import format_bytes, parse_size_bytes


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    kind: str  # "CPU" | "GPU"
    index: int
    description: str
    cores: int | None
    # On CPU the installed RAM (sensors/installed.py), else what the kernel reports; on GPU NVML's total.
    memory_total_bytes: int | None
    # A limit under the total that applies to this process (a container's cgroup limit), else None.
    memory_limit_bytes: int | None = None
    driver_version: str | None = None
    compute_capability: str | None = None

    @property
    def fingerprint(self) -> str:
        """The device part of a profile's name: the same facts give the same key (profiles/fingerprint.py)."""
        from edgebatch.profiles import device_fingerprint

        return device_fingerprint(
            self.kind, self.description, self.cores, self.memory_total_bytes, self.driver_version,
            memory_limit_bytes=self.memory_limit_bytes,
        )


# The budget a shell or a cluster node sets for every probe it runs (`EDGEBATCH_MEMORY_BUDGET=6GiB ray start ...`);
# an explicit --memory-budget wins over it.
MEMORY_BUDGET_ENV = "EDGEBATCH_MEMORY_BUDGET"


def parse_device(device: str) -> tuple[str, int]:
    """'CPU:0' -> ('CPU', 0); 'gpu:1' -> ('GPU', 1)."""
    kind, _, index = device.strip().upper().partition(":")
    if kind not in ("CPU", "GPU") or not index.isdigit():
        raise UsageError(f"unknown device {device!r}: write CPU:0 or GPU:N")
    return kind, int(index)


def default_device() -> str:
    """GPU:0 when NVML sees a GPU, else CPU:0 (decided without importing TensorFlow)."""
    from edgebatch.sensors import list_gpus

    return "GPU:0" if list_gpus() else "CPU:0"


def device_facts(device: str) -> DeviceFacts:
    kind, index = parse_device(device)
    if kind == "CPU":
        from edgebatch.sensors import cpu_model_name, read_host_memory
        from edgebatch.sensors.installed import installed_memory_bytes

        host = read_host_memory()
        cgroup_limit = None if host.cgroup is None else host.cgroup.limit_bytes
        return DeviceFacts(
            kind="CPU",
            index=index,
            description=cpu_model_name(),
            cores=os.cpu_count(),
            memory_total_bytes=installed_memory_bytes() or host.total_bytes,
            memory_limit_bytes=cgroup_limit if cgroup_limit is not None and cgroup_limit < host.total_bytes else None,
        )
    gpu = _visible_gpu(index, device)
    if gpu is None:
        # No NVML (Jetson, ROCm): a probe with an explicit budget still runs; the worker names the
        # GPU from TensorFlow's device details (with_worker_gpu_details).
        return DeviceFacts(kind="GPU", index=index, description=f"GPU:{index} (no NVML)", cores=None, memory_total_bytes=None)
    return DeviceFacts(
        kind="GPU",
        index=index,
        description=gpu.name,
        cores=None,
        memory_total_bytes=gpu.total_bytes,
        driver_version=gpu.driver_version,
        compute_capability=gpu.compute_capability,
    )


# A budget written without a unit is bytes; one under 1 MiB cannot hold even TensorFlow's runtime,
# so it is nearly always a size in MiB or GiB that lost its unit (`--memory-budget 100`).
MIN_UNITLESS_BUDGET_BYTES = 1024**2


def explicit_budget_bytes(memory_budget: str | int) -> int:
    """The bytes of an explicit budget; a unit-less one under 1 MiB is refused with a hint."""
    budget_bytes = parse_size_bytes(memory_budget)
    unitless = isinstance(memory_budget, int) or str(memory_budget).strip().isdigit()
    if unitless and budget_bytes < MIN_UNITLESS_BUDGET_BYTES:
        raise UsageError(
            f"memory budget {memory_budget!r} is {budget_bytes} bytes, too small to train anything: "
            f"write a unit, e.g. {str(memory_budget).strip()}MiB or {str(memory_budget).strip()}GiB"
        )
    return budget_bytes


def overcommit_problem(device: str, budget_bytes: int, room_bytes: int | None) -> str | None:
    """Why a budget above what the device can give now is refused, or None (also when the room is unknown)."""
    if room_bytes is None or budget_bytes <= room_bytes:
        return None
    return (
        f"memory budget {format_bytes(budget_bytes)} is more than {device} can give now "
        f"({format_bytes(room_bytes)}): lower --memory-budget, or pass --allow-overcommit to probe anyway "
        "(trials may then swap, which is counted as a failure, or be killed by the kernel)"
    )


def device_room_bytes(device: str) -> int | None:
    """What the device can give a training process now: the default budget, or None where it cannot be read."""
    try:
        return default_budget(device)[0]
    except ProbeError:
        return None


def resolve_budget(device: str, memory_budget: str | int | None, allow_overcommit: bool) -> tuple[int, str]:
    """The probe's budget in bytes and its source ("cli" or the default's), checked against the device."""
    if memory_budget is None:
        return default_budget(device)
    budget_bytes = explicit_budget_bytes(memory_budget)
    if not allow_overcommit:
        problem = overcommit_problem(device, budget_bytes, device_room_bytes(device))
        if problem:
            raise UsageError(problem)
    return budget_bytes, "cli"


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A probe's memory budget. `bytes` is what the profile records and the search reports; a trial
    fits when its peak is at most `fit_bytes`, the budget less the measurement margin of the
    workers' inter-op threads (margins.fit_budget_bytes), worked out here once for every reader."""

    bytes: int
    source: str  # "cli", or the default's: "available_ram", "cgroup_limit", "nvml_free"
    fit_bytes: int

    @classmethod
    def with_margin(cls, budget_bytes: int, source: str, inter_op_threads: int) -> Budget:
        """The budget of workers run with `inter_op_threads` (the margin depends on them)."""
        return cls(bytes=budget_bytes, source=source, fit_bytes=fit_budget_bytes(budget_bytes, inter_op_threads))

    @classmethod
    def of_profile(cls, profile) -> Budget:
        """The budget a saved profile was probed (or answered) under, with the margin of the inter-op
        threads it records (a profile from before they were recorded: TensorFlow's pool)."""
        from edgebatch.settings.threads import recorded_inter_op_threads

        return cls.with_margin(profile.budget_bytes, profile.budget_source, recorded_inter_op_threads(profile.search))


def probe_budget(device: str, memory_budget: str | int | None, allow_overcommit: bool,
                 inter_op_threads: int) -> Budget:
    """resolve_budget's figure and source as a Budget for workers run with `inter_op_threads`."""
    budget_bytes, source = resolve_budget(device, memory_budget, allow_overcommit)
    return Budget.with_margin(budget_bytes, source, inter_op_threads)


def judged_bytes(profile) -> int:
    """What a saved profile's readings were judged against: its fit budget, lowered by the widest
    spread its repeated fresh readings showed (summary.judged_budget_bytes), as the search judged them."""
    from edgebatch.probing.summary import judged_budget_bytes

    return judged_budget_bytes(profile.trials, Budget.of_profile(profile).fit_bytes)


def default_budget(device: str) -> tuple[int, str]:
    """The memory a probe may plan for, and where that figure came from.

    CPU: what the training process may keep resident: the smaller of the RAM available at start and
    the room left under the container's cgroup limit. GPU: the memory TensorFlow can get on that
    GPU, which is NVML's free memory (total minus what every process holds).
    """
    kind, index = parse_device(device)
    if kind == "CPU":
        from edgebatch.sensors import read_host_memory

        host = read_host_memory()
        limited = host.cgroup is not None and host.cgroup.limit_bytes is not None
        room = host.available_to_process_bytes
        source = "cgroup_limit" if limited and room < host.available_bytes else "available_ram"
        return room, source
    from edgebatch.sensors import read_gpu_memory

    gpu = _visible_gpu(index, device)
    if gpu is None:
        raise ProbeError(
            f"NVML sees no GPU, so the free memory of {device} is unknown: on a GPU without NVML "
            "(Jetson, ROCm) pass --memory-budget; on a machine without a GPU use --device CPU:0"
        )
    memory = read_gpu_memory(gpu.index)
    if memory is None:
        raise ProbeError(f"cannot read the memory of {device} through NVML: pass --memory-budget explicitly")
    return memory.free_bytes, "nvml_free"


def _visible_gpu(index: int, device: str):
    """NVML's record of TensorFlow's GPU:index (CUDA_VISIBLE_DEVICES renumbers GPUs); None without NVML GPUs."""
    from edgebatch.sensors import list_gpus, visible_nvml_indices

    gpus = list_gpus()
    if not gpus:
        return None
    visible = visible_nvml_indices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if index >= len(visible):
        found = ", ".join(f"GPU:{i}" for i in range(len(visible))) or "none"
        raise UsageError(f"device {device!r} not found (GPUs visible: {found}); use --device CPU:0")
    return next(gpu for gpu in gpus if gpu.index == visible[index])


def with_worker_gpu_details(facts: DeviceFacts, gpu_details: dict | None) -> DeviceFacts:
    """Facts of a GPU that NVML does not see, completed from TensorFlow's details read in the worker."""
    if facts.kind != "GPU" or facts.memory_total_bytes is not None or not gpu_details:
        return facts  # NVML's facts (memory_total_bytes set) are kept as they are
    return dataclasses.replace(
        facts,
        description=gpu_details.get("device_name") or facts.description,
        compute_capability=gpu_details.get("compute_capability"),
    )
