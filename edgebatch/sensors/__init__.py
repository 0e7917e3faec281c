"""Memory sensors: host RAM, cgroup v1/v2 and PSI; NVML GPUs; TensorFlow's allocator; device summary.

Importing this package imports neither TensorFlow nor pynvml; each is imported inside the
functions that need it.
"""

from edgebatch.sensors.devices import cpu_model_name, describe_devices, format_devices_text
from edgebatch.sensors.gpu_setup import enable_memory_growth
from edgebatch.sensors.host import (
    CgroupMemory,
    HostMemory,
    Psi,
    parse_psi,
    process_peak_rss_bytes,
    process_rss_bytes,
    process_swap_bytes,
    process_virtual_bytes,
    read_cgroup_memory,
    read_host_memory,
    read_psi,
    reset_process_peak_rss,
)
from edgebatch.sensors.nvml import (
    GpuInfo,
    GpuMemory,
    GpuProcessMeter,
    list_gpus,
    nvml_driver_version,
    nvml_is_available,
    process_gpu_footprint_bytes,
    read_gpu_memory,
    read_process_gpu_memory,
    visible_nvml_indices,
)
from edgebatch.sensors.tf_allocator import AllocatorMemory, read_allocator, reset_allocator_peak

__all__ = [
    "AllocatorMemory",
    "CgroupMemory",
    "GpuInfo",
    "GpuMemory",
    "GpuProcessMeter",
    "HostMemory",
    "Psi",
    "cpu_model_name",
    "describe_devices",
    "enable_memory_growth",
    "format_devices_text",
    "list_gpus",
    "nvml_driver_version",
    "nvml_is_available",
    "parse_psi",
    "process_gpu_footprint_bytes",
    "process_peak_rss_bytes",
    "process_rss_bytes",
    "process_swap_bytes",
    "process_virtual_bytes",
    "read_allocator",
    "read_cgroup_memory",
    "read_gpu_memory",
    "read_process_gpu_memory",
    "read_host_memory",
    "read_psi",
    "reset_allocator_peak",
    "reset_process_peak_rss",
    "visible_nvml_indices",
]
