"""What this machine has to train on: CPU, RAM and its cgroup limit, GPUs (NVML and TensorFlow).

`describe_devices` gathers it as plain JSON-able values (for `edgebatch devices --json` and for
profile fingerprints); `format_devices_text` turns that into the table people read.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from edgebatch.sensors.host import read_cgroup_memory, read_psi
from edgebatch.sensors.nvml import list_gpus, nvml_driver_version, nvml_is_available, visible_nvml_indices
from edgebatch.units import format_bytes

__all__ = ["cpu_model_name", "describe_devices", "format_devices_text", "parse_cpu_model"]

# x86 says "model name"; arm64 kernels give "Model"/"Hardware" (when at all), older ARM "Processor",
# MIPS "cpu model".
_CPU_MODEL_KEYS = ("model name", "Model", "Hardware", "Processor", "cpu model")


def parse_cpu_model(cpuinfo_text: str) -> str | None:
    """The CPU model from `/proc/cpuinfo` text, or None when it names none."""
    fields: dict[str, str] = {}
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if sep and value and key not in fields:
            fields[key] = value
    for key in _CPU_MODEL_KEYS:
        if key in fields:
            return fields[key]
    return None


def cpu_model_name(proc_root: str | Path = "/proc") -> str:
    """The CPU's model name from cpuinfo ("model name"); else platform.processor() or platform.machine(); else 'unknown'."""
    try:
        model = parse_cpu_model((Path(proc_root) / "cpuinfo").read_text())
    except OSError:
        model = None
    return model or platform.processor() or platform.machine() or "unknown"


def describe_devices(include_tensorflow: bool = True) -> dict[str, Any]:
    """Everything edgebatch knows about this machine's devices, as JSON-able values.

    include_tensorflow=False never imports TensorFlow (fast, safe before GPU set-up); True also
    lists TensorFlow's GPUs, which does not initialise them (memory growth can still be set).
    """
    gpus = list_gpus()
    tensorflow, tf_gpu_details = _describe_tensorflow() if include_tensorflow else (None, [])
    gpu_dicts: list[dict[str, Any]] = [{**dataclasses.asdict(gpu), "tf_device": None} for gpu in gpus]
    _attach_tf_devices(gpu_dicts, gpus, tf_gpu_details)
    return {
        "cpu": _describe_cpu(),
        "gpus": gpu_dicts,
        "tensorflow": tensorflow,
        "nvml": {"available": nvml_is_available(), "driver_version": nvml_driver_version()},
    }


def format_devices_text(info: dict[str, Any]) -> str:
    """A table for people from `describe_devices()` output (missing keys print as '-')."""
    cpu = info.get("cpu") or {}
    lines = [
        f"CPU         {cpu.get('model', '-')} "
        f"({cpu.get('cores_logical', '-')} logical, {cpu.get('cores_physical') or '-'} physical cores)",
        f"RAM         {format_bytes(cpu.get('ram_total_bytes'))} total, "
        f"{format_bytes(cpu.get('ram_available_bytes'))} available",
        f"cgroup      {_cgroup_text(cpu.get('cgroup'))}",
        f"PSI memory  {_psi_text(cpu.get('psi'))}",
    ]
    nvml = info.get("nvml") or {}
    lines.append(
        "NVML        "
        + (f"available, driver {nvml.get('driver_version') or '-'}" if nvml.get("available") else "unavailable")
    )
    gpus = info.get("gpus") or []
    if not gpus:
        lines.append("GPUs        none")
    else:
        lines.append("GPUs")
        rows = [("NVML", "TF", "NAME", "TOTAL", "FREE", "CC", "UUID")]
        for gpu in gpus:
            rows.append(
                (
                    _dash(gpu.get("index")),
                    _dash(gpu.get("tf_device")),
                    _dash(gpu.get("name")),
                    format_bytes(gpu.get("total_bytes")),
                    format_bytes(gpu.get("free_bytes")),
                    _dash(gpu.get("compute_capability")),
                    _dash(gpu.get("uuid")),
                )
            )
        widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
        for row in rows:
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    tensorflow = info.get("tensorflow")
    if tensorflow is None:
        lines.append("TensorFlow  not inspected")
    else:
        gpu_devices = ", ".join(tensorflow.get("gpu_devices") or []) or "none"
        lines.append(
            f"TensorFlow  {tensorflow.get('version', '-')} (Keras {tensorflow.get('keras_version') or '-'}), "
            f"built with CUDA: {'yes' if tensorflow.get('built_with_cuda') else 'no'}, GPU devices: {gpu_devices}"
        )
    return "\n".join(lines)


