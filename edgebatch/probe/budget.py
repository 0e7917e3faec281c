"""Which device to probe, what it is, and how much memory a probe may plan for on it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from edgebatch.errors import ProbeError, UsageError


@dataclass(frozen=True)
class DeviceFacts:
    kind: str  # "CPU" | "GPU"
    index: int
    description: str
    cores: int | None
    memory_total_bytes: int | None
    driver_version: str | None = None
    compute_capability: str | None = None


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

        host = read_host_memory()
        return DeviceFacts("CPU", index, cpu_model_name(), os.cpu_count(), host.total_bytes)
    gpu = _visible_gpu(index, device)
    return DeviceFacts("GPU", index, gpu.name, None, gpu.total_bytes, gpu.driver_version, gpu.compute_capability)


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

    memory = read_gpu_memory(_visible_gpu(index, device).index)
    if memory is None:
        raise ProbeError(f"cannot read the memory of {device} through NVML: pass --memory-budget explicitly")
    return memory.free_bytes, "nvml_free"


def _visible_gpu(index: int, device: str):
    """NVML's record of TensorFlow's GPU:index (CUDA_VISIBLE_DEVICES renumbers GPUs)."""
    from edgebatch.sensors import list_gpus, visible_nvml_indices

    gpus = list_gpus()
    visible = visible_nvml_indices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if index >= len(visible):
        found = ", ".join(f"GPU:{i}" for i in range(len(visible))) or "none"
        raise UsageError(f"device {device!r} not found (GPUs visible: {found}); use --device CPU:0")
    return next(gpu for gpu in gpus if gpu.index == visible[index])
