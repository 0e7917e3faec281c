"""NVIDIA GPUs through NVML: names, memory, driver. Device-wide numbers, all processes included.

pynvml is imported lazily, and every function takes `nvml=` (a module or any object with the
pynvml functions it calls) so tests pass a fake. No library, no driver or no GPU reads as
"unavailable" (False, [] or None), never as an exception: a CPU machine is a normal machine here.
NVML is initialised once per process and module; the outcome, failure included, is cached.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GpuInfo",
    "GpuMemory",
    "GpuProcessMeter",
    "list_gpus",
    "nvml_driver_version",
    "nvml_is_available",
    "process_gpu_footprint_bytes",
    "read_gpu_memory",
    "read_process_gpu_memory",
    "visible_nvml_indices",
]


@dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU as NVML counts it: all processes, not only this one."""

    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it. `index` is NVML's, which ignores CUDA_VISIBLE_DEVICES."""

    index: int
    name: str
    uuid: str | None
    total_bytes: int
    free_bytes: int
    driver_version: str | None
    compute_capability: str | None


_init_lock = threading.Lock()
# id(module) -> (module, initialised?). The module is kept so that its id cannot be reused.
_init_results: dict[int, tuple[Any, bool]] = {}


def nvml_is_available(nvml: Any = None) -> bool:
    """True when the NVML library loads and the driver answers (even with zero GPUs)."""
    return _initialised_nvml(nvml) is not None


def list_gpus(nvml: Any = None) -> list[GpuInfo]:
    """Every GPU NVML sees, in NVML order; [] when NVML is unavailable.

    A GPU that fails mid-query (lost, no permission) is left out with a warning naming it.
    """
    lib = _initialised_nvml(nvml)
    if lib is None:
        return []
    errors = _nvml_errors(lib)
    try:
        count = int(lib.nvmlDeviceGetCount())
    except errors as exc:
        _forget_if_uninitialised(lib, exc)
        return []
    driver_version = nvml_driver_version(lib)
    gpus = []
    for index in range(count):
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            memory = lib.nvmlDeviceGetMemoryInfo(handle)
            name = _text(lib.nvmlDeviceGetName(handle))
        except errors as exc:
            _forget_if_uninitialised(lib, exc)
            warnings.warn(f"edgebatch: skipping GPU {index}: NVML said {exc}", RuntimeWarning, stacklevel=2)
            continue
        gpus.append(
            GpuInfo(
                index=index,
                name=name,
                uuid=_optional(lib, lambda: _text(lib.nvmlDeviceGetUUID(handle))),
                total_bytes=int(memory.total),
                free_bytes=int(memory.free),
                driver_version=driver_version,
                compute_capability=_optional(lib, lambda: _capability(lib.nvmlDeviceGetCudaComputeCapability(handle))),
            )
        )
    return gpus


def read_gpu_memory(index: int, nvml: Any = None) -> GpuMemory | None:
    """Total/used/free bytes of NVML GPU `index` now; None when NVML is unavailable or has no such GPU."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"GPU index must be an int >= 0, got {index!r}")
    lib = _initialised_nvml(nvml)
    if lib is None:
        return None
    try:
        if index >= int(lib.nvmlDeviceGetCount()):
            return None
        memory = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(index))
    except _nvml_errors(lib) as exc:
        _forget_if_uninitialised(lib, exc)
        return None
    return GpuMemory(
        index=index, total_bytes=int(memory.total), used_bytes=int(memory.used), free_bytes=int(memory.free)
    )


def read_process_gpu_memory(index: int, pid: int, nvml: Any = None) -> int | None:
    """Bytes NVML says process `pid` holds on NVML GPU `index` (its CUDA context included).

    None when NVML cannot tell: unavailable, no such GPU, no per-process accounting (MIG, WSL,
    some drivers report it as not available), or `pid` not in NVML's list, as inside a container
    whose PID namespace differs from the host's (NVML lists host pids).
    """
    lib = _initialised_nvml(nvml)
    if lib is None:
        return None
    try:
        processes = lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(index))
    except _nvml_errors(lib) as exc:
        _forget_if_uninitialised(lib, exc)
        return None
    for process in processes:
        if int(getattr(process, "pid", -1)) == pid:
            used = getattr(process, "usedGpuMemory", None)
            return None if used is None else int(used)
    return None


def process_gpu_footprint_bytes(
    *, process_used_bytes: int | None, device_used_bytes: int | None, device_used_before_bytes: int | None
) -> int | None:
    """What a process holds on a GPU: NVML's figure for the process when there is one, else what
    the whole device holds over its reading from before the process touched the GPU (which also
    counts anything other processes took meanwhile, so it errs high). None when neither is known.
    """
    if process_used_bytes is not None:
        return process_used_bytes
    if device_used_bytes is None or device_used_before_bytes is None:
        return None
    return max(0, device_used_bytes - device_used_before_bytes)


@dataclass(frozen=True)
class GpuProcessMeter:
    """Reads one process's footprint on one GPU through NVML (see process_gpu_footprint_bytes).

    Start it before the process initialises the GPU: the device's used memory then is the
    reference the fallback subtracts.
    """

    nvml_index: int
    pid: int
    device_used_before_bytes: int
    nvml: Any = None

    @classmethod
    def start(
        cls, tf_ordinal: int, pid: int, *, cuda_visible_devices: str | None, nvml: Any = None
    ) -> GpuProcessMeter | None:
        """A meter for TensorFlow's GPU:tf_ordinal, or None when NVML does not see that GPU."""
        gpus = list_gpus(nvml)
        visible = visible_nvml_indices(gpus, cuda_visible_devices)
        if tf_ordinal >= len(visible):
            return None
        memory = read_gpu_memory(visible[tf_ordinal], nvml)
        if memory is None:
            return None
        return cls(nvml_index=visible[tf_ordinal], pid=pid, device_used_before_bytes=memory.used_bytes, nvml=nvml)

    def footprint_bytes(self) -> int | None:
        memory = read_gpu_memory(self.nvml_index, self.nvml)
        return process_gpu_footprint_bytes(
            process_used_bytes=read_process_gpu_memory(self.nvml_index, self.pid, self.nvml),
            device_used_bytes=None if memory is None else memory.used_bytes,
            device_used_before_bytes=self.device_used_before_bytes,
        )