def _describe_cpu() -> dict[str, Any]:
    import psutil

    virtual = psutil.virtual_memory()
    cgroup = read_cgroup_memory()
    psi = read_psi()
    return {
        "model": cpu_model_name(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        "ram_total_bytes": int(virtual.total),
        "ram_available_bytes": int(virtual.available),
        "cgroup": None
        if cgroup is None
        else {
            "version": cgroup.version,
            "limit_bytes": cgroup.limit_bytes,
            "usage_bytes": cgroup.usage_bytes,
            "working_set_bytes": cgroup.working_set_bytes,
        },
        "psi": None if psi is None else dataclasses.asdict(psi),
    }


def _describe_tensorflow() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """TensorFlow's summary, and get_device_details() of each of its GPUs in GPU:i order."""
    try:
        import tensorflow as tf
    except ImportError:
        return None, []
    # Listing physical devices and their details does not initialise the GPUs.
    physical = tf.config.list_physical_devices("GPU")
    details = []
    for device in physical:
        try:
            details.append(tf.config.experimental.get_device_details(device))
        except (ValueError, RuntimeError):
            details.append({})
    summary = {
        "version": tf.__version__,
        "keras_version": _keras_version(),
        "gpu_devices": [device.name.rsplit("physical_device:", 1)[-1] for device in physical],
        "built_with_cuda": bool(tf.test.is_built_with_cuda()),
    }
    return summary, details


def _keras_version() -> str | None:
    """The version of the Keras that tf.keras resolves to, read without importing it (5 s).

    Import times: docs/tensorflow-memory.md#installing.
    """
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    try:
        return metadata.version("tf_keras" if legacy else "keras")
    except metadata.PackageNotFoundError:
        return None


def _attach_tf_devices(gpu_dicts: list[dict[str, Any]], gpus: list, details: list[dict[str, Any]]) -> None:
    """Name each NVML GPU with TensorFlow's GPU:i; add the TF GPUs NVML did not report."""
    nvml_indices = visible_nvml_indices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    by_nvml_index = {gpu_dict["index"]: gpu_dict for gpu_dict in gpu_dicts}
    for ordinal, detail in enumerate(details):
        tf_device = f"GPU:{ordinal}"
        if ordinal < len(nvml_indices) and nvml_indices[ordinal] in by_nvml_index:
            by_nvml_index[nvml_indices[ordinal]]["tf_device"] = tf_device
            continue
        capability = detail.get("compute_capability")
        gpu_dicts.append(
            {
                "index": None,
                "name": detail.get("device_name") or tf_device,
                "uuid": None,
                "total_bytes": None,
                "free_bytes": None,
                "driver_version": None,
                "compute_capability": None if not capability else ".".join(str(part) for part in capability),
                "tf_device": tf_device,
            }
        )


def _cgroup_text(cgroup: dict[str, Any] | None) -> str:
    if not cgroup:
        return "none"
    limit = cgroup.get("limit_bytes")
    return (
        f"v{cgroup.get('version', '?')}, limit {'unlimited' if limit is None else format_bytes(limit)}, "
        f"usage {format_bytes(cgroup.get('usage_bytes'))}"
    )


def _psi_text(psi: dict[str, Any] | None) -> str:
    if not psi:
        return "unavailable"
    text = f"some {psi.get('some_avg10', 0):.2f}% / {psi.get('some_avg60', 0):.2f}% (10 s / 60 s)"
    if psi.get("full_avg10") is not None:
        text += f", full {psi['full_avg10']:.2f}% / {psi.get('full_avg60') or 0:.2f}%"
    return text


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