def nvml_driver_version(nvml: Any = None) -> str | None:
    """The NVIDIA driver version ('550.54.15'), or None when NVML is unavailable."""
    lib = _initialised_nvml(nvml)
    if lib is None:
        return None
    return _optional(lib, lambda: _text(lib.nvmlSystemGetDriverVersion()))


def visible_nvml_indices(gpus: list[GpuInfo], cuda_visible_devices: str | None) -> list[int]:
    """NVML indices of the GPUs CUDA (and so TensorFlow's GPU:0, GPU:1, ...) sees, in that order.

    Follows CUDA's reading of CUDA_VISIBLE_DEVICES: None means all GPUs; entries are ordinals or
    (prefixes of) UUIDs; the list stops at the first entry that names no GPU, as CUDA's does. CUDA
    orders ordinals fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so on a host with mixed GPU
    models an ordinal may name a different GPU than NVML's index; UUIDs are unambiguous.
    """
    if cuda_visible_devices is None:
        return [gpu.index for gpu in gpus]
    indices: list[int] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        index = _match_visible_entry(gpus, entry)
        if index is None or index in indices:
            break
        indices.append(index)
    return indices


def _match_visible_entry(gpus: list[GpuInfo], entry: str) -> int | None:
    if entry.isdigit():
        ordinal = int(entry)
        return gpus[ordinal].index if ordinal < len(gpus) else None
    if not entry:
        return None
    wanted = entry if entry.startswith(("GPU-", "MIG-")) else f"GPU-{entry}"
    matches = [gpu.index for gpu in gpus if gpu.uuid and gpu.uuid.startswith(wanted)]
    return matches[0] if len(matches) == 1 else None


def _initialised_nvml(nvml: Any) -> Any | None:
    """The NVML module after a successful nvmlInit, or None when NVML cannot be used."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None
    with _init_lock:
        cached = _init_results.get(id(nvml))
        if cached is not None and cached[0] is nvml:
            return nvml if cached[1] else None
        try:
            nvml.nvmlInit()
            initialised = True
        except _nvml_errors(nvml):
            # NVMLError_LibraryNotFound on machines without a driver
            # (docs/tensorflow-memory.md#nvml-without-a-gpu), DriverNotLoaded,
            # LibRmVersionMismatch after a driver update without reboot, ...: all mean "no GPUs".
            initialised = False
        _init_results[id(nvml)] = (nvml, initialised)
        return nvml if initialised else None


def _forget_if_uninitialised(nvml: Any, exc: BaseException) -> None:
    """Someone shut NVML down under us (nvmlShutdown): initialise again on the next call."""
    uninitialised = getattr(nvml, "NVMLError_Uninitialized", None)
    if isinstance(uninitialised, type) and isinstance(exc, uninitialised):
        with _init_lock:
            _init_results.pop(id(nvml), None)


def _nvml_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    base = getattr(nvml, "NVMLError", None)
    # OSError: ctypes failing to load or call the shared library outside pynvml's own checks.
    return (base, OSError) if isinstance(base, type) and issubclass(base, BaseException) else (Exception,)


def _optional(nvml: Any, read) -> Any:
    """A field some GPUs or drivers do not support (NVMLError_NotSupported): None instead."""
    try:
        return read()
    except _nvml_errors(nvml) as exc:
        _forget_if_uninitialised(nvml, exc)
        return None


def _text(value: str | bytes) -> str:
    # pynvml before 11.5 returns bytes.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _capability(value: Any) -> str:
    major, minor = value
    return f"{int(major)}.{int(minor)}"


def _reset_nvml_cache() -> None:
    """Forget every cached nvmlInit outcome (tests only)."""
    with _init_lock:
        _init_results.clear()
